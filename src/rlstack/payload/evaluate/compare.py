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
from rlstack.payload.evaluate.scoring import EvalError, format_ok, question_identity, read_generations, read_json


def _outcomes(path: Path, data: dict[str, Any], key: str) -> dict[str, bool] | None:
    """A per-question outcome map of a results.json, strictly: question id -> true or false. Anything else (a
    "maybe", 1, null) is an EvalError: a value that is not a boolean is not counted either way."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise EvalError(f"{path}: {key} is not an object of question id -> true/false",
                        "pass a results.json written by rlstack eval")
    bad = [(q, v) for q, v in value.items() if not isinstance(v, bool)]
    if bad:
        q, v = bad[0]
        raise EvalError(f"{path}: {key}[{q!r}] is {json.dumps(v)}, not true or false ({len(bad)} such value(s))",
                        "pass a results.json written by rlstack eval; rescore its generations.jsonl to rebuild it")
    return {str(q): v for q, v in value.items()}


def _generations(path: Path, data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The raw generations saved beside a results.json, when they are there. The results name them by a file name
    (`rlstack eval` writes one); any other value is an EvalError, not a path to look up: a dict's text as a file
    name is too long for the file system, a name with a slash leaves the folder."""
    name = data.get("generations") or "generations.jsonl"
    if not isinstance(name, str) or Path(name).name != name or len(name.encode()) > 255:
        raise EvalError(f"{path}: generations is {json.dumps(name)[:80]}, not the name of a file beside it",
                        "pass a results.json written by rlstack eval (it names its generations.jsonl)")
    gen = Path(path).with_name(name)
    return read_generations(gen) if gen.is_file() else None


def _format_outcomes(path: Path, data: dict[str, Any]) -> dict[str, bool] | None:
    """Per-question format outcomes: recorded by `rlstack eval`, or (results written before it recorded them)
    recomputed from the raw generations saved beside the results; None when neither is there."""
    recorded = _outcomes(path, data, "per_question_format")
    if recorded is not None:
        return recorded
    rows = _generations(path, data)
    return None if rows is None else {r["id"]: format_ok(r["generation"]) for r in rows}


def _identities(path: Path, data: dict[str, Any]) -> dict[str, str] | None:
    """Question id -> what the question is (scoring.question_identity): recorded by `rlstack eval`, or computed
    from the generations beside the results; None for results that have neither."""
    recorded = data.get("per_question_identity")
    if isinstance(recorded, dict) and all(isinstance(v, str) for v in recorded.values()):
        return {str(k): v for k, v in recorded.items()}
    rows = _generations(path, data)
    if rows is None or not all(isinstance(r.get("question"), str) for r in rows):
        return None
    return {r["id"]: question_identity(r["question"], r["reference"]) for r in rows}


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
        data = read_json(p, "results.json")
        if not isinstance(data, dict) or "per_question" not in data:
            raise EvalError(f"{p}: no per_question outcomes (not written by rlstack eval?)",
                            "pass the results.json of an rlstack eval run")
        return data

    base, tuned = load(base_path), load(tuned_path)
    bq, tq = _outcomes(base_path, base, "per_question"), _outcomes(tuned_path, tuned, "per_question")
    assert bq is not None and tq is not None
    common = [q for q in bq if q in tq]
    if not common:
        raise EvalError("the two results share no questions", "evaluate both on the same data, split and -n")
    bi, ti = _identities(base_path, base), _identities(tuned_path, tuned)
    if bi is not None and ti is not None:
        differ = [q for q in common if q in bi and q in ti and bi[q] != ti[q]]
        if differ:
            raise EvalError(
                f"{len(differ)} of the {len(common)} question ids the two results share name different questions "
                f"(e.g. {differ[0]!r}): they were evaluated on different data (two files of one name give the "
                "same ids), so pairing them would compare unrelated answers",
                "evaluate both on the same --data file, split and -n")
    identity = "question text" if bi is not None and ti is not None else "question id only (no question text " \
        "recorded in one of the results)"
    only = len(bq) + len(tq) - 2 * len(common)
    acc = _paired(bq, tq, common, iters=iters, seed=seed)
    out: dict[str, Any] = {
        "n": len(common), "base_correct": acc["base"], "tuned_correct": acc["tuned"],
        "base_accuracy": acc["base_rate"], "tuned_accuracy": acc["tuned_rate"],
        **{k: acc[k] for k in ("delta_points", "bootstrap_95_points", "discordant", "mcnemar_exact_p",
                               "significant_at_0.05")},
        "unpaired_questions": only,
        "paired_by": identity,
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
