"""Property tests of what a user's --data reaches: the data spec parser and JSONL loading. Each input gives a
valid result or a DataError (with a hint where the spec's form is wrong), never another exception."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstack.payload.data import DataError, load_problems
from rlstack.payload.data.sources import GENERATED, load_jsonl

FUZZ = settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)

# counts as a user types them: digits, signs, spaces, exponents, unicode digits, or any short text
COUNTS = st.one_of(
    st.integers(-50, 300).map(str),
    st.text(max_size=12),
    st.from_regex(r"\A[ +\-]?[0-9\u0660-\u0669]{0,4}(e[0-9])?[ a-z]?\Z"),
)


@FUZZ
@given(
    family=st.sampled_from([*GENERATED, "generated-hard", "generatedeasy"]),
    sep=st.sampled_from([":", ""]),
    count=COUNTS,
    split=st.sampled_from(["train", "test"]),
    n=st.one_of(st.none(), st.integers(-3, 40)),
)
def test_generated_spec_is_a_result_or_a_data_error(
    family: str, sep: str, count: str, split: str, n: int | None
) -> None:
    spec = f"{family}{sep}{count}"
    try:
        problems = load_problems(spec, split=split, n=n)
    except DataError as exc:
        assert exc.hint, f"{spec!r}: {exc.message} has no hint"
        return
    assert problems and all(p.question and p.answer.rsplit("#### ", 1)[-1].lstrip("-").isdigit() for p in problems)
    if sep:
        asked = int(count.strip())
        assert len(problems) == min(asked, n) if n is not None else len(problems) == asked


@FUZZ
@given(data=st.binary(max_size=300))
def test_any_bytes_as_a_data_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    try:
        problems = load_jsonl(path)
    except DataError as exc:
        assert str(path) in exc.message
        return
    assert problems and all(isinstance(p.question, str) for p in problems)


@FUZZ
@given(
    rows=st.lists(
        st.one_of(
            st.dictionaries(
                st.sampled_from(["question", "answer", "id", "solution"]),
                st.one_of(
                    st.text(max_size=12),
                    st.integers(),
                    st.floats(),
                    st.none(),
                    st.booleans(),
                    st.lists(st.integers(), max_size=2),
                ),
                max_size=4,
            ).map(json.dumps),
            st.sampled_from(["[" * 5000, "1" * 5000, "{}", "null", '"x"', "\x00", "\ufeff{}"]),
        ),
        max_size=4,
    )
)
def test_any_jsonl_rows(tmp_path: Path, rows: list[str]) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(rows), encoding="utf-8")
    try:
        problems = load_jsonl(path)
    except DataError as exc:
        assert str(path) in exc.message
        return
    assert len(problems) <= len(rows)


@pytest.mark.parametrize("text", ["[" * 100_000, "9" * 5000])
def test_json_the_parser_refuses_beyond_its_limits(tmp_path: Path, text: str) -> None:
    """Nesting past the recursion limit and integers past Python's digit limit: json raises RecursionError or a
    bare ValueError, not JSONDecodeError; both are the line's error."""
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    with pytest.raises(DataError, match=r"d\.jsonl:1: not valid JSON"):
        load_jsonl(path)
