"""Paired comparison of two evaluations (any two results.json written by `rlstack eval` on the same
questions), for both outcomes an answer has: correct or not, and in the trained format ('#### <number>') or not.
For each: the delta with a bootstrap interval, the exact McNemar p-value, and which questions flipped.

Format is compared as seriously as accuracy because it is what GRPO moves first: a small model learns to end
with '#### <number>' long before it learns arithmetic, and a report of accuracy alone calls that "no change".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlstack.payload import stats
from rlstack.payload.evaluate.scoring import EvalError, format_ok


def _format_outcomes(path: Path, data: dict[str, Any]) -> dict[str, bool] | None:
    """Per-question format outcomes: recorded by `rlstack eval`, or (results written before it recorded them)
    recomputed from the raw generations saved beside the results; None when neither is there."""
    if isinstance(data.get("per_question_format"), dict):
        return {str(k): bool(v) for k, v in data["per_question_format"].items()}
    gen = Path(path).with_name(str(data.get("generations") or "generations.jsonl"))
    if not gen.is_file():
        return None
    out: dict[str, bool] = {}
    for line in gen.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[str(row["id"])] = format_ok(str(row["generation"]))
    return out


def _paired(bq: dict[str, bool], tq: dict[str, bool], common: list[str], *, iters: int,
            seed: int) -> dict[str, Any]:
    b = [bool(bq[q]) for q in common]
    t = [bool(tq[q]) for q in common]
    res = stats.paired(b, t, iters=iters, seed=seed)
    return {
        "base": res.base_correct, "tuned": res.tuned_correct,
        "base_rate": res.base_correct / res.n, "tuned_rate": res.tuned_correct / res.n,
        "delta_points": 100 * res.delta, "bootstrap_95_points": [100 * res.ci[0], 100 * res.ci[1]],
        "discordant": {"base_only": res.base_only, "tuned_only": res.tuned_only},
        "mcnemar_exact_p": res.p_value, "significant_at_0.05": res.p_value < 0.05,
        "flips": {"fixed": [q for q in common if tq[q] and not bq[q]],
                  "broken": [q for q in common if bq[q] and not tq[q]]},
    }


def compare(base_path: Path, tuned_path: Path, *, iters: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Paired comparison of two results.json on the questions both scored: accuracy at the top level (the keys
    every consumer reads), the format outcome under "format" (None when a result has no record of it)."""
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
    acc = _paired(bq, tq, common, iters=iters, seed=seed)
    out: dict[str, Any] = {
        "n": len(common), "base_correct": acc["base"], "tuned_correct": acc["tuned"],
        "base_accuracy": acc["base_rate"], "tuned_accuracy": acc["tuned_rate"],
        **{k: acc[k] for k in ("delta_points", "bootstrap_95_points", "discordant", "mcnemar_exact_p",
                               "significant_at_0.05")},
        "unpaired_questions": only,
        "flips": acc["flips"],
        "format": None,
        "base": str(base_path), "tuned": str(tuned_path),
    }
    bf, tf = _format_outcomes(base_path, base), _format_outcomes(tuned_path, tuned)
    if bf is not None and tf is not None and all(q in bf and q in tf for q in common):
        out["format"] = _paired(bf, tf, common, iters=iters, seed=seed)
    return out


def _clause(what: str, d: dict[str, Any]) -> tuple[int, str]:
    """(order, text) for one outcome in the summary: significant changes come first."""
    p = d["mcnemar_exact_p"]
    if not d["significant_at_0.05"]:
        verdict, order = "no significant change", 2
    elif d["delta_points"] > 0:
        verdict, order = "a significant gain", 0
    else:
        verdict, order = "a significant drop", 1
    return order, f"{what.format(tuned=d['tuned'], base=d['base'])} (McNemar p = {p:.2g}, {verdict})"


def summary(c: dict[str, Any], lead: str = "On") -> str:
    """One plain sentence of what changed, from a comparison: the numbers behind it, significant ones first.
    `lead` starts it ("After 10 GRPO steps ..., on")."""
    n = c["n"]
    acc = {**c, "base": c["base_correct"], "tuned": c["tuned_correct"]}
    clauses = [_clause("answers {tuned} instead of {base} correctly", acc)]
    if c.get("format"):
        clauses.append(_clause("ends with a '#### <number>' line on {tuned} instead of {base}", c["format"]))
    parts = [text for _, text in sorted(clauses, key=lambda x: x[0])]
    return f"{lead} {n} held-out problems the tuned model " + " and ".join(parts) + "."
