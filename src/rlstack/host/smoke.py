"""The embedded default, end to end on the CPU: what the README's first command runs on a fresh machine.
Lock check, the tiny GRPO run, evaluation of the adapter and of its base, and their paired comparison —
each step through the same `rlstack` commands a user would type."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

from rlstack.host import locks, stacks


def run_smoke(*, lock_check: bool = True, steps: int = 0, name: str = "") -> int:
    from rlstack.cli import main as cli
    from rlstack.payload.evaluate.gsm8k import default_runs_dir

    if lock_check:
        locks.check(stacks.load_stack("cpu"))
        print("smoke: images/cpu/requirements.lock is current", file=sys.stderr)
    name = name or f"smoke-cpu-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    t0 = time.perf_counter()
    rc = cli(["train", "--recipe", "recipes/smoke-cpu.toml", "--adapter-name", name,
              *(["--max-steps", str(steps)] if steps else [])])
    if rc:
        return rc
    t1 = time.perf_counter()
    out = default_runs_dir() / "eval" / name
    base_out = default_runs_dir() / "eval" / f"{name}-base"
    for argv in (["eval", "--adapter", name, "--output", str(out)],
                 ["eval", "--model", "tiny", "--recipe", "recipes/smoke-cpu.toml", "--output", str(base_out)]):
        rc = cli(argv)
        if rc:
            return rc
    rc = cli(["compare", str(base_out / "results.json"), str(out / "results.json")])
    print(f"smoke: train {t1 - t0:.0f}s, evals {time.perf_counter() - t1:.0f}s; adapter {name} "
          f"(invoke adapters --local runs/adapters); results {out / 'results.json'} "
          f"(base: {base_out / 'results.json'})", file=sys.stderr)
    return rc
