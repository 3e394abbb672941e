"""Which launch shape of fastgen's triton decode attention reads the KV cache fastest (issue 14's speed work).

Why: on the H200 (2026-12-05, docs/archive/notes.md) the split kernel (`rlstack.payload.fastgen.split_attention`, the
default decode attention on CUDA since) read the cache at ~2.2 TB/s alone, against ~3.1 for the grouped matmuls
it replaced: 3.31 ms over all 768 slots at 64 sequences, 2.19 over the 466 a 512-token generation fills on
average. At the matmuls' rate the step at 64 sequences would be ~0.8 ms shorter, which is most of the gap to
vLLM bf16. Which shape is faster is not something the CPU can say, so this times a grid of
`split_attention.Tuning` values (slots per iteration, warps, programs a call, pipeline stages) and nothing else.

Each row: the Qwen3-4B shape's attention for one decode step (36 layers, 32 query heads over 8 KV heads of 128,
bf16 cache of 768 slots, bool keep-mask), `split_attention.attend` itself (its kernel launch and its merge of
the splits, `split_attention.merge_splits` compiled by inductor as fastgen's step compiles it), every layer
reading its own cache, captured as one CUDA graph and replayed (`fastgen_profile.graph_ms`). Columns: `ms` a
step, `kernel_ms` the same without the merge (the split kernel alone), `read_TBps` (the filled slots' K and V
bytes over that time), `of_copy` (that over the measured device copy bandwidth), and `max_err` of layer 0
against a float32 reference (softmax(q k^T) v over the filled slots): a fast shape that computes something else
is marked `ok` false and never counts as the winner. One row
a batch is the grouped matmuls (decode_attention="matmul", compiled as fastgen's step compiles them,
`fastgen_profile.time_attention`), which read every slot whatever the fill: the baseline of the "auto" choice.

    python3 bench/attention_sweep.py                      on a CUDA machine with torch and triton (no other
                                                          package: the device tool's H200 as it comes)
        [--batches 8,64] [--fills 466] [--block-n 32,64,128] [--warps 2,4,8] [--programs 128,512,2048]
        [--stages default,2]                              the grid: every combination, default first (a
                                                          launch two tunings share is timed once)
        [--fuse-top 3]                                    then the grid's 3 fastest and the default again with
                                                          fuse_merge (the kernel merges its own splits)
    RLSTACK_BENCH_SMOKE=1 python bench/attention_sweep.py  the CPU, Triton's interpreter, tiny shapes: the
                                                          script's logic only (results to /tmp)
Results: bench/results/attention_sweep.json; the best tuning per (batch, fill) is in the JSON's `best`.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

import common

if common.SMOKE:  # before triton is imported: the kernel then runs in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fastgen_profile  # graph_ms: the one way the benches time a captured step

COLUMNS = ["batch", "fill", "tuning", "splits", "ms", "kernel_ms", "read_TBps", "of_copy", "vs_default", "max_err",
           "ok", "error"]
NOTES = ("`python3 bench/attention_sweep.py` (module docstring): fastgen's split decode attention "
         "(`split_attention.attend`, its merge compiled) for all layers of one decode step, one CUDA graph, per "
         "launch shape; kernel_ms: the split kernel alone (no merge); vs_default: ms over the default tuning's ms "
         "at the same batch and fill (< 1 is faster).")
TOLERANCE = 2e-2  # bf16 inputs, float32 scores: a right answer differs from the float32 reference by ~1e-3


def ints(text: str) -> list[int]:
    """A comma-separated list of counts ("8,64"), refused with the option's expected form where it is not one."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 8,64; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, e.g. 8,64; got {text!r}")
    return values


def stage_list(text: str) -> list[int | None]:
    """--stages: counts, or `default` for Triton's own choice (the engine's launch)."""
    out: list[int | None] = []
    for x in (x.strip() for x in text.split(",") if x.strip()):
        out.append(None if x == "default" else ints(x)[0])
    if not out:
        raise argparse.ArgumentTypeError(f"expected e.g. default,2,3; got {text!r}")
    return out


