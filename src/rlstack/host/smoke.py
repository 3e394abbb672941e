"""The embedded default, end to end on the CPU: what the README's first command runs on a fresh machine.
Lock check, the GRPO run, evaluation of the adapter and of its base, and their paired comparison, each step
through the same payload command a user would type (`rlstack train/eval/compare`), natively in this venv.

The default recipe trains a real pretrained model (SmolLM2-135M-Instruct, fetched once from PyPI: see
rlstack.payload.embedded) on problems it can nearly solve, so the run shows learning, not noise. The output
ends with what changed: accuracy and format, each paired on the same held-out problems, the reward curve's
path, and one plain sentence, printed last.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime

from rlstack import stacks
from rlstack.stacks import locks


def run_smoke(*, recipe: str, lock_check: bool = True, steps: int | None = None, name: str | None = None) -> int:
    from rlstack.core.paths import shown
    from rlstack.payload import commands as payload
    from rlstack.payload import recipes
    from rlstack.payload.evaluate.compare import compare, summary
    from rlstack.payload.evaluate.gsm8k import default_runs_dir
    from rlstack.payload.train.grpo import runs_root

    # Before torch loads its OpenMP runtime: idle threads sleep instead of spinning. On a 2-core machine that
    # other work shares, spinning threads burn the very core they wait for; measured here, under others' load:
    # prefill + 32 decode steps for 16 prompts took 41-61 s with spinning threads, 17-20 s with sleeping ones.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if lock_check:
        locks.check(stacks.load_stack("cpu"))
        print("smoke: images/cpu/requirements.lock is current", file=sys.stderr)
    path = str(recipes.resolve_path(recipe))
    spec = recipes.load(path)
    name = name or f"{spec.name}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    t0 = time.perf_counter()
    rc = payload.train(recipe=path, adapter_name=name, max_steps=steps)
    if rc:
        return rc
    t1 = time.perf_counter()
    out = default_runs_dir() / "eval" / name
    base_out = default_runs_dir() / "eval" / f"{name}-base"
    rc = payload.eval_(adapter=name, output=out) or payload.eval_(model=spec.model.name, recipe=path, output=base_out)
    if rc:
        return rc
    t2 = time.perf_counter()
    c = compare(base_out / "results.json", out / "results.json")
    n_steps = steps or spec.grpo.max_steps
    # One stream, flushed, so the comparison is the last thing on the screen even when output is piped.
    print(f"\nsmoke: train {t1 - t0:.0f}s, evals {t2 - t1:.0f}s; adapter {name} (invoke adapters --local "
          f"runs/adapters); results {shown(out / 'results.json')} (base: {shown(base_out / 'results.json')})\n"
          f"reward curve: {shown(runs_root() / name / 'reward_curve.png')}\n"
          f"{payload.format_compare(c, flips=False, sentence=False)}\n\n"
          + summary(c, lead=f"After {n_steps} GRPO steps ({(t1 - t0) / 60:.1f} min of training on this CPU), on"),
          flush=True)
    return 0
