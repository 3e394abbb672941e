"""The embedded default, end to end on the CPU: what the README's first command runs on a fresh machine.
Lock check, the GRPO run, evaluation of the adapter and of its base, and their paired comparison, each step
through the same payload command a user would type (`rlstack train/eval/compare`), natively in this venv."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

from rlstack.host import locks, stacks


def run_smoke(*, lock_check: bool = True, steps: int | None = None, name: str | None = None) -> int:
    from rlstack.core.paths import recipes_dir
    from rlstack.payload import commands as payload
    from rlstack.payload.evaluate.gsm8k import default_runs_dir

    if lock_check:
        locks.check(stacks.load_stack("cpu"))
        print("smoke: images/cpu/requirements.lock is current", file=sys.stderr)
    name = name or f"smoke-cpu-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    t0 = time.perf_counter()
    recipe = str(recipes_dir() / "smoke-cpu.toml")
    rc = payload.train(recipe=recipe, adapter_name=name, max_steps=steps)
    if rc:
        return rc
    t1 = time.perf_counter()
    out = default_runs_dir() / "eval" / name
    base_out = default_runs_dir() / "eval" / f"{name}-base"
    rc = payload.eval_(adapter=name, output=out) or payload.eval_(model="tiny", recipe=recipe, output=base_out)
    if rc:
        return rc
    rc = payload.compare(base_out / "results.json", out / "results.json")
    print(f"smoke: train {t1 - t0:.0f}s, evals {time.perf_counter() - t1:.0f}s; adapter {name} "
          f"(invoke adapters --local runs/adapters); results {out / 'results.json'} "
          f"(base: {base_out / 'results.json'})", file=sys.stderr)
    return rc