def reference(q: Any, k: Any, v: Any, fill: int) -> Any:
    """softmax(q k^T * scale) v in float32 over the first ``fill`` slots, each KV head serving its query heads:
    [B, H, D]."""
    import torch

    h, d = q.shape[1], q.shape[2]
    kv = k.shape[1]
    kk = k[:, :, :fill].float().repeat_interleave(h // kv, dim=1)
    vv = v[:, :, :fill].float().repeat_interleave(h // kv, dim=1)
    scores = torch.einsum("bhd,bhnd->bhn", q.float(), kk) / math.sqrt(d)
    return torch.einsum("bhn,bhnd->bhd", scores.softmax(-1), vv)


def attend_layers(sa: Any, tuning: Any, merge: Any, q: Any, k: Any, v: Any, mask: Any, slot: Any,
                  scale: float) -> None:
    """One decode step's attention: every layer (k[i], v[i]) through the split kernel with this tuning, its
    splits merged by ``merge``."""
    for i in range(k.shape[0]):
        sa.attend(q, k[i], v[i], mask, slot, scale, tuning=tuning, merge=merge)


def unmerged(o: Any, lse: Any, dtype: Any) -> Any:
    """A merge that does nothing (the partials as they are): timing with it times the split kernel alone."""
    return o


def fused_candidates(rows: list[dict[str, Any]], batch: int, fill: int, tunings: list[Any], top: int) -> list[Any]:
    """The ``top`` fastest right tunings of the grid at (batch, fill), and the default (the first), each with
    ``fuse_merge``: whether the kernel merging its own splits beats the separate merge there."""
    import dataclasses

    if top <= 0:
        return []
    by_label = {t.label(): t for t in tunings}
    timed = sorted((r for r in rows if r["batch"] == batch and r["fill"] == fill and r.get("ok") and r.get("ms")
                    and r["tuning"] in by_label), key=lambda r: r["ms"])
    picks = [by_label[r["tuning"]] for r in timed[:top]]
    out: list[Any] = []
    for t in [*picks, tunings[0]]:
        fused = dataclasses.replace(t, fuse_merge=True)
        if fused not in out:
            out.append(fused)
    return out


def sweep(a: argparse.Namespace) -> int:
    import torch

    from rlstack.payload.fastgen import split_attention as sa

    shape = common.TINY if common.SMOKE else common.QWEN3_4B
    layers, heads, kv, d = (shape["num_hidden_layers"], shape["num_attention_heads"], shape["num_key_value_heads"],
                            shape["head_dim"])
    length = 64 if common.SMOKE else a.length
    fills = [min(f, length) for f in a.fills]
    tunings = [sa.TUNING] + [t for t in (sa.Tuning(block_n=n, num_warps=w, programs=p, num_stages=s)
                                         for n, w, p, s in itertools.product(a.block_n, a.warps, a.programs, a.stages))
                             if t != sa.TUNING]
    ceilings = common.measure_ceilings()
    sa.kernel()
    # the merge compiled alone, as inductor fuses it inside fastgen's step (eager it is ~7 kernels a layer, which
    # would bury the kernels' differences at 8 sequences); one compile per (batch, splits) shape. The CPU smoke
    # run has no C++ toolchain for inductor: dynamo's eager backend there
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    merge = torch.compile(sa.merge_splits, dynamic=False, backend="eager" if common.SMOKE else "inductor")
    dev = common.DEVICE
    scale = 1.0 / math.sqrt(d)
    rows: list[dict[str, Any]] = []
    best: dict[str, dict[str, Any]] = {}
    for batch in a.batches:
        gen = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(batch, heads, 1, d, device=dev, dtype=torch.bfloat16, generator=gen)
        k = torch.randn(layers, batch, kv, length, d, device=dev, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(layers, batch, kv, length, d, device=dev, dtype=torch.bfloat16, generator=gen)
        mask = torch.ones(batch, length, device=dev, dtype=torch.bool)
        for fill in fills:
            slot = torch.tensor([fill - 1], device=dev)
            want = reference(q[:, :, 0], k[0], v[0], fill)
            read = layers * batch * kv * fill * d * 2 * k.element_size()  # K and V of the filled slots
            default_ms = None
            launches: dict[tuple[Any, ...], str] = {}  # a launch already timed at this batch -> its tuning

            def grid_then_fused(batch: int = batch, fill: int = fill) -> Iterator[Any]:
                """The grid, then its fastest few again (and the default) with the kernel merging its own splits:
                a generator, so the second part is chosen from the rows the first has timed."""
                yield from tunings
                yield from fused_candidates(rows, batch, fill, tunings, a.fuse_top)

            for t in grid_then_fused():
                # programs only decide the splits: two tunings with the same splits are the same launch (at 64
                # sequences 128 and 512 programs both give one split), timed once
                launch = (t.block_n, t.num_warps, t.num_stages, t.fuse_merge,
                          sa.splits_for(batch, kv, length, t))
                if launch in launches and t != sa.TUNING:
                    print(f"{t.label()} at batch {batch}: the launch of {launches[launch]}, not timed again")
                    continue
                launches.setdefault(launch, t.label())
                row: dict[str, Any] = {"batch": batch, "fill": fill, "length": length, "tuning": t.label(),
                                       "spec": t.spec(), "splits": sa.splits_for(batch, kv, length, t)}
                try:
                    got = sa.attend(q, k[0], v[0], mask, slot, scale, tuning=t, merge=merge)[:, :, 0].float()
                    row["max_err"] = float((got - want).abs().max())
                    row["ok"] = row["max_err"] <= TOLERANCE
                    step = functools.partial(attend_layers, sa, t, merge, q, k, v, mask, slot, scale)
                    row["ms"] = round(fastgen_profile.graph_ms(step, reps=a.reps), 4)
                    alone = functools.partial(attend_layers, sa, t, unmerged, q, k, v, mask, slot, scale)
                    row["kernel_ms"] = round(fastgen_profile.graph_ms(alone, reps=a.reps), 4)
                    row["read_TBps"] = round(read / (row["ms"] / 1e3) / 1e12, 3)
                    row["of_copy"] = round(read / (row["ms"] / 1e3) / ceilings["copy_bandwidth_Bps"], 3)
                except Exception as exc:  # one shape that does not compile (registers, shared memory) is a row
                    row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
                if t == sa.TUNING:
                    default_ms = row.get("ms")
                if default_ms and row.get("ms"):
                    row["vs_default"] = round(row["ms"] / default_ms, 3)
                rows.append(row)
                print(row, flush=True)
                key = f"batch={batch},fill={fill}"
                if row.get("ok") and row.get("ms") and (key not in best or row["ms"] < best[key]["ms"]):
                    best[key] = {"tuning": t.label(), "spec": t.spec(), "ms": row["ms"],
                                 "vs_default": row.get("vs_default")}
        del k, v
        if dev == "cuda":
            torch.cuda.empty_cache()
        # the grouped matmuls (decode_attention="matmul", compiled as the step compiles them) over the same cache:
        # they read every slot whatever the fill, so one row a batch, the baseline the "auto" choice stands on
        cfg = argparse.Namespace(num_attention_heads=heads, num_key_value_heads=kv, head_dim=d,
                                 num_hidden_layers=layers)
        base = {"batch": batch, "fill": length, "length": length, "tuning": "matmul (every slot)"}
        try:
            base["ms"] = round(fastgen_profile.time_attention(cfg, batch, length, "matmul"), 4)
        except Exception as exc:  # the baseline is context; the sweep's rows stand without it
            base["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(base)
        print(base, flush=True)
    data = {**common.header(), "ceilings": ceilings, "shape": {"layers": layers, "heads": heads, "kv_heads": kv,
                                                               "head_dim": d, "length": length},
            "best": best, "default": sa.TUNING.label()}
    common.write_results("attention_sweep", data, rows, COLUMNS, NOTES, question="engine-profile",
                         title="fastgen's split-KV decode attention over launch shapes", engine="fastgen")
    for key, b in best.items():
        print(f"best at {key}: {b['tuning']} {b['ms']} ms ({b['vs_default']}x the default); in the step: "
              f"--variant attention_tuning={b['spec']}")
    return 0 if best else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--batches", type=ints, default=[2] if common.SMOKE else [8, 64], help="sequences, e.g. 8,64")
    ap.add_argument("--fills", type=ints, default=[40] if common.SMOKE else [466],
                    help="filled cache slots (the step's slot + 1): 466 is a 512-token generation's mean after a "
                         "210-token prompt, 768 the whole cache")
    ap.add_argument("--length", type=int, default=768, help="cache slots (the static cache's length)")
    # block_n 128 compiles for sm_90 without spills (128 registers, 139 KB of shared memory at Triton's 3 stages,
    # 74 KB at 2: ahead of time on the host, 2026-12-05); programs 128 gives 8 sequences 2 longer splits; 2 warps
    # (138-148 registers a thread at block_n 32-64, no spill) let ~6 programs share an SM where 8 warps let 2
    ap.add_argument("--block-n", type=ints, default=[32, 64, 128], help="cache slots per inner iteration")
    ap.add_argument("--warps", type=ints, default=[2, 4, 8])
    ap.add_argument("--programs", type=ints, default=[128, 512, 2048],
                    help="programs a call asks for (splits follow; tunings with the same splits are timed once)")
    ap.add_argument("--stages", type=stage_list, default=[None, 2],
                    help="pipeline stages; default: Triton's (3 on sm_90)")
    ap.add_argument("--fuse-top", type=int, default=3, metavar="N",
                    help="after the grid, time its N fastest shapes and the default again with fuse_merge (the "
                         "kernel merging its own splits); 0: not")
    ap.add_argument("--reps", type=int, default=20, help="timed graph replays per row")
    a = ap.parse_args(argv)
    if not common.SMOKE and not _cuda():
        print("attention_sweep needs a CUDA GPU (the device tool's H200); RLSTACK_BENCH_SMOKE=1 runs its logic on "
              "the CPU", file=sys.stderr)
        return 2
    return sweep(a)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
