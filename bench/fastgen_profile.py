"""Where one fastgen decode step spends its time (issue 14's speed work: "measure which matters with a profile
first, write the prediction down, then the outcome").

fastgen reached 1,515 tok/s at 8 sequences on the H200 (5.28 ms per step), 38 % of the 4,013 tok/s bandwidth
floor. docs/archive/notes.md lists four suspects without a measurement (kernel count, skinny GEMMs at 8 rows, sampling
outside the graph, padded cache reads). This bench splits the step into parts that can each be timed alone, on
the same model fastgen decodes (Qwen3-4B shape, random bf16 weights, LoRA r=32 merged into the shadow, the
recipe's 512 new tokens; 8 sequences are one 150-token prompt x 8 generations as in the recipe's step, 64 are
8 prompts of 150-210 tokens, left-padded to 210):

  wall        generate() per new token: the whole decode loop as GRPO's rollout sees it
  replay      one replay of fastgen's captured CUDA graph of the decode step alone: its GPU work, nothing else
  loop        wall - the replayed graph: what runs between replays (with the pick outside the graph, sampling:
              `sampling`, timed apart as the eager calls it is; `pick_parts`: its top-k threshold, the other
              warpers, and the draw, each replayed as a graph). With attend_bucket the loop
              replays a graph per read length: each is timed (`replay_by_read`), their mean over the
              generation's steps is `replay_mean_ms`, and loop = wall - that mean
  gemm        every projection of the model at M = batch rows (x @ W.T, bf16, cuBLAS), each kind replayed as one
              CUDA graph of its launches in a step (a distinct weight per layer), summed as the engine runs
              them (q/k/v and gate/up as one GEMM each where it fused them); each shape's bytes/s against the
              measured copy bandwidth: what skinny GEMMs cost
  attention   fastgen's decode attention, compiled, all layers as one graph, over the static cache at its
              bucketed length and at the average filled length (what padded cache reads cost), and at the
              lengths --attention-lengths names (`attention_by_length`)
  rest        replay - gemm - attention: norms, rotary, residual adds, inductor's fused kernels, gaps
  gemm_forms  each shape in other forms (the weight on the left, with and without the copy back; cuBLASLt):
              whether another call beats cuBLAS's pick at M = batch (time_gemms)
  fusion_saving  q+k+v and gate+up GEMM time minus the same weights as one GEMM each (vLLM's layout): what
              fusing them in the shadow saves per step (fuse_projections, fastgen's default since 2026-12-04)
  kernels     kernels per replay (torch.profiler over replays; None where the profiler sees none), and the
              ten that take the most time per replay (`top_kernels`: name, count, us)

The parts are timed alone, so they do not add up exactly (a part replayed alone keeps more in L2 than the step
does); the split says which part to work on, not to the microsecond. The parts are graph replays since the
second run: the first (2026-12-04, bench/results/archive/sm90/fastgen_profile-percall-20261204.json) timed each eager
call alone and measured launches (`graph_ms`). Nothing here changes fastgen: it reads
the engine's captured graph after a normal generate() call.

    bash bench/transport/native_probe.sh py portable bench/fastgen_profile.py [--batches 8,64]
        [--variant fuse_projections=true --variant '']   an A/B in one process, rows tagged by variant
    RLSTACK_BENCH_SMOKE=1 python bench/fastgen_profile.py       # CPU, tiny model: no graph, parts that apply
    python bench/fastgen_profile.py --rederive RUN.json [--name N]  # a stored run's sums, this accounting
Results: bench/results/fastgen_profile.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import rollout_generation as rg
from rlstack.core import results  # common puts src/ on the path

PROMPT_LENS = (150, 170, 190, 210)
COLUMNS = ["variant", "batch", "prompt_len", "cache_len", "wall_ms", "replay_ms", "replay_mean_ms", "replay_fused_ms",
           "pick_in_graph_ms", "loop_ms", "prefill_share_ms", "sampling_ms", "gemm_ms", "gemm_bandwidth_fraction",
           "attention_ms", "attention_filled_ms", "rest_ms", "fusion_saving_ms", "kernels_per_step",
           "kernels_per_fused_step",
           "floor_ms", "fraction_of_floor", "fused_gemms_saved", "fused_error"]
NOTES = ("fastgen's decode step split into parts timed alone (bench/fastgen_profile.py docstring): ms per decode step; "
         "gemm: the step's GEMMs as the engine runs them (the fused shapes where fused_gemms_saved > 0); "
         "gemm_bandwidth_fraction: weight bytes of one step over that GEMM time, against the measured copy "
         "bandwidth; fraction_of_floor: the bandwidth floor's step time over the measured wall.")


def projection_shapes(cfg: Any) -> dict[str, tuple[int, int, int]]:
    """name -> (N out, K in, how many per step): every linear layer one decode step runs, the lm_head once."""
    h, hd = cfg.hidden_size, cfg.head_dim
    nh, nkv, inter, n = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.num_hidden_layers
    return {"q_proj": (nh * hd, h, n), "k_proj": (nkv * hd, h, n), "v_proj": (nkv * hd, h, n),
            "o_proj": (h, nh * hd, n), "gate_proj": (inter, h, n), "up_proj": (inter, h, n),
            "down_proj": (h, inter, n), "lm_head": (cfg.vocab_size, h, 1)}


def median_ms(fn: Any, reps: int = 20) -> float:
    return statistics.median(common.cuda_time(fn, warmup=3, reps=reps)) * 1e3


def graph_ms(body: Any, reps: int = 20) -> float:
    """ms per run of ``body()`` as a captured CUDA graph replays it: its kernels back to back with no Python
    launch between them, as in fastgen's decode step. Why not one event pair around each eager call: the first
    run of this bench (2026-12-04, H200) timed every projection alone that way and read ~28 us for a 5 MB GEMM
    (~1.5 us of bytes) and 172 us for one layer's attention: the launches, not the kernels (gemm + attention
    came to 14 ms against a 4.3 ms replay). On the CPU: body()'s wall time."""
    import torch

    if common.DEVICE != "cuda":
        return median_ms(body, reps)
    body()  # compiles, where body holds a compiled function, outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's docs ask
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return statistics.median(common.cuda_time(graph.replay, warmup=2, reps=reps)) * 1e3


