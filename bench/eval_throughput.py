"""GSM8K-style evaluation throughput (questions/s) with the hf backend: batched greedy generate, vs fastgen greedy.

rlstack.payload.evaluate's hf backend is used when it exposes `hf_generate(model, tokenizer, prompts, batch_size,
max_new_tokens)`; otherwise (recorded in the JSON as `loop`) this runs a faithful local loop of what an hf backend
does: questions in fixed order, batches of `batch_size`, left padding, greedy decoding, decode to text. Random
weights never stop early, so every question costs max_new_tokens: this is the worst case for a real model.

    python bench/eval_throughput.py [--questions 64] [--batches 16,64] [--max-new 256]
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common


def local_hf_loop(model: Any, tok: Any, prompts: list[str], batch_size: int, max_new: int, fast: bool) -> list[str]:
    import torch

    from rlstack.payload import fastgen

    outs: list[str] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        enc = tok(chunk, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        ids, mask = enc["input_ids"].to(common.DEVICE), enc["attention_mask"].to(common.DEVICE)
        with torch.no_grad():
            if fast:
                seq = fastgen.generate(model, ids, mask, max_new, do_sample=False, eos_token_id=tok.eos_token_id,
                                       pad_token_id=tok.pad_token_id)
            else:
                seq = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        outs += tok.batch_decode(seq[:, ids.shape[1]:], skip_special_tokens=True)
    return outs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--batches", default="", help="batch sizes (default: the recipe's eval batch_size and 64)")
    ap.add_argument("--max-new", type=int, default=0, help="default: the recipe's eval max_new_tokens")
    args = ap.parse_args(argv)
    from rollout_generation import recipe_shape

    shape = recipe_shape()
    args.max_new = args.max_new or shape["eval_max_new_tokens"]
    data: dict[str, Any] = {**common.header(), "questions": args.questions, "max_new_tokens": args.max_new}
    data["ceilings"] = ceil = common.measure_ceilings()
    tok = common.build_tokenizer()
    model = common.build_model().eval()
    prompts = common.random_prompts(args.questions, [140, 180, 220, 260], seed=7)
    impl = "loop"
    try:
        from rlstack.payload.evaluate import hf as ev_hf  # type: ignore[attr-defined]

        if hasattr(ev_hf, "hf_generate"):
            impl = "rlstack.payload.evaluate.hf.hf_generate"
    except ImportError:
        ev_hf = None
    data["implementation"] = impl
    rows: list[dict[str, Any]] = []
    batches = args.batches or f"{shape['eval_batch_size']},64"
    data["shape"] = shape
    for bs in [int(b) for b in batches.split(",") if b]:
        for name, fast in (("hf_generate", False), ("fastgen", True)):
            try:
                run = (lambda p, bs=bs, fast=fast: ev_hf.hf_generate(model, tok, p, bs, args.max_new)) \
                    if impl != "loop" and not fast else \
                    (lambda p, bs=bs, fast=fast: local_hf_loop(model, tok, p, bs, args.max_new, fast))
                run(prompts[:bs])  # warm-up (and compilation for fastgen) on one batch
                common.reset_peak()
                t = common.Timer()
                with t:
                    outs = run(prompts)
                P = max(len(p.split()) for p in prompts)
                floor = common.decode_floor(model.config, bs, P, args.max_new, ceil["copy_bandwidth_Bps"])
                n_batches = -(-args.questions // bs)
                rows.append({"variant": name, "batch": bs, "questions": len(outs), "seconds": t.s,
                             "questions_per_s": len(outs) / t.s,
                             "tokens_per_s": len(outs) * args.max_new / t.s,
                             "floor_questions_per_s": args.questions / (n_batches * args.max_new *
                                                                        floor["floor_step_s"]),
                             "peak_gib": common.peak_gib()})
            except Exception as exc:
                traceback.print_exc()
                rows.append({"variant": name, "batch": bs, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(rows[-1], flush=True)
    for r in rows:
        hf = next((b for b in rows if b["variant"] == "hf_generate" and b["batch"] == r["batch"]
                   and b.get("questions_per_s")), None)
        if hf and r.get("questions_per_s"):
            r["speedup_vs_hf"] = r["questions_per_s"] / hf["questions_per_s"]
    cols = ["variant", "batch", "questions", "seconds", "questions_per_s", "tokens_per_s", "floor_questions_per_s",
            "speedup_vs_hf", "peak_gib", "error"]
    notes = (f"Greedy, {args.max_new} new tokens per question (random weights: no early EOS), implementation: "
             f"{impl}. Floor: weights + KV bytes per decode step over the measured copy bandwidth "
             f"({ceil['copy_bandwidth_TBps']:.2f} TB/s), prefill not counted.")
    common.write_results("eval_throughput", data, rows, cols, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
