"""Scoring generations: the answer each generation gives (the extractor), accuracy with its Wilson interval and
the format rate; `rescore` applies today's extractor to a saved generations.jsonl, no model needed."""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlstack import __version__
from rlstack.core.errors import RlstackError
from rlstack.core.fileio import check_output_file, write_atomic
from rlstack.payload import stats
from rlstack.payload.extract import extract, format_fraction, reference_answer
from rlstack.payload.rewards import format_score


class EvalError(RlstackError):
    pass


def format_ok(generation: str) -> bool:
    """The format outcome of one answer: a complete '#### <number>' line (the format reward's full 1.0). A
    yes/no per question, so a base and a tuned run pair up on it exactly as they do on correctness."""
    return format_score(generation) == 1.0


def question_identity(question: str, reference: str) -> str:
    """What a question is, whatever its id: two files of problems can give different questions the same id (ids
    default to '<file stem>-<line>'), so a comparison pairs ids only where this digest agrees too."""
    return hashlib.sha256(f"{question}\n{reference}".encode()).hexdigest()[:16]


def read_json(path: Path, what: str) -> Any:
    """A JSON file a user passed (results.json): an EvalError that names it when it cannot be read, is not UTF-8
    text (a binary file) or not JSON."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"))
    except IsADirectoryError:
        raise EvalError(f"{path}: is a directory, not {what}", f"pass the {what} file inside it") from None
    except OSError as exc:
        raise EvalError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise EvalError(f"{path}: not {what}: not JSON text ({str(exc)[:120]})",
                        f"pass the {what} written by rlstack eval") from None


def read_generations(path: Path) -> list[dict[str, Any]]:
    """The rows of a generations.jsonl (rlstack eval's raw output): each a JSON object with a text `generation`
    and `reference`, an `id` (text or number, kept as text) and, when recorded, the `question`. Anything else is
    an EvalError naming the line, never a traceback."""
    path = Path(path)
    if path.is_dir():
        raise EvalError(f"{path}: is a directory, not a generations file", "pass the generations.jsonl inside it")
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise EvalError(f"{path}: no such generations file", "pass a generations.jsonl written by rlstack eval") \
            from None
    except OSError as exc:
        raise EvalError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise EvalError(f"{path}: not a generations file: not UTF-8 text (a binary file?)",
                        "pass a generations.jsonl written by rlstack eval") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise EvalError(f"{path}:{lineno}: not a JSON row ({str(exc)[:80]})") from None
        if not isinstance(row, dict):
            raise EvalError(f"{path}:{lineno}: not a generation row (expected a JSON object)")
        bad = [k for k in ("generation", "reference") if not isinstance(row.get(k), str)]
        if not isinstance(row.get("id"), str | int) or isinstance(row.get("id"), bool):
            bad.insert(0, "id")
        if "question" in row and not isinstance(row["question"], str):
            bad.append("question")
        if bad:
            raise EvalError(f"{path}:{lineno}: not a generation row (missing or not text: {', '.join(bad)})")
        rows.append({**row, "id": str(row["id"])})
    return rows


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy with its Wilson interval, how answers were found, and the format rate, from generation rows
    (re-extracting each). Both outcomes are kept per question, for the paired comparison."""
    n = len(rows)
    if n == 0:
        raise EvalError("no generations to score")
    methods: dict[str, int] = {"marker": 0, "boxed": 0, "last_number": 0, "none": 0}
    per_question: dict[str, bool] = {}
    per_question_format: dict[str, bool] = {}
    identity: dict[str, str] = {}
    for r in rows:
        ex = extract(r["generation"])
        r["extracted"] = format_fraction(ex.value)
        r["method"] = ex.method
        try:
            reference = reference_answer(r["reference"])
        except ValueError:
            raise EvalError(f"question {r['id']}: its reference answer {str(r['reference'])[-60:]!r} holds no number",
                            "re-run rlstack eval on data whose answers are numbers") from None
        r["correct"] = ex.value is not None and ex.value == reference
        r["format_ok"] = format_ok(r["generation"])
        methods[ex.method or "none"] += 1
        per_question[r["id"]] = r["correct"]
        per_question_format[r["id"]] = r["format_ok"]
        if isinstance(r.get("question"), str):
            identity[r["id"]] = question_identity(r["question"], str(r["reference"]))
    k = sum(per_question.values())
    lo, hi = stats.wilson(k, n)
    fmt = sum(format_score(r["generation"]) for r in rows) / n
    f = sum(per_question_format.values())
    return {"n": n, "correct": k, "accuracy": k / n, "wilson_95": [lo, hi], "answer_found_by": methods,
            "format_reward_mean": fmt, "format_ok": f, "format_rate": f / n,
            "format_wilson_95": list(stats.wilson(f, n)),
            "per_question": per_question, "per_question_format": per_question_format,
            **({"per_question_identity": identity} if len(identity) == len(per_question) else {})}


def rescore(generations: Path, output: Path | None = None) -> dict[str, Any]:
    """Re-extract and re-score a generations.jsonl with the current extractor (no model needed)."""
    generations = Path(generations)
    out = check_output_file(output or generations.with_name("results.rescored.json"), "--output")
    rows = read_generations(generations)
    scored = score(rows)
    prior_path = generations.with_name("results.json")
    prior = read_json(prior_path, "results.json") if prior_path.is_file() else {}
    if not isinstance(prior, dict):
        raise EvalError(f"{prior_path}: not results.json (expected a JSON object)")
    result = {**prior, **{k: v for k, v in scored.items()}, "rescored": datetime.now(UTC).isoformat(timespec="seconds"),
              "rescored_with": __version__}
    write_atomic(out, json.dumps(result, indent=2) + "\n")  # a full disk leaves the old file, never half of one
    print(f"rlstack rescore: accuracy {result['accuracy']:.4f} ({result['correct']}/{result['n']}) -> {out}",
          file=sys.stderr)
    return result