def fused_shapes(cfg: Any) -> dict[str, tuple[int, int, int]]:
    """The projections that read the same input, as one GEMM each (what vLLM runs: QKVParallelLinear,
    MergedColumnParallelLinear): timed beside the separate ones, they say what fusing them in fastgen's shadow
    would save before anyone writes it."""
    h, hd = cfg.hidden_size, cfg.head_dim
    nh, nkv, inter, n = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.num_hidden_layers
    return {"qkv_fused": ((nh + 2 * nkv) * hd, h, n), "gate_up_fused": (2 * inter, h, n)}


FUSED_GROUPS = {"qkv_fused": ("q_proj", "k_proj", "v_proj"), "gate_up_fused": ("gate_proj", "up_proj")}


def time_gemms(cfg: Any, batch: int) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float]]]:
    """Every projection of one step at M = batch rows, each kind as one graph of its launches per step (36 layers,
    a distinct weight per layer as in the model, so no weight is served from L2 twice), and the fused shapes
    beside them: ({name: n, k, per_step, ms}, forms); gemm_columns sums the first as the engine runs them.

    forms, on CUDA only ({} elsewhere): the same GEMMs called otherwise, {name: {form: ms}}, to say whether
    cuBLAS's choice for M = batch rows leaves bandwidth behind (o_proj ran at 44 % and down_proj at 62 % at 8
    rows on the H200, gate_up at 81 %) before anything is built on it:
      weight_left       W @ x.T ([n, batch]: the weight as the GEMM's M side, another heuristic, another kernel)
      weight_left_copy  the same and its transpose copied back to [batch, n] (what a drop-in Linear would pay)
      cublaslt          x @ W.T with torch's preferred BLAS set to cuBLASLt for the call (the process's
                        preference is put back after)
      fp8_row, fp8_tensor  fastgen.fp8.linear (fp8="row" / "tensor"): the activation's scales and e4m3 copy,
                        then torch._scaled_mm on the weight's e4m3 copy (eager kernels here; inductor fuses the
                        first two in the step)
      fp8_gemm_row, fp8_gemm_tensor  torch._scaled_mm alone, the activation quantized beforehand
      (fp8 forms on GPUs of compute capability >= 8.9)"""
    import torch

    from rlstack.payload.fastgen import fp8

    dev, dt = common.DEVICE, torch.bfloat16
    parts: dict[str, dict[str, Any]] = {}
    forms: dict[str, dict[str, float]] = {}
    for name, (n_out, k_in, count) in {**projection_shapes(cfg), **fused_shapes(cfg)}.items():
        w = torch.randn(count, n_out, k_in, device=dev, dtype=dt)
        x = torch.randn(batch, k_in, device=dev, dtype=dt)
        y = torch.empty(batch, n_out, device=dev, dtype=dt)
        yt = torch.empty(n_out, batch, device=dev, dtype=dt)

        def body(w: Any = w, x: Any = x, y: Any = y, count: int = count) -> None:
            for i in range(count):
                torch.matmul(x, w[i].t(), out=y)

        def left(w: Any = w, x: Any = x, y: Any = y, yt: Any = yt, count: int = count, back: bool = False) -> None:
            for i in range(count):
                torch.matmul(w[i], x.t(), out=yt)
                if back:
                    y.copy_(yt.t())

        parts[name] = {"n": n_out, "k": k_in, "per_step": count, "ms": round(graph_ms(body), 5)}
        if dev == "cuda":
            before = torch.backends.cuda.preferred_blas_library()
            timed = {"weight_left": graph_ms(left), "weight_left_copy": graph_ms(lambda: left(back=True))}
            try:
                torch.backends.cuda.preferred_blas_library("cublaslt")
                timed["cublaslt"] = graph_ms(body)
            finally:
                torch.backends.cuda.preferred_blas_library(before)
            if fp8.unavailable(torch.device(dev)) is None:
                w8 = w.to(fp8.FP8)
                for kind, scale in (("row", torch.ones(n_out, device=dev)), ("tensor", torch.ones((), device=dev))):
                    xq, x_scale = fp8.quantize_activation(x, kind == "row")
                    b_scale = scale[None, :] if kind == "row" else scale
                    out_dt = torch.bfloat16 if kind == "row" else dt

                    def fp8_form(w8: Any = w8, x: Any = x, count: int = count, scale: Any = scale) -> None:
                        for i in range(count):
                            fp8.linear(x, w8[i], scale)

                    def fp8_gemm(w8: Any = w8, xq: Any = xq, count: int = count, b_scale: Any = b_scale,
                                 x_scale: Any = x_scale, out_dt: Any = out_dt) -> None:
                        for i in range(count):
                            torch._scaled_mm(xq, w8[i].t(), scale_a=x_scale, scale_b=b_scale, out_dtype=out_dt)

                    timed[f"fp8_{kind}"], timed[f"fp8_gemm_{kind}"] = graph_ms(fp8_form), graph_ms(fp8_gemm)
                del w8
            forms[name] = {k: round(v, 5) for k, v in timed.items()}
        del w, x, y, yt
    return parts, forms


