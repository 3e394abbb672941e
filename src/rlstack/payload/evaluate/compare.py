"""Paired comparison of two evaluations (any two results.json written by `rlstack eval` on the same
questions): the delta with a bootstrap interval, the exact McNemar p-value, and which questions flipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlstack.payload import stats
from rlstack.payload.evaluate.scoring import EvalError


def compare(base_path: Path, tuned_path: Path, *, iters: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Paired comparison of two results.json on the questions both scored."""
    def load(p: Path) -> dict[str, Any]:
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise EvalError(f"{p}: cannot read results ({exc})") from None
        if "per_question" not in data:
            raise EvalError(f"{p}: no per_question outcomes (not written by rlstack eval?)")
        return data

    base, tuned = load(base_path), load(tuned_path)
    bq, tq = base["per_question"], tuned["per_question"]
    common = [q for q in bq if q in tq]
    if not common:
        raise EvalError("the two results share no questions", "evaluate both on the same data, split and -n")
    only = len(bq) + len(tq) - 2 * len(common)
    b = [bool(bq[q]) for q in common]
    t = [bool(tq[q]) for q in common]
    res = stats.paired(b, t, iters=iters, seed=seed)
    out = {
        "n": res.n, "base_correct": res.base_correct, "tuned_correct": res.tuned_correct,
        "base_accuracy": res.base_correct / res.n, "tuned_accuracy": res.tuned_correct / res.n,
        "delta_points": 100 * res.delta, "bootstrap_95_points": [100 * res.ci[0], 100 * res.ci[1]],
        "discordant": {"base_only": res.base_only, "tuned_only": res.tuned_only},
        "mcnemar_exact_p": res.p_value, "significant_at_0.05": res.p_value < 0.05,
        "unpaired_questions": only,
        "flips": {"fixed": [q for q in common if tq[q] and not bq[q]],
                  "broken": [q for q in common if bq[q] and not tq[q]]},
        "base": str(base_path), "tuned": str(tuned_path),
    }
    return out
