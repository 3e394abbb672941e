"""results.json scoring, rescoring and paired comparison (no model needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.payload.commands import format_compare
from rlstack.payload.evaluate import scoring
from rlstack.payload.evaluate.compare import compare, summary
from rlstack.payload.evaluate.scoring import EvalError


def _rows(outcomes: list[bool]) -> list[dict[str, object]]:
    return [{"id": f"q{i}", "question": "?", "reference": "#### 10",
             "generation": "so #### 10" if ok else "#### 11"} for i, ok in enumerate(outcomes)]


def _results(tmp_path: Path, name: str, outcomes: list[bool]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    rows = _rows(outcomes)
    (folder / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scored = scoring.score(rows)
    (folder / "results.json").write_text(json.dumps(scored))
    return folder / "results.json"


def test_score_counts_and_methods() -> None:
    rows = [*_rows([True, False, True]), {"id": "x", "question": "?", "reference": "10", "generation": "\\boxed{10}"}]
    s = scoring.score(rows)
    assert (s["n"], s["correct"]) == (4, 3)
    assert s["answer_found_by"] == {"marker": 3, "boxed": 1, "last_number": 0, "none": 0}
    assert s["per_question"] == {"q0": True, "q1": False, "q2": True, "x": True}
    assert s["format_reward_mean"] == pytest.approx(0.75)


def test_compare_paired(tmp_path: Path) -> None:
    base = _results(tmp_path, "b", [True, True, False, False, False, True])
    tuned = _results(tmp_path, "t", [True, False, True, True, True, True])
    c = compare(base, tuned, iters=500)
    assert c["n"] == 6 and c["discordant"] == {"base_only": 1, "tuned_only": 3}
    assert c["delta_points"] == pytest.approx(100 * 2 / 6)
    assert c["mcnemar_exact_p"] == pytest.approx(2 * 5 / 16)  # b+c=4, P(X<=1)=5/16
    assert c["flips"] == {"fixed": ["q2", "q3", "q4"], "broken": ["q1"]}


def test_compare_needs_shared_questions(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"per_question": {"x": True}}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"per_question": {"y": True}}))
    with pytest.raises(EvalError, match="share no questions"):
        compare(a, b)
    c = tmp_path / "c.json"
    c.write_text("{}")
    with pytest.raises(EvalError, match="per_question"):
        compare(a, c)


def test_rescore_uses_current_extractor(tmp_path: Path) -> None:
    res = _results(tmp_path, "r", [True, False])
    gen = res.with_name("generations.jsonl")
    rows = [json.loads(x) for x in gen.read_text().splitlines()]
    rows[1]["generation"] = "#### $10.00"  # a completion the extractor must read as 10
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = scoring.rescore(gen)
    assert out["correct"] == 2
    assert json.loads(res.with_name("results.rescored.json").read_text())["correct"] == 2


def test_rescore_output_that_is_a_folder_is_refused_before_reading(tmp_path: Path) -> None:
    """`rescore G --output DIR` was an IsADirectoryError traceback after the scoring."""
    from rlstack.core.fileio import FolderError

    gen = _results(tmp_path, "r", [True]).with_name("generations.jsonl")
    with pytest.raises(FolderError, match="--output .* is a folder, not a file"):
        scoring.rescore(gen, tmp_path)


def test_rescore_bad_line(tmp_path: Path) -> None:
    p = tmp_path / "g.jsonl"
    p.write_text('{"id": "a", "generation": "x", "reference": "1"}\n{"id": 1}\n')
    with pytest.raises(EvalError, match=r"g\.jsonl:2"):
        scoring.rescore(p)


def _results_with(tmp_path: Path, name: str, gens: list[str]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    rows = [{"id": f"q{i}", "question": "?", "reference": "#### 10", "generation": g} for i, g in enumerate(gens)]
    (folder / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "results.json").write_text(json.dumps(scoring.score(rows)))
    return folder / "results.json"


def test_format_is_a_paired_outcome(tmp_path: Path) -> None:
    # Base: right numbers, no marker line. Tuned: the same answers in the trained format, one of them wrong.
    base = _results_with(tmp_path, "b", ["it is 10"] * 8)
    tuned = _results_with(tmp_path, "t", ["so\n#### 10"] * 7 + ["#### 11"])
    s = json.loads(base.read_text())
    assert (s["format_ok"], s["format_rate"]) == (0, 0.0) and s["per_question_format"]["q0"] is False
    c = compare(base, tuned, iters=500)
    assert (c["base_correct"], c["tuned_correct"]) == (8, 7)
    f = c["format"]
    assert (f["base"], f["tuned"], f["discordant"]) == (0, 8, {"base_only": 0, "tuned_only": 8})
    assert f["mcnemar_exact_p"] == pytest.approx(2 / 2**8) and f["significant_at_0.05"]
    assert f["delta_points"] == pytest.approx(100.0) and f["flips"]["broken"] == []

    sentence = summary(c)
    assert sentence == ("On 8 held-out problems the tuned model ends with a '#### <number>' line on 8 instead of 0 "
                        "(McNemar p = 0.0078, a significant gain) and answers 7 instead of 8 correctly "
                        "(McNemar p = 1, no significant change).")
    text = format_compare(c)
    lines = text.splitlines()
    assert lines[-1] == sentence
    assert any(ln.startswith("accuracy") and "100.00% (8/8)" in ln and "87.50% (7/8)" in ln for ln in lines)
    assert any(ln.startswith("format") and "0.00% (0/8)" in ln and "p = 0.007812 (significant" in ln for ln in lines)
    assert "broken (accuracy): q7" in text
    assert "broken (accuracy)" not in format_compare(c, flips=False)


def test_format_of_older_results_comes_from_their_generations(tmp_path: Path) -> None:
    base = _results_with(tmp_path, "b", ["10"] * 3)
    tuned = _results_with(tmp_path, "t", ["#### 10"] * 3)
    for p in (base, tuned):  # as `rlstack eval` wrote them before it kept the format per question
        data = json.loads(p.read_text())
        del data["per_question_format"]
        p.write_text(json.dumps(data))
    assert compare(base, tuned, iters=100)["format"]["tuned"] == 3
    tuned.with_name("generations.jsonl").unlink()
    c = compare(base, tuned, iters=100)
    assert c["format"] is None and "format: not recorded" in format_compare(c)
    assert "line on" not in summary(c)


def _eval_of(tmp_path: Path, name: str, questions: list[str], *, record_identity: bool = True) -> Path:
    """results.json and generations.jsonl as `rlstack eval` writes them for problems from a file test.jsonl: the
    ids are '<file stem>-<line>', whatever folder the file was in."""
    folder = tmp_path / name
    folder.mkdir()
    rows = [{"id": f"test-{i}", "question": q, "reference": "#### 10", "generation": "#### 10"}
            for i, q in enumerate(questions, 1)]
    (folder / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scored = scoring.score(rows)
    if not record_identity:
        del scored["per_question_identity"]
    (folder / "results.json").write_text(json.dumps(scored))
    return folder / "results.json"


@pytest.mark.parametrize("recorded", [True, False])
def test_compare_refuses_different_questions_under_one_id(tmp_path: Path, recorded: bool) -> None:
    base = _eval_of(tmp_path, "b", ["What is 2+8?", "What is 5+5?"], record_identity=recorded)
    tuned = _eval_of(tmp_path, "t", ["What is 3+7?", "What is 5+5?"], record_identity=recorded)
    with pytest.raises(EvalError, match="1 of the 2 question ids .* name different questions") as exc:
        compare(base, tuned, iters=10)
    assert "same --data" in str(exc.value.hint)
    same = _eval_of(tmp_path, "s", ["What is 2+8?", "What is 5+5?"], record_identity=recorded)
    assert compare(base, same, iters=10)["paired_by"] == "question text"


@pytest.mark.parametrize("value", ["maybe", 1, None, "true", [True]])
def test_compare_counts_only_true_or_false(tmp_path: Path, value: object) -> None:
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"per_question": {"x": True, "y": False}}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"per_question": {"x": value, "y": False}}))
    with pytest.raises(EvalError, match=r"per_question\['x'\] is .*not true or false"):
        compare(a, b, iters=10)


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00binary", b"[1, 2]", b'"per_question"', b"[" * 100_000])
def test_compare_garbage_results_are_clear_errors(tmp_path: Path, content: bytes) -> None:
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"per_question": {"x": True}}))
    b = tmp_path / "b.json"
    b.write_bytes(content)
    with pytest.raises(EvalError, match="b.json"):
        compare(a, b, iters=10)
    with pytest.raises(EvalError, match="is a directory"):
        compare(a, tmp_path, iters=10)


def test_rescore_binary_generations_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "generations.jsonl"
    p.write_bytes(b"\xff\xd8\xff\xe0 not text \x00")
    with pytest.raises(EvalError, match="not UTF-8 text"):
        scoring.rescore(p)
    p.write_text('{"id": "a", "generation": "x", "reference": "no number here"}\n')
    with pytest.raises(EvalError, match="holds no number"):
        scoring.rescore(p)


@pytest.mark.parametrize("value", [{"a": None}, ["g.jsonl"], "../elsewhere.jsonl", "x" * 300])
def test_compare_refuses_a_generations_field_that_is_no_file_name(tmp_path: Path, value: object) -> None:
    """Found by test_fuzz_parsers: a dict there became a file name too long to stat, and the comparison ended in an
    OSError traceback."""
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"per_question": {"x": True}}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"per_question": {"x": False}, "generations": value}))
    with pytest.raises(EvalError, match="not the name of a file beside it"):
        compare(a, b, iters=10)