def gemm_columns(parts: dict[str, dict[str, Any]], batch: int, bandwidth: float, fused: bool) -> dict[str, Any]:
    """A step's GEMM time as the engine runs it: q/k/v and gate/up as the fused shapes where the engine fused
    them (fused_gemms_saved > 0), apart otherwise; each part's bandwidth_fraction (bytes moved = weights of the
    part's ``weight_bytes`` an element, 2 unless an fp8 engine's set 1, plus bf16 activations) is set in
    `parts`. fusion_saving_ms: the separate shapes minus the fused ones, what fusing
    saves (or saved) either way. Until 2026-12-04 the sum took the separate shapes for a fused engine too,
    which left its `rest` short by the saving (`--rederive` recomputes a stored run)."""
    for p in parts.values():
        moved = p["per_step"] * (p["n"] * p["k"] * p.get("weight_bytes", 2) + batch * (p["k"] + p["n"]) * 2)
        p["bandwidth_fraction"] = round(moved / (p["ms"] / 1e3) / bandwidth, 3)
    separate = [name for name in parts if name not in FUSED_GROUPS]
    members = {m for group in FUSED_GROUPS.values() for m in group}
    step = [name for name in separate if not (fused and name in members)] + (list(FUSED_GROUPS) if fused else [])
    ms = sum(parts[name]["ms"] for name in step)
    weights = sum(parts[name]["n"] * parts[name]["k"] * parts[name]["per_step"] * parts[name].get("weight_bytes", 2)
                  for name in separate)
    saving = sum(sum(parts[m]["ms"] for m in group) - parts[f]["ms"] for f, group in FUSED_GROUPS.items())
    return {"gemm_ms": round(ms, 4), "gemm_bandwidth_fraction": round(weights / (ms / 1e3) / bandwidth, 3),
            "gemm_fused": fused, "fusion_saving_ms": round(saving, 4)}


def derive_rest(row: dict[str, Any]) -> None:
    """rest = replay - gemm - attention (where all three were measured)."""
    if "replay_ms" in row and "attention_ms" in row and "gemm_ms" in row:
        row["rest_ms"] = round(row["replay_ms"] - row["gemm_ms"] - row["attention_ms"], 4)


