"""Loading problems by spec: 'gsm8k' (openai/gsm8k via `datasets`), 'generated:N' / 'generated-easy:N' (see
data.generator for the two levels), or a JSONL path.

A JSONL row needs `question` and `answer` (the answer may be a full GSM8K solution or the bare number); an `id`
is optional. Bad rows are refused with the line number, never skipped, so a typo cannot shrink an evaluation.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from rlstack.core.errors import RlstackError
from rlstack.payload.data import generator
from rlstack.payload.data.problems import Problem
from rlstack.payload.extract import reference_answer

GSM8K_REPO = "openai/gsm8k"
GENERATED = {"generated": "mixed", "generated-easy": "easy"}  # data spec name -> generator level


class DataError(RlstackError):
    pass


def load_jsonl(path: Path) -> list[Problem]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such data file", "pass --data PATH.jsonl, 'gsm8k' or 'generated:N'")
    out: list[Problem] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object with 'question' and 'answer'")
            missing = [k for k in ("question", "answer") if not isinstance(row.get(k), str | int | float)]
            if missing:
                raise DataError(f"{path}:{lineno}: missing or non-text field(s): {', '.join(missing)}")
            answer = str(row["answer"])
            try:
                reference_answer(answer)
            except ValueError:
                raise DataError(f"{path}:{lineno}: answer {answer[-60:]!r} holds no number") from None
            out.append(Problem(id=str(row.get("id", f"{path.stem}-{lineno}")), question=str(row["question"]),
                               answer=answer, solution=row.get("solution") if isinstance(row.get("solution"), str)
                               else None))
    if not out:
        raise DataError(f"{path}: no problems in the file (it is empty)")
    return out


def load_gsm8k(split: str) -> list[Problem]:
    """openai/gsm8k 'main' through `datasets` (cached in HF_HOME, the hf-cache volume in containers)."""
    try:
        import datasets
    except ImportError:
        raise DataError("the 'datasets' package is not installed", "use --data generated:N or a JSONL") from None
    try:
        ds = datasets.load_dataset(GSM8K_REPO, "main", split=split)
    except Exception as exc:
        raise DataError(
            f"could not load {GSM8K_REPO} ({split}): {type(exc).__name__}: {str(exc)[:300]}",
            "offline? use --data PATH.jsonl or --data generated:N",
        ) from None
    return [Problem(id=f"gsm8k-{split}-{i}", question=r["question"], answer=r["answer"]) for i, r in enumerate(ds)]


def load_problems(spec: str, split: str = "train", n: int | None = None, seed: int = 0,
                  shuffle: bool = False) -> list[Problem]:
    """Problems from `spec`; the first n after an optional seeded shuffle (fixed order for evaluation)."""
    family, _, count = spec.partition(":")
    if family in GENERATED:
        try:
            total = int(count) if count else (n or 1000)
        except ValueError:
            raise DataError(f"data spec {spec!r}: expected {family}:N with N a number") from None
        # Train and test draw from disjoint seeds so an evaluation never scores training problems.
        problems = generator.generate(total, seed=seed + (0 if split == "train" else 1_000_003),
                                      level=GENERATED[family])
    elif family.startswith("generated") and not Path(spec).exists():
        raise DataError(f"data spec {spec!r}: no such generated set",
                        f"use one of: {', '.join(f'{name}:N' for name in GENERATED)}")
    elif spec in ("gsm8k", GSM8K_REPO):
        problems = load_gsm8k(split)
    else:
        problems = load_jsonl(Path(spec))
    if shuffle:
        problems = problems[:]
        random.Random(seed).shuffle(problems)
    if n is not None:
        if n <= 0:
            raise DataError(f"asked for {n} problems", "use a positive -n")
        problems = problems[:n]
    return problems
