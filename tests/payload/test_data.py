"""Data sources: generator, JSONL loading with line-numbered errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.payload.data import DataError, load_problems
from rlstack.payload.data.generator import LEVELS, generate, held_out
from rlstack.payload.data.sources import GENERATED
from rlstack.payload.extract import extract, reference_answer


def test_generator_is_seeded_and_prefix_stable() -> None:
    assert generate(20, seed=3) == generate(20, seed=3)
    assert generate(20, seed=3)[:5] == generate(5, seed=3)
    assert generate(5, seed=3) != generate(5, seed=4)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_generated_answers_are_right(level: str) -> None:
    # Each solution shows its arithmetic; re-evaluate the last equation of every one independently.
    for p in generate(300, seed=0, level=level):
        ref = reference_answer(p.answer)
        assert ref.denominator == 1
        assert p.solution and p.solution.endswith(f"#### {ref.numerator}")
        last_eq = [line for line in p.solution.splitlines() if "=" in line][-1].split("=")[-1]
        assert extract(last_eq).value == ref


@pytest.mark.parametrize("spec", sorted(GENERATED))
def test_held_out_problems_never_occur_in_training(spec: str) -> None:
    """At the sizes a GPU run uses: every held-out question text is absent from the training pool of the same
    spec (before the split was a partition, 75 of the first 256 easy test questions were among 4,000 train ones),
    and an evaluation scores each question once."""
    train = load_problems(f"{spec}:4000", split="train")
    test = load_problems(f"{spec}:512", split="test")
    assert len(train) == 4000 and len(test) == 512
    assert {p.question for p in train}.isdisjoint(p.question for p in test)
    assert len({p.question for p in test}) == 512
    assert all(held_out(p.question) for p in test) and not any(held_out(p.question) for p in train)
    # any split but 'train' is the held-out side; a smaller N is a prefix of a larger one on both sides
    assert load_problems(f"{spec}:64", split="validation", seed=0) == test[:64]
    assert load_problems(f"{spec}:64", split="train") == train[:64]
    assert len(load_problems(f"{spec}:50", n=10)) == 10


def test_held_out_side_is_a_property_of_the_text() -> None:
    """The partition holds across seeds and levels (the same text can be drawn by two levels' templates): a text
    the test side of one seed holds is never drawn for training under another seed or level."""
    test = {p.question for seed in (0, 5) for p in generate(300, seed=seed + 1_000_003, level="easy", side="test")}
    train = {p.question for lvl in ("easy", "two-step", "mixed") for seed in (0, 1, 5)
             for p in generate(1000, seed=seed, level=lvl, side="train")}
    assert test and train and test.isdisjoint(train)
    everything = [p.question for p in generate(2000, seed=0, level="easy")]
    share = sum(map(held_out, everything)) / len(everything)
    assert 0.2 < share < 0.3  # one text in HELD_OUT_SHARE = 4, by hash: the training side keeps most of the space


def test_ids_name_the_same_question_on_every_side() -> None:
    """An id is (level, seed, draw): a side only skips draws, so an id means one text, as before the split
    existed, and results written by older runs never pair an id with another question."""
    every = {p.id: p.question for p in generate(400, seed=1_000_003, level="easy")}
    held = generate(50, seed=1_000_003, level="easy", side="test")
    assert all(every[p.id] == p.question for p in held if p.id in every)


def test_a_used_up_held_out_side_says_so() -> None:
    with pytest.raises(DataError, match="holds about .* distinct problems; 100000 were asked for") as err:
        load_problems("generated-easy:100000", split="test")
    assert err.value.hint and "generated-two-step:N" in err.value.hint


@pytest.mark.parametrize(("spec", "match"), [
    ("generated:many", "'many' is not a count"),
    ("generated:0", "generated:0' asks for 0 problems"),
    ("generated:-5", "'-5' is not a count"),
    ("generated-easy:12abc", "'12abc' is not a count"),
    ("generated:", "'' is not a count"),
    ("generated:1e3", "'1e3' is not a count"),
    ("generated:١٢", "is not a count"),  # Arabic-Indic digits: int() takes them, a spec does not
    ("generated:10000001", "asks for 10,000,001 problems"),
])
def test_bad_generated_count(spec: str, match: str) -> None:
    with pytest.raises(DataError, match=match) as err:
        load_problems(spec)
    assert err.value.hint and "whole number from 1 to 1,000,000" in err.value.hint


def test_bad_generated_spec() -> None:
    with pytest.raises(DataError, match="no such generated set") as err:
        load_problems("generated-hard:5")
    assert err.value.hint and "generated-easy:N" in err.value.hint


def test_two_step_level_is_two_small_steps_with_its_own_ids() -> None:
    two = load_problems("generated-two-step:300", split="test")
    assert len({p.id for p in two}) == 300 and all(p.id.startswith("two-1000003-") for p in two)
    for p in two:
        steps = p.answer.splitlines()[0]
        assert steps.count("=") == 2  # two equations, each recomputed
        for eq in steps.rstrip(".").split(". "):
            lhs, rhs = eq.split(": ")[-1].split(" = ")
            a, op, b = lhs.split()
            assert int(rhs) == {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b),
                                "/": int(a) // int(b)}[op] and (op != "/" or int(a) % int(b) == 0)
        assert 0 < reference_answer(p.answer).numerator <= 40
    assert {p.id for p in load_problems("generated-easy:5", split="test")}.isdisjoint({p.id for p in two})


def test_easy_level_is_one_small_step_with_its_own_ids() -> None:
    easy = load_problems("generated-easy:300", split="test")
    assert len({p.id for p in easy}) == 300 and all(p.id.startswith("easy-1000003-") for p in easy)
    for p in easy:
        ref = reference_answer(p.answer)
        equation = p.answer.splitlines()[0]  # 'a + b = c.' : recompute it
        a, op, b = equation.split(" = ")[0].split()
        assert ref == {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
        assert 0 < ref.numerator <= 25 and ref.denominator == 1
    assert {p.id for p in load_problems("generated:5", split="test")}.isdisjoint({p.id for p in easy})
    assert generate(5, seed=1, level="easy") == generate(8, seed=1, level="easy")[:5]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_jsonl_ok(tmp_path: Path) -> None:
    p = _write(tmp_path, [json.dumps({"question": "q1", "answer": "x\n#### 5"}), "",
                          json.dumps({"question": "q2", "answer": 7, "id": "b"})])
    probs = load_problems(str(p))
    assert [x.id for x in probs] == ["d-1", "b"]
    assert reference_answer(probs[1].answer) == 7


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([], "empty"),
        (['{"question": "q", "answer": "1"}', "{oops"], r"d\.jsonl:2: not valid JSON"),
        (['["a"]'], r":1: expected a JSON object"),
        (['{"question": "q"}'], r":1: missing or non-text field\(s\): answer"),
        (['{"question": "q", "answer": "none"}'], r":1: answer 'none' holds no number"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, lines: list[str], match: str) -> None:
    p = _write(tmp_path, lines) if lines else (tmp_path / "d.jsonl")
    if not lines:
        p.write_text("")
    with pytest.raises(DataError, match=match):
        load_problems(str(p))


def test_missing_file() -> None:
    with pytest.raises(DataError, match="no such data file"):
        load_problems("/nonexistent/x.jsonl")


def test_directory_as_data(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a directory") as err:
        load_problems(str(tmp_path))
    assert err.value.hint and "JSONL file itself" in err.value.hint


def test_binary_file_as_data(tmp_path: Path) -> None:
    p = tmp_path / "model.bin"
    p.write_bytes(json.dumps({"question": "q", "answer": "1"}).encode() + b"\n\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(DataError, match=r"model\.bin:2: not UTF-8 text .*binary file") as err:
        load_problems(str(p))
    assert err.value.hint and "JSONL" in err.value.hint


def test_jsonl_line_with_a_unicode_line_separator(tmp_path: Path) -> None:
    """JSON allows U+2028 raw inside a string; str.splitlines would cut the line there, JSONL does not."""
    p = _write(tmp_path, [json.dumps({"question": "a\u2028b", "answer": "3"}, ensure_ascii=False)])
    assert load_problems(str(p))[0].question == "a\u2028b"


def test_shuffle_is_seeded() -> None:
    a = [p.id for p in load_problems("generated:30", shuffle=True, seed=1)]
    assert a == [p.id for p in load_problems("generated:30", shuffle=True, seed=1)]
    assert a != [p.id for p in load_problems("generated:30")]


def test_non_positive_n() -> None:
    with pytest.raises(DataError):
        load_problems("generated:5", n=0)