def rederive(path: Path, name: str) -> int:
    """Recompute a stored run's sums (gemm_ms, its bandwidth fraction, rest_ms) from its measured parts with
    this accounting, no GPU: the timings stay the run's, `rederived` records when and by what."""
    data = json.loads(path.read_text())
    if "schema_version" in data:  # the results schema (rlstack.core.results); archived runs are the older layout
        stored = results.read(path)
        data, rows = {**stored.extra, "date": stored.date, "argv": stored.ran.command.split()[1:]}, stored.rows
    else:
        rows = data.pop("table")
    bandwidth = data["ceilings"]["copy_bandwidth_Bps"]
    data.pop("smoke", None)
    for row in rows:
        if row.get("gemm_parts"):
            batch = row["batch"]
            row.update(gemm_columns(row["gemm_parts"], batch, bandwidth, bool(row.get("fused_gemms_saved"))))
            derive_rest(row)
    data["rederived"] = {"date": common.now(), "from": str(path), "argv": sys.argv}
    common.write_results(name, data, rows, COLUMNS, NOTES, question="engine-profile", engine="fastgen",
                         title="fastgen's decode step split into parts (ms per step)")
    return 0


def time_attention(cfg: Any, batch: int, length: int, kind: str = "matmul", tuning: Any = None) -> float:
    """fastgen's decode attention of this kind (decode_attention: grouped matmuls, or the triton split kernel
    reading up to the last slot, launched with ``tuning``, an engine's attention_tuning, or the default) over a
    static cache of `length` slots, one query token, for every layer of one step, in ms: compiled as fastgen's
    step compiles it and replayed as one graph of all layers, each layer reading its own cache."""
    import torch

    from rlstack.payload.fastgen import split_attention
    from rlstack.payload.fastgen.attention import gqa_decode_attention
    from rlstack.payload.fastgen.keywords import SLOT_KWARG, TUNING_KWARG

    dev, dt = common.DEVICE, torch.bfloat16
    nh, nkv, hd, layers = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers
    q = torch.randn(batch, nh, 1, hd, device=dev, dtype=dt)
    k = torch.randn(layers, batch, nkv, length, hd, device=dev, dtype=dt)
    v = torch.randn(layers, batch, nkv, length, hd, device=dev, dtype=dt)
    mask = torch.ones(batch, 1, 1, length, device=dev, dtype=torch.bool)
    attn = torch.compile(gqa_decode_attention, dynamic=False) if dev == "cuda" else gqa_decode_attention
    extra = {SLOT_KWARG: torch.tensor([length - 1], device=dev)} if kind == "triton" else {}
    if kind == "triton" and tuning is not None:
        extra[TUNING_KWARG] = tuning
        if tuning.fuse_merge:  # its counters made here, outside the compile (as FastGenerator does)
            split_attention.counters(dev)

    def body() -> None:
        for i in range(layers):
            attn(None, q, k[i], v[i], mask, **extra)

    return graph_ms(body)  # the caches (7 GB at 64 x 768) go with this frame


def time_sampling(eng: Any, cfg: Any, batch: int, cache_len: int, sampling: Any) -> float:
    """fastgen's pick of one step (the recipe's warpers on float32 logits over the whole vocabulary, the draw,
    EOS bookkeeping, the next inputs), call by call, launches included, as the engine runs it (eager, or through
    draw="triton"'s kernels): what the loop runs between two replays. On a scratch loop state, so the
    engine's own stays as the run left it."""
    import torch

    from rlstack.payload.fastgen.sampling import _Loop

    loop = _Loop.new(batch, cache_len, common.DEVICE)
    logits = torch.randn(batch, cfg.vocab_size, device=common.DEVICE, dtype=torch.float32)
    eos = eng._eos_tensor(sampling.eos_token_ids)

    def pick() -> None:
        loop.k.fill_(100)  # inside the token buffer whatever the number of calls
        eng._pick_step(logits, loop, sampling, eos)

    return median_ms(pick)


