"""GSM8K-style evaluation throughput (questions/s) of `rlstack eval`'s hf backend: transformers' generate vs
`--fastgen`, both through the product's own batch loop (rlstack.payload.evaluate.gsm8k.generate_batches: questions in
order, batches of batch_size, left padding, greedy, decode to text). Random weights never stop early, so every
question costs max_new_tokens: the worst case for a real model. The whole command, adapter loading included, is
`bench/gpu_stacks.py eval ... [--fastgen]` (rlstack eval itself); this one isolates decoding at several batch sizes.

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
    from rlstack.payload.evaluate.gsm8k import EvalConfig, generate_batches

    data["implementation"] = "rlstack.payload.evaluate.gsm8k.generate_batches"
    rows: list[dict[str, Any]] = []
    batches = args.batches or f"{shape['eval_batch_size']},64"
    data["shape"] = shape
    for bs in [int(b) for b in batches.split(",") if b]:
        for name, fast in (("hf_generate", False), ("fastgen", True)):
            try:
                cfg = EvalConfig(batch_size=bs, max_new_tokens=args.max_new, fastgen=fast)

                def run(p: list[str], cfg: EvalConfig = cfg) -> list[str]:
                    texts, _, _, how = generate_batches(model, tok, p, cfg)
                    if cfg.fastgen and how != "+fastgen":
                        raise RuntimeError(f"fastgen did not run: {how}")
                    return texts

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
    notes = (f"Greedy, {args.max_new} new tokens per question (random weights: no early EOS), through "
             f"{data['implementation']}. Floor: weights + KV bytes per decode step over the measured copy bandwidth "
             f"({ceil['copy_bandwidth_TBps']:.2f} TB/s), prefill not counted.")
    common.write_results("eval_throughput", data, rows, cols, notes, question="evaluation",
                         title="Greedy evaluation decoding at several batch sizes", metric="questions_per_s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
