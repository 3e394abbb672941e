"""How long torch.compile takes over the loop of Unsloth's GRPO log-softmax (issue 40's compile stalls), by rows a
slice and pieces a row, on the GPU with Inductor's Triton backend: what the first GRPO step waits for before it
computes anything.

The two functions copy the chunking of unsloth_zoo's chunked_hidden_states_selective_log_softmax (2026.6.1
rl_replacements.py:73-115, torch.chunk; 2026.10.6 :83-190, fixed row ranges), compiled as Unsloth compiles them
(dynamic=True, fullgraph=True, `chunks` a Python int of rows x multiplier). Each configuration runs in a process of
its own with empty Inductor and Triton caches, so every number is a cold compile; the later widths show whether a
new width compiles again. Default shapes are SmolLM2-135M's (hidden 576, vocabulary 49,152) in bf16, with grad.

    python3 bench/logit_chunk_compile.py [--configs 10.6:16:1 10.6:64:1 ...] [--timeout 240]
        a configuration is RELEASE:ROWS:MULTIPLIER, RELEASE 6.1 (2026.6.1) or 10.6 (2026.10.6)

Writes bench/results/logit_chunk_compile.json (question grpo-step). Needs torch with a CUDA GPU (or
RLSTACK_BENCH_SMOKE=1: a tiny shape on the CPU, written to /tmp only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import common

COLUMNS = ["release", "rows", "multiplier", "pieces", "first_call_s", "later_calls_s", "graphs", "status"]
DEFAULT_CONFIGS = ["10.6:16:1", "6.1:16:1", "10.6:64:1", "6.1:64:1", "10.6:64:4"]


def zoo_2026_6_1(hidden: Any, lm_head: Any, index: Any, chunks: int = 4) -> Any:
    import torch

    flat, flat_index = hidden.reshape(-1, hidden.shape[-1]), index.reshape(-1)
    out = []
    for h, i in zip(torch.chunk(flat, chunks=chunks, dim=0), torch.chunk(flat_index, chunks=chunks, dim=0)):  # noqa: B905
        logits = (h @ lm_head.t()).float()
        out.append(torch.gather(logits, -1, i.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1))
    return torch.concat(out).reshape(hidden.shape[0], hidden.shape[1])


def zoo_2026_10_6(hidden: Any, lm_head: Any, index: Any, chunks: int = 4) -> Any:
    import torch

    flat, flat_index = hidden.reshape(-1, hidden.shape[-1]), index.reshape(-1)
    n = flat.shape[0]
    chunks = max(1, min(chunks, n))
    bounds = [(i * n) // chunks for i in range(chunks + 1)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):  # noqa: B905, RUF007 (unsloth_zoo's own loop)
        logits = (flat[a:b] @ lm_head.t()).float()
        out.append(torch.gather(logits, -1, flat_index[a:b].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1))
    return torch.concat(out).reshape(hidden.shape[0], hidden.shape[1])


RELEASES = {"6.1": zoo_2026_6_1, "10.6": zoo_2026_10_6}


def parse_config(text: str) -> tuple[str, int, int]:
    release, rows, multiplier = text.split(":")
    if release not in RELEASES:
        raise SystemExit(f"logit_chunk_compile: release {release!r} is not one of {sorted(RELEASES)}")
    return release, int(rows), int(multiplier)


def config_row(config: str) -> dict[str, Any]:
    """The columns that name a configuration, the start of its row whatever became of it."""
    release, rows, multiplier = parse_config(config)
    return {"release": release, "rows": rows, "multiplier": multiplier, "pieces": rows * multiplier}


def one(config: str, hidden_size: int, vocab: int, widths: list[int]) -> dict[str, Any]:
    """Compile and run one configuration over the widths (forward and backward); the seconds of each call."""
    import torch
    import torch._dynamo.utils as dynamo_utils

    release, rows, multiplier = parse_config(config)
    device, dtype = common.DEVICE, (torch.float32 if common.SMOKE else torch.bfloat16)
    # smoke: AOTAutograd without Inductor (Inductor's CPU backend needs a C++ toolchain a bare machine may lack)
    compiled = torch.compile(RELEASES[release], dynamic=True, fullgraph=True,
                             backend="aot_eager" if common.SMOKE else "inductor")
    lm_head = torch.randn(vocab, hidden_size, device=device, dtype=dtype) * 0.02
    seconds = []
    for width in widths:
        hidden = torch.randn(rows, width, hidden_size, device=device, dtype=dtype, requires_grad=True)
        index = torch.randint(0, vocab, (rows, width), device=device)
        t0 = time.perf_counter()
        compiled(hidden, lm_head, index, chunks=rows * multiplier).sum().backward()
        common.sync()
        seconds.append(round(time.perf_counter() - t0, 2))
    return {**config_row(config), "first_call_s": seconds[0], "later_calls_s": seconds[1:],
            "graphs": int(dynamo_utils.counters["stats"]["unique_graphs"]), "status": "ok"}


def run_isolated(config: str, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in a child process with empty caches; a timeout is a row too (the stall is the answer)."""
    with tempfile.TemporaryDirectory(prefix="chunk-compile-") as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "TRITON_CACHE_DIR": f"{tmp}/triton"}
        argv = [sys.executable, __file__, "--one", config, "--hidden", str(args.hidden), "--vocab", str(args.vocab),
                "--widths", *map(str, args.widths)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {**config_row(config), "status": f"not done in {args.timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        tail = [line for line in said if "Error" in line][-1:] or said[-1:] or ["no output"]
        wall = time.perf_counter() - t0
        return {**config_row(config), "status": f"rc {proc.returncode} after {wall:.0f} s: {tail[0][:200]}"}
    return dict(json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="RELEASE:ROWS:MULTIPLIER, in this order")
    ap.add_argument("--hidden", type=int, default=64 if common.SMOKE else 576)
    ap.add_argument("--vocab", type=int, default=256 if common.SMOKE else 49152)
    ap.add_argument("--widths", type=int, nargs="+", default=[133, 134, 135, 136],
                    help="batch widths in turn (133-136: each remainder mod 4)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds a configuration may take")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.hidden, args.vocab, args.widths)), flush=True)
        return 0
    for config in args.configs:
        parse_config(config)
    data = common.header()
    table = []
    for config in args.configs:
        table.append(run_isolated(config, args))
        print(json.dumps(table[-1]), flush=True)
    data.update(hidden=args.hidden, vocab=args.vocab, widths=args.widths, timeout_s=args.timeout)
    common.write_results("logit_chunk_compile", data, table, COLUMNS, question="grpo-step",
                         title="torch.compile of Unsloth's GRPO log-softmax loop (copies), cold, by rows and pieces",
                         engine="inductor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