def two_stage_kth(logits: Any, k: int, chunks: int = 64) -> Any:
    """The k-th largest logit of each row, [B, 1], as torch.topk(logits, k).values[..., -1:] gives it, in two
    stages: the top k of each of ``chunks`` slices of the row (B x chunks rows: enough to fill the GPU), then the
    top k of those candidates. Exact: a row's k largest values are among its slices' k largest. Timed beside the
    one-stage top-k (``topk_two_stage_ms``), not used by fastgen: which one the pick should run is measured first."""
    import torch

    b, v = logits.shape
    width = -(-v // chunks)
    if width * chunks != v:
        logits = torch.nn.functional.pad(logits, (0, width * chunks - v), value=-math.inf)
    cand = logits.view(b, chunks, width).topk(min(k, width), dim=-1).values.reshape(b, -1)
    return cand.topk(k, dim=-1).values[..., -1:]


def time_kernel_draw(logits: Any, sampling: Any, invalid: Any) -> dict[str, Any]:
    """``draw_triton_ms``: draw="triton"'s two kernels (fastgen.topk_draw: temperature, top-k and the draw) as a
    graph, against ``warp_ms`` + ``draw_ms`` (what they replace), and ``draw_triton_by_chunks``: the same at the
    engine's launch shape and four others (``"<target chunks>:<warps>"``); nothing where they cannot run here or
    do not draw this sampling (the CPU, top-p, no top-k)."""
    import torch

    from rlstack.payload.fastgen import topk_draw, triton_support

    batch, vocab = logits.shape
    if (common.DEVICE != "cuda" or triton_support.available(common.DEVICE, "draw") is not None
            or topk_draw.applies(sampling.do_sample, sampling.top_k, sampling.top_p, sampling.min_p, vocab,
                                 batch) is not None):
        return {}
    seed = torch.tensor([1234], device=logits.device)
    step = torch.zeros(1, dtype=torch.long, device=logits.device)

    def timed(chunks: int | None = None, warps: int = topk_draw.NUM_WARPS) -> float:
        return round(graph_ms(lambda: topk_draw.draw(logits, sampling.top_k, sampling.temperature, seed, step,
                                                     invalid, chunks, warps)), 4)

    # the engine's launch shape (TARGET_CHUNKS, NUM_WARPS) and four others: fewer / more programs a row, fewer warps
    # a program; each is a compile of both kernels (~a few s on the lease's CPU), so not a whole grid
    own = f"{topk_draw.TARGET_CHUNKS}:{topk_draw.NUM_WARPS}"
    shapes = {own: timed()} | {f"{c}:{w}": timed(c, w) for c, w in ((32, 8), (128, 8), (64, 4), (128, 4))}
    return {"draw_triton_ms": shapes[own], "draw_triton_by_chunks": shapes}


def time_pick_parts(cfg: Any, batch: int, sampling: Any) -> dict[str, Any]:
    """The pick's GPU work split, each part replayed as a graph (as a captured pick would hold them): the top-k
    threshold alone (torch.topk over the whole vocabulary, one row per sequence), the warpers (the top-k among
    them), and the draw (Exp(1) noise over the vocabulary, its log, argmax; the softmax before it until
    2026-12-04). Why: the pick inside the graph cost 0.23 ms at 8 sequences and 0.47 at 64 on the H200
    (2026-12-04), 49 kernels; this says which part, before a cheaper one is written (`topk_bf16_ms`: the
    threshold over bf16 logits, a candidate the pick does not run yet; `draw_triton_ms`: draw="triton"'s kernels,
    which replace the warpers and the draw, see time_kernel_draw)."""
    import torch

    from rlstack.payload.fastgen.sampling import _draw, _warp

    logits = torch.randn(batch, cfg.vocab_size, device=common.DEVICE, dtype=torch.float32)
    invalid = torch.zeros(batch, dtype=torch.bool, device=common.DEVICE)
    warped = _warp(logits, sampling)
    parts = {"warp_ms": graph_ms(lambda: _warp(logits, sampling)),
             "draw_ms": graph_ms(lambda: _draw(warped, None, invalid))}
    if sampling.top_k is not None and sampling.top_k < cfg.vocab_size:
        parts["topk_ms"] = graph_ms(lambda: torch.topk(logits, sampling.top_k, dim=-1))
        parts["topk_two_stage_ms"] = graph_ms(lambda: two_stage_kth(logits, sampling.top_k))
        # the same threshold over the bf16 logits the model's head computed (float32 of a bf16 is exact, so the kth
        # value is the same): half the bytes and half the radix digits; a candidate, not what the pick runs
        half = logits.to(torch.bfloat16)
        parts["topk_bf16_ms"] = graph_ms(lambda: torch.topk(half, sampling.top_k, dim=-1))
    return {k: round(v, 4) for k, v in parts.items()} | time_kernel_draw(logits, sampling, invalid)


def rewinder(eng: Any, batch: int, cache_len: int, start: int) -> Any:
    """A function that sets the engine back to where a decode step of this shape can replay again: the static
    cache's write position (transformers 5 keeps it in each layer's cumulative_length and every replay advances
    it by one; 4.x writes at the loop's slot instead) and the decode loop's state (token index, position, slot),
    as they stood after the prompt, so no replay writes past the cache or the loop's token buffer."""
    lengths = eng._lengths(eng._caches[(batch, cache_len)][0])
    loop = eng._loops[(batch, cache_len)]
    offset = loop.pos - loop.slot  # each row's position minus its cache slot: constant along a generate

    def rewind() -> None:
        for t in lengths:
            t.fill_(start)
        loop.k.fill_(1)
        loop.pos.copy_(offset + start)
        loop.slot.fill_(start)

    return rewind


def replay_start(prompt_len: int, new_tokens: int, cache_len: int, reads_filled: bool, chunk: int = 32) -> int:
    """The cache slot the timed replays start from. A step that reads every slot of the static cache (the matmul
    attention) does the same work at any fill: the prompt's end, as always. The triton attention reads the filled
    slots only, so its replays start where a chunk of them averages the generation's mean fill (prompt + half the
    new tokens), staying inside the cache. Why: timed from the prompt's end it read ~210 slots where the
    generation's steps average ~466 (64 sequences, 2026-12-05), which made the replay look 1.2 ms shorter than the
    step and loop_ms (wall - replay) twice what runs between replays."""
    if not reads_filled:
        return prompt_len
    mid = prompt_len + max(0, new_tokens // 2 - chunk // 2)
    return max(prompt_len, min(mid, cache_len - chunk - 1))


def time_replays(graph: Any, rewind: Any, room: int, chunks: int = 5) -> float:
    """ms per replay of a captured graph, in chunks of at most `room` replays with the engine rewound before each
    (outside the timed region), so no replay writes past the static cache: at 64 sequences the cache has 47 free
    slots after a 512-token generate (prompts of 210, 768 slots)."""
    import torch

    per_chunk = max(1, min(room, 32))
    times = []
    for _ in range(chunks + 1):  # the first chunk warms up
        rewind()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_chunk):
            graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / per_chunk)
    return statistics.median(times[1:])


