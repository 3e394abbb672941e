from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlstack.core.errors import RlstackError
from rlstack.host import commands, docs

ROOT = Path(__file__).resolve().parents[2]


def test_readme_sections_and_pages_are_current() -> None:
    """What `invoke docs --check` checks, so the test suite (CI's command) fails on a stale table or page."""
    assert set(commands.readme_sections()) == {"stacks", "learning", "results", "tasks", "compat-matrix"}
    assert docs.stale_sections(commands.readme_sections()) == [], "run: invoke docs"
    assert docs.stale_pages() == [], "run: invoke docs"


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?", text))


def _rendered_values(value: object) -> set[str]:
    """Every number the renderer can print from one results file: each scalar as `fmt` prints it, and the
    numbers inside its strings (dates, commands, titles)."""
    if isinstance(value, dict):
        return set().union(*(_rendered_values(v) for v in [*value.keys(), *value.values()])) if value else set()
    if isinstance(value, list):
        return set().union(*(_rendered_values(v) for v in value)) if value else set()
    return _numbers(docs.fmt(value)) | _numbers(str(value))


def test_no_hand_typed_number_between_the_results_markers_or_in_the_performance_page() -> None:
    """Every number in the README's results section and in docs/performance.md comes from a bench/results file
    (a value, a ratio of two of them, or text the file holds); a number typed in by hand fails here."""
    from rlstack.core import results

    loaded = results.load_all()
    known = set().union(*(_rendered_values(r.model_dump(mode="json")) for _, r in loaded))
    for _, r in loaded:
        known |= {f"{x:.2f}" for x in (r.ratio(row) for row in r.rows) if x is not None}
    readme = (ROOT / "README.md").read_text()
    section = readme.split("<!-- results:start -->")[1].split("<!-- results:end -->")[0]
    page = (ROOT / "docs" / "performance.md").read_text()
    for name, text in [("README results section", section), ("docs/performance.md", page)]:
        typed = _numbers(text) - known
        assert not typed, f"{name} has numbers no bench/results file holds: {sorted(typed)}"
    assert _numbers(section) and "bench/results/" in section  # the section is rendered, not empty
    assert docs.results_section() in readme  # and is exactly what the JSON renders


