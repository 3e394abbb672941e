"""The payload's own code path end to end on a GPU: `rlstack train` (default recipe, few steps) then `rlstack eval`
(hf backend) on a Qwen3-4B-shaped random model saved locally, natively (no Docker), with TRL's default generation
and again with rlstack.payload.fastgen swapped in behind `generate` (`--fastgen`, by class-level patching from here, so
the payload's files are untouched). Records step time, tokens/s and questions/s to bench/results/payload_e2e.json.

    python bench/payload_e2e.py [--steps 2] [--completion 128] [--eval-n 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

MODEL_DIR = Path("/tmp/rlstack-tiny-random" if common.SMOKE else "/tmp/rlstack-qwen3-4b-random")


def patch_generate_with_fastgen() -> None:
    """Route every PEFT / transformers `generate` through fastgen (fallback to the original when it can't serve)."""
    from peft import PeftModelForCausalLM
    from transformers.generation.utils import GenerationMixin

    from rlstack.payload.fastgen import FastgenError
    from rlstack.payload.fastgen.hook import _serve

    for cls in (PeftModelForCausalLM, GenerationMixin):
        orig = cls.generate

        def patched(self: Any, *a: Any, _orig: Any = orig, **k: Any) -> Any:
            if getattr(self, "_rlstack_no_fastgen", False):
                return _orig(self, *a, **k)
            try:
                out = _serve(self, lambda *aa, **kk: _orig(self, *aa, **kk), {}, a, k)
                if not getattr(self, "_rlstack_fastgen_announced", False):
                    object.__setattr__(self, "_rlstack_fastgen_announced", True)
                    print(f"fastgen served generate for {type(self).__name__}", flush=True)
                return out
            except FastgenError as exc:
                print(f"fastgen fallback: {exc}", flush=True)
                return _orig(self, *a, **k)

        cls.generate = patched


def child(argv: list[str]) -> int:
    """Run the rlstack CLI in this process (with fastgen patched in when asked)."""
    if argv and argv[0] == "--fastgen":
        patch_generate_with_fastgen()
        argv = argv[1:]
    from rlstack.cli import main

    return main(argv)


def run_cli(args: list[str], fast: bool, log: Path) -> tuple[int, float]:
    cmd = [sys.executable, __file__, "--child", *(["--fastgen"] if fast else []), *args]
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
    return rc, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--completion", type=int, default=128, help="grpo.max_completion_length override (0: recipe's)")
    ap.add_argument("--eval-n", type=int, default=16)
    ap.add_argument("--eval-max-new", type=int, default=128)
    ap.add_argument("--modes", default="default,fastgen")
    args = ap.parse_args(argv)
    import os

    out = Path("/tmp/rlstack-e2e-logs")  # child logs; their tails are gathered into one file under $OUT
    out.mkdir(parents=True, exist_ok=True)
    combined = Path(os.environ.get("OUT", "/tmp/rlstack-e2e")) / "payload_e2e_logs.txt"
    combined.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {**common.header(), "model_dir": str(MODEL_DIR), "steps": args.steps,
                            "completion_override": args.completion}
    if not (MODEL_DIR / "config.json").exists():
        from rlstack.payload import tokenizer_files

        t = time.perf_counter()
        common.build_model().save_pretrained(MODEL_DIR)
        tokenizer_files.save(common.build_tokenizer(), MODEL_DIR)
        data["model_save_s"] = time.perf_counter() - t
    rows: list[dict[str, Any]] = []
    for mode in [m for m in args.modes.split(",") if m]:
        fast = mode == "fastgen"
        name = f"e2e-{mode}"
        train = ["train", "--recipe", "gsm8k-grpo", "--model", str(MODEL_DIR), "--data", "generated:64",
                 "--max-steps", str(args.steps), "--adapter-name", name, "--adapters-root", "/tmp/rlstack-adapters",
                 "--output", f"/tmp/rlstack-runs/{name}", "--overwrite", "--set", "grpo.save_steps=1000"]
        if args.completion:
            train += ["--set", f"grpo.max_completion_length={args.completion}"]
        rc, secs = run_cli(train, fast, out / f"train_{mode}.log")
        row: dict[str, Any] = {"mode": mode, "train_rc": rc, "train_wall_s": secs}
        metrics = Path(f"/tmp/rlstack-runs/{name}/metrics.jsonl")
        if metrics.exists():
            steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            row["steps_logged"] = len(steps)
            row["step_time_s"] = [s.get("step_time_s") for s in steps]
            row["tokens_per_s"] = [s.get("tokens_per_s") for s in steps]
            row["completion_tokens_per_s"] = [s.get("completion_tokens_per_s") for s in steps]
        ev = ["eval", "--adapter", f"/tmp/rlstack-adapters/{name}", "--backend", "hf", "-n", str(args.eval_n),
              "--data", "generated:64", "--max-new-tokens", str(args.eval_max_new), "--load-in-4bit",
              "--output", f"/tmp/rlstack-eval/{name}", "--json"]
        if rc == 0:
            erc, esecs = run_cli(ev, fast, out / f"eval_{mode}.log")
            row.update(eval_rc=erc, eval_wall_s=esecs)
            res = Path(f"/tmp/rlstack-eval/{name}/results.json")
            if res.exists():
                r = json.loads(res.read_text())
                row["eval_timings"] = r.get("timings")
                row["eval_n"] = r.get("n")
                gen_s = (r.get("timings") or {}).get("generate_s")
                if gen_s and r.get("n"):
                    row["eval_questions_per_s"] = r["n"] / gen_s
            row["fastgen_served"] = "fastgen served generate" in (out / f"train_{mode}.log").read_text()
        rows.append(row)
        print(row, flush=True)
        with combined.open("a") as fh:
            for log in sorted(out.glob(f"*_{mode}.log")):
                fh.write(f"===== {log.name} (last 6000 chars)\n{log.read_text()[-6000:]}\n")
        common.write_results("payload_e2e", {**data, "partial": True}, rows, ["mode"], quiet=True,
                             question="grpo-step",
                              title="rlstack train end to end (partial)")
    cols = ["mode", "train_rc", "train_wall_s", "steps_logged", "step_time_s", "completion_tokens_per_s", "eval_rc",
            "eval_wall_s", "eval_questions_per_s", "fastgen_served", "eval_timings"]
    notes = ("`rlstack train --recipe gsm8k-grpo` (4-bit QLoRA via transformers+peft+bitsandbytes: no unsloth on "
             "this machine) on generated problems, then `rlstack eval --backend hf --load-in-4bit` with the adapter. "
             f"Completion length override: {args.completion or 'none'}; logs: train_*.log, eval_*.log.")
    common.write_results("payload_e2e", data, rows, cols, notes, question="grpo-step",
                         title="rlstack train end to end, 4-bit QLoRA: generate against fastgen")
    return 0


if __name__ == "__main__":
    sys.exit(main())
