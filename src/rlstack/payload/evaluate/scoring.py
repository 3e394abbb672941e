"""Scoring generations: the answer each generation gives (the extractor), accuracy with its Wilson interval and
the format rate; `rescore` applies today's extractor to a saved generations.jsonl, no model needed."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlstack import __version__
from rlstack.core.errors import RlstackError
from rlstack.payload import stats
from rlstack.payload.extract import extract, format_fraction, reference_answer
from rlstack.payload.rewards import format_score


class EvalError(RlstackError):
    pass


def format_ok(generation: str) -> bool:
    """The format outcome of one answer: a complete '#### <number>' line (the format reward's full 1.0). A
    yes/no per question, so a base and a tuned run pair up on it exactly as they do on correctness."""
    return format_score(generation) == 1.0


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy with its Wilson interval, how answers were found, and the format rate, from generation rows
    (re-extracting each). Both outcomes are kept per question, for the paired comparison."""
    n = len(rows)
    if n == 0:
        raise EvalError("no generations to score")
    methods: dict[str, int] = {"marker": 0, "boxed": 0, "last_number": 0, "none": 0}
    per_question: dict[str, bool] = {}
    per_question_format: dict[str, bool] = {}
    for r in rows:
        ex = extract(r["generation"])
        r["extracted"] = format_fraction(ex.value)
        r["method"] = ex.method
        r["correct"] = ex.value is not None and ex.value == reference_answer(r["reference"])
        r["format_ok"] = format_ok(r["generation"])
        methods[ex.method or "none"] += 1
        per_question[r["id"]] = r["correct"]
        per_question_format[r["id"]] = r["format_ok"]
    k = sum(per_question.values())
    lo, hi = stats.wilson(k, n)
    fmt = sum(format_score(r["generation"]) for r in rows) / n
    f = sum(per_question_format.values())
    return {"n": n, "correct": k, "accuracy": k / n, "wilson_95": [lo, hi], "answer_found_by": methods,
            "format_reward_mean": fmt, "format_ok": f, "format_rate": f / n,
            "format_wilson_95": list(stats.wilson(f, n)),
            "per_question": per_question, "per_question_format": per_question_format}


def rescore(generations: Path, output: Path | None = None) -> dict[str, Any]:
    """Re-extract and re-score a generations.jsonl with the current extractor (no model needed)."""
    generations = Path(generations)
    if not generations.is_file():
        raise EvalError(f"{generations}: no such generations file")
    rows = []
    for lineno, line in enumerate(generations.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            _ = row["id"], row["generation"], row["reference"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise EvalError(f"{generations}:{lineno}: not a generation row ({exc})") from None
        rows.append(row)
    scored = score(rows)
    prior_path = generations.with_name("results.json")
    prior = json.loads(prior_path.read_text()) if prior_path.is_file() else {}
    result = {**prior, **{k: v for k, v in scored.items()}, "rescored": datetime.now(UTC).isoformat(timespec="seconds"),
              "rescored_with": __version__}
    out = output or generations.with_name("results.rescored.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"rlstack rescore: accuracy {result['accuracy']:.4f} ({result['correct']}/{result['n']}) -> {out}",
          file=sys.stderr)
    return result
