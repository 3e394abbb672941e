"""Loading problems by spec: 'gsm8k' (openai/gsm8k via `datasets`), 'generated:N', 'generated-easy:N' or
'generated-two-step:N' (see data.generator for the levels), or a JSONL path.

A generated spec's split picks a side of the generator's partition of question texts ('train' the training side,
any other split the held-out side), so no evaluation ever scores a problem its training pool of the same spec
holds, at any N.

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
# data spec name -> generator level
GENERATED = {"generated": "mixed", "generated-easy": "easy", "generated-two-step": "two-step"}
# A bound on N: the generator draws one problem at a time, and a typo such as generated:10000000000 would otherwise
# run until memory runs out instead of failing.
MAX_GENERATED = 1_000_000
TEST_SEED_OFFSET = 1_000_003  # the test side's draws use their own seed, so its ids never look like train ids


class DataError(RlstackError):
    pass


def _read_text(path: Path) -> str:
    """The file as UTF-8 text, or a DataError that names what is wrong with it (a folder, unreadable, binary)."""
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a data file",
                        "pass the JSONL file itself (--data DIR/problems.jsonl), 'gsm8k' or 'generated:N'")
    if not path.is_file():
        raise DataError(f"{path}: no such data file", "pass --data PATH.jsonl, 'gsm8k' or 'generated:N'")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror or exc})", "check the file's permissions") from None
    try:
        return raw.decode("utf-8-sig")  # a byte-order mark, as some editors write one, is not part of line 1
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); "
                        "is it a binary file?", "data files are JSONL: one JSON object per line, UTF-8") from None


def load_jsonl(path: Path) -> list[Problem]:
    path = Path(path)
    out: list[Problem] = []
    for lineno, line in enumerate(_read_text(path).split("\n"), 1):  # JSONL: lines end in \n only
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # an integer too long to convert, arrays nested too deep
            raise DataError(f"{path}:{lineno}: not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
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


def generated_count(spec: str, n: int | None) -> int:
    """N of a 'generated...:N' spec (bare 'generated' takes n, else 1000): a positive whole number up to
    MAX_GENERATED, written in ASCII digits, or a DataError that shows the form."""
    family, sep, count = spec.partition(":")
    if not sep:
        return n or 1000
    form = f"expected {family}:N with N a whole number from 1 to {MAX_GENERATED:,}, e.g. {family}:256"
    text = count.strip()
    if not (text.isascii() and text.isdigit()):
        shown_count = count if len(count) <= 40 else count[:40] + "..."
        raise DataError(f"data spec {spec[:80]!r}: {shown_count!r} is not a count", form)
    total = int(text)
    if not 0 < total <= MAX_GENERATED:
        raise DataError(f"data spec {spec!r} asks for {total:,} problems", form)
    return total


def load_problems(spec: str, split: str = "train", n: int | None = None, seed: int = 0,
                  shuffle: bool = False) -> list[Problem]:
    """Problems from `spec`; the first n after an optional seeded shuffle (fixed order for evaluation)."""
    if n is not None and n <= 0:
        raise DataError(f"asked for {n} problems", "use a positive -n")
    family = spec.partition(":")[0]
    if family in GENERATED:
        total = generated_count(spec, n)
        side: generator.Side = "train" if split == "train" else "test"
        try:
            problems = generator.generate(total, seed=seed + (0 if side == "train" else TEST_SEED_OFFSET),
                                          level=GENERATED[family], side=side)
        except generator.LevelExhausted as exc:
            raise DataError(f"data spec {spec!r}: {exc}", "ask for fewer held-out problems, or use a level "
                            f"with a larger space: {', '.join(f'{name}:N' for name in GENERATED)}") from None
    elif family.startswith("generated") and not Path(spec).exists():
        raise DataError(f"data spec {spec[:80]!r}: no such generated set",
                        f"use one of: {', '.join(f'{name}:N' for name in GENERATED)}")
    elif spec in ("gsm8k", GSM8K_REPO):
        problems = load_gsm8k(split)
    else:
        problems = load_jsonl(Path(spec))
    if shuffle:
        problems = problems[:]
        random.Random(seed).shuffle(problems)
    if n is not None:
        problems = problems[:n]
    return problems