def test_a_hand_edit_of_the_results_table_is_stale(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    readme.write_text(text.replace("| what | measured |", "| what | measured |\n| typed | 9,999 | 2x | x | x |"))
    assert docs.stale_sections({"results": docs.results_section}, readme) == ["results"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "performance.md").write_text(docs.performance_page() + "\n1.5x faster\n")
    assert docs.stale_pages(tmp_path) == ["docs/performance.md"]


def test_the_task_table_shows_real_defaults_and_the_namespaces() -> None:
    table = commands.tasks_section()
    assert "None" not in table
    assert "`invoke train [--stack cpu]`" in table and "`invoke stacks [--stack STACK]`" in table
    assert "`invoke ci.probe-job --stack STACK`" in table and "`invoke dev.lint`" in table
    assert "`invoke shell [--stack cpu] [-- CMD]`" in table and "`invoke diagnose LOG`" in table
    assert "`invoke bench NAME`" in table and "[--stack None]" not in (ROOT / "README.md").read_text()


def test_invoke_bench_help_lists_every_benchmark_the_results_quote() -> None:
    """Each results file names the benchmark that wrote it; `invoke bench --help` lists each, and the script is
    there to run."""
    import subprocess
    import sys

    from rlstack.core import results
    from rlstack.host.devtools import BENCHMARKS

    quoted = {r.ran.bench for _, r in results.load_all()}
    assert quoted <= set(BENCHMARKS), f"results from benchmarks invoke bench does not list: {quoted - set(BENCHMARKS)}"
    assert all((ROOT / "bench" / f"{name}.py").is_file() for name in BENCHMARKS)
    out = subprocess.run(
        [sys.executable, "-m", "invoke", "--help", "bench"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert all(name in out for name in BENCHMARKS), out


def test_an_unknown_benchmark_names_the_known_ones() -> None:
    from rlstack.host import devtools

    with pytest.raises(RlstackError, match="rollout_peers"):
        devtools.bench("nope")


def test_replace_section_only_between_markers() -> None:
    text = "a\n<!-- x:start -->\nold\n<!-- x:end -->\nb\n"
    assert docs.replace_section(text, "x", "new") == "a\n<!-- x:start -->\nnew\n<!-- x:end -->\nb\n"


def test_missing_markers_say_what_to_add() -> None:
    with pytest.raises(RlstackError, match="x:start"):
        docs.replace_section("no markers", "x", "body")


def test_no_link_leaves_the_repository() -> None:
    """A user's clone has only the repository: every relative link in the README and docs/ resolves inside
    it (the report is cited by name and its facts are in docs/report.md)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(root) and resolved.exists(), f"{page.name} links {target}"


def test_learning_table_shows_a_finished_run_and_why_another_stopped(tmp_path: Path) -> None:
    """One row per learning record: a finished one with its base -> tuned and p, one whose training failed with the
    base it measured and the wall a signature names in its last lines."""
    from rlstack.core import results
    from rlstack.host import docs_learning

    columns = ["stack", "path", "steps", "s_per_step", "n", "base_correct", "tuned_correct", "p"]

    def record(name: str, rows: list[dict[str, object]], extra: dict[str, object]) -> None:
        results.write(results.Result(
            question="learning", title=name, ran=results.Ran(command="python3 bench/learning.py", bench="learning",
                                                             stack="portable", engine="own"),
            where=results.Where(gpu="NVIDIA H100", environment="image rlstack/portable:abc"),
            date="2026-12-06T09:00:00Z", columns=columns, rows=rows, extra=extra), name, tmp_path)

    record("learning-done", [{"stack": "portable", "path": "unsloth, fastgen", "steps": 80, "s_per_step": 0.5,
                              "n": 256, "base_correct": 31, "tuned_correct": 200, "p": 1e-9}],
           {"status": "done", "recipe": {"eval": {"data": "generated-two-step:256"}, "grpo": {"seed": 0}}})
    record("learning-seed2", [{"stack": "portable", "path": "unsloth, fastgen", "steps": 80, "n": 256,
                               "base_correct": 31, "tuned_correct": 190, "p": 1e-8}],
           {"status": "done", "recipe": {"grpo": {"seed": 2}}})
    record("learning-failed", [], {"status": "failed in train (rc 1)", "base": {"n": 256, "correct": 31},
                                   "train": {"loader": "unsloth", "log_tail": [
                                       "torch._inductor.exc.InductorError: ModuleNotFoundError: No module named "
                                       "'setuptools'"]}})
    (tmp_path / "learning-done.png").write_bytes(b"png")
    table = docs_learning.learning_rows(tmp_path)
    assert [str(r[-1]) for r in table][2] == "[learning-failed.json](bench/results/learning-failed.json)"
    rows = {str(r[-1]): r for r in table}
    done = rows["[learning-done.json](bench/results/learning-done.json)"]
    assert done[:8] == ["portable", "unsloth, fastgen", "bf16", "generated-two-step", 80, 0.5, "31/256 -> 200/256",
                        "1e-09"]
    assert done[8] == "done" and done[10] == "[png](bench/results/learning-done.png)"
    assert rows["[learning-seed2.json](bench/results/learning-seed2.json)"][1] == "unsloth, fastgen, seed 2"
    assert docs_learning._with_seed("unsloth, fastgen rollouts: killed (SIGTERM) during train, see status",
                                    {"recipe": {"grpo": {"seed": 2}}}) == \
        "unsloth, fastgen rollouts, seed 2: killed (SIGTERM) during train, see status"
    failed = rows["[learning-failed.json](bench/results/learning-failed.json)"]
    assert failed[1] == "unsloth, own rollouts" and failed[3] == "-" and failed[6] == "31/256 -> -/256"
    assert failed[10] == "-" and failed[8] == "failed in train (rc 1): torch-compile-no-setuptools"


def test_learning_table_names_the_weights_trained_and_scored() -> None:
    """Two runs of one path differ by the base's precision: the row says which, and where training and the
    evaluations part (the fp8 path trains in FP8 and scores the bf16 base)."""
    from rlstack.host import docs_learning

    def extra(model: dict[str, object], loader: str, scored: dict[str, object]) -> dict[str, object]:
        return {"recipe": {"model": model}, "train": {"loader": loader}, "base": {"config": scored}}

    four = {"load_in_4bit": True, "load_in_fp8": False}
    assert docs_learning._weights(extra(four, "unsloth", four)) == "4-bit"
    assert docs_learning._weights(extra({"load_in_4bit": False}, "unsloth", {"load_in_4bit": False})) == "bf16"
    assert docs_learning._weights(extra(four, "unsloth-fp8", {"load_in_4bit": False})) == "FP8 train, bf16 eval"
    assert docs_learning._weights({"recipe": {"model": four}}) == "4-bit"



def test_a_run_measured_under_a_defect_fixed_since_says_so_on_both_pages(tmp_path: Path) -> None:
    """An erratum keeps the run's numbers and names the defect and its fix in the README's learning table and on the
    performance page; a record without one renders as before."""
    from rlstack.core import results
    from rlstack.host import docs_learning

    erratum = results.Erratum(defect="RoPE base read as 10000", fixed_in="627c61e")
    result = results.Result(
        question="learning", title="fp8 learning", ran=results.Ran(command="python3 bench/learning.py",
                                                                   bench="learning", stack="fp8"),
        where=results.Where(gpu="NVIDIA H100", environment="image rlstack/fp8:abc"), date="2026-12-06T17:25:00Z",
        columns=["stack", "n", "base_correct", "tuned_correct", "p"],
        rows=[{"stack": "fp8", "n": 256, "base_correct": 38, "tuned_correct": 219, "p": 6.5e-55}],
        extra={"status": "done"}, errata=[erratum])
    results.write(result, "learning-fp8", tmp_path)
    assert results.read(tmp_path / "learning-fp8.json").errata == [erratum]  # survives the file
    (row,) = docs_learning.learning_rows(tmp_path)
    assert row[6] == "38/256 -> 219/256" and row[8] == "done; measured before 627c61e fixed: RoPE base read as 10000"
    block = docs.result_block(tmp_path / "learning-fp8.json", result, "")
    assert "**Erratum**: measured before 627c61e fixed: RoPE base read as 10000." in block
    assert "Erratum" not in docs.result_block(tmp_path / "learning-fp8.json", result.model_copy(update={"errata": []}),
                                              "")