def top_kernels(kernels: list[Any], reps: int, n: int = 10) -> list[dict[str, Any]]:
    """The kernels that take the most GPU time per replay, by name: [{"name", "count", "us"}] per replay, the
    longest first (names cut to 90 characters). Why: replay - gemm - attention leaves a "rest" of 0.5-0.7 ms at 8
    sequences that no part timed alone names (2026-12-04); the profile of the replay itself does."""
    by: dict[str, list[float]] = {}
    for e in kernels:
        t = getattr(e, "device_time_total", None)
        by.setdefault(e.name[:90], []).append(float(t if t is not None else getattr(e, "cuda_time_total", 0.0)))
    rows = [{"name": k, "count": round(len(v) / reps, 1), "us": round(sum(v) / reps, 2)} for k, v in by.items()]
    return sorted(rows, key=lambda r: -r["us"])[:n]


def kernels_per_replay(graph: Any, rewind: Any, reps: int = 3) -> tuple[int | None, list[dict[str, Any]]]:
    """CUDA kernels the profiler records over `reps` replays, per replay (None when it records none: a
    profiler build that does not trace kernels inside graphs), and the ones that take the most time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    rewind()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    return (round(len(kernels) / reps) if kernels else None), top_kernels(kernels, reps)


def replay_mean(by_read: dict[int, float], read_length: Any, prompt_len: int, new_tokens: int,
                cache_len: int) -> float:
    """What the decode loop's replays average when each read length's graph takes `by_read[r]` ms: decode step
    k (1 .. new_tokens - 1) fills prompt_len + k slots and replays the graph of read_length(that, cache_len)."""
    reads = [read_length(prompt_len + k, cache_len) for k in range(1, new_tokens)]
    return sum(by_read[r] for r in reads) / len(reads)


_MEASURED: dict[tuple[Any, ...], Any] = {}


def once(key: tuple[Any, ...], measure: Callable[[], Any]) -> Any:
    """``measure()`` the first time this process asks for ``key``, a copy of that result after: the GEMMs, the
    pick's parts and an attention kind over a length depend on the shapes, not on the engine a variant builds,
    and timing them again for every variant took most of a variant's minutes (a lease is 30)."""
    if key not in _MEASURED:
        _MEASURED[key] = measure()
    return copy.deepcopy(_MEASURED[key])


class CompiledPathFailed(RuntimeError):
    """The variant's compiled decode step failed to build: its other batches are skipped, not timed eager."""


def profile_batch(pm: Any, tok: Any, gc: Any, batch: int, new_tokens: int, ceil: dict[str, float],
                  reps: int, options: dict[str, Any], attention_lengths: tuple[int, ...] = ()) -> dict[str, Any]:
    from rlstack.payload import fastgen

    cfg = pm.get_base_model().config
    prompts = common.random_prompts(max(1, batch // 8), PROMPT_LENS, seed=batch)
    inputs = rg.tokenize(tok, [p for p in prompts for _ in range(8)][:batch], 512)
    eng = fastgen.get_engine(pm, **options)  # built on the first batch with this run's options, then reused
    sampling, _ = fastgen.sampling_from_generation_config(gc, pm)

    def run() -> Any:
        return eng.generate(inputs["input_ids"], inputs["attention_mask"], new_tokens, sampling)

    run()  # compile + capture for this shape
    if eng.compile_error:
        # fastgen fell back to eager decoding: timing it says nothing about the variant and, at ~300 ms a token
        # (decode_attention=flex's eager fallback on 2026-12-04), took the lease's minutes
        raise CompiledPathFailed(eng.compile_error)
    wall = statistics.median(common.cuda_time(run, warmup=0, reps=reps)) / new_tokens * 1e3
    prompt_len = int(inputs["input_ids"].shape[1])
    cache_len = next((k[1] for k in eng._caches if k[0] == batch), None)  # the bucketed static cache length
    row: dict[str, Any] = {"batch": batch, "prompt_len": prompt_len, "cache_len": cache_len,
                           "wall_ms": round(wall, 4), "compile_error": eng.compile_error,
                           "graph_error": eng.graph_error,
                           "fastgen_describe": eng.describe()}
    # the graph over the whole cache (with attend_bucket, the one of the generation's last read length)
    entry = eng._graphs.get((batch, cache_len, cache_len)) if cache_len else None
    if entry is not None and cache_len:
        start = replay_start(prompt_len, new_tokens, cache_len, eng.decode_attention == "triton")
        row["replay_from_slot"] = start
        rewind = rewinder(eng, batch, cache_len, start)
        room = cache_len - start - 1  # replays from that slot on, staying inside the cache
        row["replay_ms"] = round(time_replays(entry[0], rewind, room), 4)
        used = row["replay_ms"]
        if eng.attend_bucket:  # the loop replays a graph per read length: each timed, then weighted by its steps
            by_read = {key[2]: round(time_replays(e[0], rewind, room), 4)
                       for key, e in sorted(eng._graphs.items()) if key[:2] == (batch, cache_len) and e is not None}
            row["replay_by_read"] = {str(r): ms for r, ms in by_read.items()}
            row["replay_mean_ms"] = used = round(replay_mean(by_read, eng.read_length, prompt_len, new_tokens,
                                                             cache_len), 4)
        row["loop_ms"] = round(wall - used, 4)
        try:
            row["kernels_per_step"], row["top_kernels"] = kernels_per_replay(entry[0], rewind, min(3, room))
        except Exception as exc:  # the profiler is optional evidence, the timings are not
            row["kernels_error"] = f"{type(exc).__name__}: {exc}"[:200]
        rewind()
    else:
        row["replay_note"] = "no captured graph (CPU, or capture failed: graph_error)"
    row["fused_gemms_saved"] = eng.fused_gemms_saved  # fuse_projections: GEMMs a step no longer launches
    row["sampling_ms"] = round(time_sampling(eng, cfg, batch, cache_len or prompt_len + new_tokens, sampling), 4)
    row["pick_parts"] = once(("pick", batch, sampling), lambda: time_pick_parts(cfg, batch, sampling))
    row["gemm_parts"], row["gemm_forms"] = once(("gemms", batch), lambda: time_gemms(cfg, batch))
    if getattr(eng, "fp8", "off") != "off":  # the engine's projections are fastgen.fp8's (lm_head stays bf16)
        form = f"fp8_{eng.fp8}"
        for name, forms in row["gemm_forms"].items():
            if form in forms and name != "lm_head":
                row["gemm_parts"][name].update(ms=forms[form], weight_bytes=1)
    row.update(gemm_columns(row["gemm_parts"], batch, ceil["copy_bandwidth_Bps"], bool(eng.fused_gemms_saved)))
    # the engine's attention as it launches it: its kind and, for the triton kernel, its own tuning (None: TUNING)
    kind, tuning = eng.decode_attention, getattr(eng, "tuning", None)
    shape = tuning.spec() if tuning is not None else None
    if cache_len:
        row["attention_ms"] = round(once(("attention", batch, cache_len, kind, shape),
                                         lambda: time_attention(cfg, batch, cache_len, kind, tuning)), 4)
        filled = prompt_len + new_tokens // 2  # the average context a step attends over
        row["attention_filled_ms"] = round(once(("attention", batch, filled, kind, shape),
                                                lambda: time_attention(cfg, batch, filled, kind, tuning)), 4)
        row["attention_filled_len"] = filled
    if attention_lengths:  # what reading only the filled slots could save: one compile per length
        row["attention_by_length"] = {n: round(once(("attention", batch, n, kind, shape),
                                                    lambda n=n: time_attention(cfg, batch, n, kind, tuning)), 4)
                                      for n in attention_lengths}
    # what of loop_ms is the generation's fixed cost: the shadow's refresh, the prefill and the first pick, timed
    # as a one-token generate (its cache is the 128-slot bucket above the prompt, not the run's: the prefill's
    # attention reads fewer slots, its GEMMs are the same), spread over the run's tokens
    first = statistics.median(common.cuda_time(lambda: eng.generate(inputs["input_ids"], inputs["attention_mask"], 1,
                                                                    sampling), warmup=1, reps=reps))
    row["prefill_ms"] = round(first * 1e3, 3)
    row["prefilled_rows"] = getattr(eng, "prefilled_rows", None)  # fewer than batch: prefill_once served repeats
    row["prefill_share_ms"] = round(first * 1e3 / new_tokens, 4)
    # the shadow's refresh alone (LoRA merged into every projection, the FP8 copies quantized again): the part of
    # prefill_ms that vLLM's bf16 row does not pay, and a candidate of its own (docs/archive/notes.md, 2026-12-05)
    if eng._shadow is not None:
        row["refresh_ms"] = round(statistics.median(common.cuda_time(eng._shadow.refresh, warmup=1, reps=reps))
                                  * 1e3, 3)
    derive_rest(row)
    floor = common.decode_floor(cfg, batch, prompt_len, new_tokens, ceil["copy_bandwidth_Bps"])
    row["floor_ms"] = round(floor["floor_step_s"] * 1e3, 4)
    row["fraction_of_floor"] = round(row["floor_ms"] / wall, 3)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="2,4" if common.SMOKE else "8,64", help="sequences per generate call")
    ap.add_argument("--new-tokens", type=int, default=16 if common.SMOKE else 512)
    ap.add_argument("--reps", type=int, default=2 if common.SMOKE else 3, help="timed generate calls per batch")
    common.add_engine_option(ap, "for an A/B in the same lease, recorded in the results: e.g. "
                                 "decode_attention=matmul or prefill_once=false")
    ap.add_argument("--attention-lengths", default="",
                    help="cache lengths to time the attention over as well, e.g. 256,384,512,640,768: what a "
                         "length that follows the generation would read (each a compile and, at 64 sequences, "
                         "up to 7 GB of cache)")
    common.add_variant(ap, "the profile once per variant, each a fresh engine, rows tagged with it")
    ap.add_argument("--rederive", type=Path, metavar="JSON",
                    help="no GPU: recompute a stored run's sums (gemm, rest) with this accounting and write it "
                         "as bench/results/NAME.{json,md}")
    ap.add_argument("--name", default="fastgen_profile", help="the results name --rederive writes")
    a = ap.parse_args(argv)
    if a.rederive:
        return rederive(a.rederive, a.name)
    options = common.engine_options(a.engine_option)
    variants = common.variants(a.variant, options)
    lengths = tuple(int(n) for n in a.attention_lengths.split(",") if n)
    from rlstack.payload import kernelcache

    # before torch: with RLSTACK_KERNEL_CACHE set (fastgen_fidelity_device.sh), inductor's and Triton's output for
    # each variant's step (about a minute of compiling) can go to the next lease (native_probe.sh keep-cache)
    kernelcache.apply()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    shape = rg.recipe_shape()
    data: dict[str, Any] = {**common.header(), "smoke": common.SMOKE, "new_tokens": a.new_tokens,
                            "lora_r": shape["lora_r"], "model": "Qwen3-4B shape, random bf16 weights",
                            "engine_options": options, "variants": variants, "lora_from": shape["source"]}
    data["ceilings"] = ceil = common.measure_ceilings()
    tok = common.build_tokenizer()
    pm = rg.lora_model(common.build_model(), shape["lora_r"], shape["lora_alpha"])
    gc = rg.trl_generation_config(tok, a.new_tokens, top_k=50)
    rows: list[dict[str, Any]] = []
    from rlstack.payload import fastgen

    for label, opts in variants.items():
        fastgen.release(pm)  # engine options apply when an engine is created: each variant gets its own
        torch._dynamo.reset()  # and the compiled code (its guards) of the last one goes with it
        for batch in [int(b) for b in a.batches.split(",") if b]:
            failed = None
            try:
                rows.append(profile_batch(pm, tok, gc, batch, a.new_tokens, ceil, a.reps, opts, lengths))
            except CompiledPathFailed as exc:  # the whole variant: every batch would fall back the same way
                failed = exc
                rows.append({"batch": batch, "error": f"compiled decoding failed, variant skipped: {exc}"})
            except Exception as exc:  # keep the other batch's numbers
                traceback.print_exc()
                rows.append({"batch": batch, "error": f"{type(exc).__name__}: {exc}"[:300]})
            rows[-1] = {"variant": label, **rows[-1]}
            print({k: rows[-1].get(k) for k in COLUMNS}, flush=True)
            if failed is not None:
                break
    fastgen.release(pm)
    common.write_results("fastgen_profile", data, rows, COLUMNS, NOTES, question="engine-profile", engine="fastgen",
                         title="fastgen's decode step split into parts (ms per step)")  # smoke mode: /tmp only
    return 0 if rows and not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
