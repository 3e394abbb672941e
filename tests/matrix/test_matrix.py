"""compat_matrix.yaml: schema errors name the row and field, merges keep every row (also when several
processes merge at once) and refuse results that cannot be true, results are ordered by their own dates, every row
says how it was decided, rendering touches only the README section, and the HTML page renders in a real headless
Chromium."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from rlstack.host.docs import publish_matrix
from rlstack.matrix import render, schema, store
from rlstack.probes.model import Evidence, ProbeReport, ProbeResult

ROOT = Path(__file__).resolve().parents[2]


def report(stack: str = "fp8", arch: str = "sm_90", lock: str = "ab" * 32, date: str = "2026-12-02T10:00:00Z",
           results: list[tuple[str, str]] | None = None, driver: str | None = "570.1") -> ProbeReport:
    res = [ProbeResult(id=i, layer=i.split(":")[0], status=s, reason=f"{i} {s}",  # type: ignore[arg-type]
                       evidence=[Evidence(text="ev", file="a.py", line=3)],
                       signature="cuda-oom" if s == "fail" else None)
           for i, s in (results or [("runtime:cuda-init", "pass"), ("runtime:fp8-matmul", "fail")])]
    return ProbeReport(stack=stack, lock_hash=lock, gpu_arch=arch, toolkit="12.8.61", torch_cuda="13.0", driver=driver,
                       host="h", date=date, layers=["runtime"], results=res, duration_s=1.0)


def test_shipped_matrix_validates_and_has_reported_rows() -> None:
    m = store.load(ROOT / "compat_matrix.yaml")
    reported = [r for r in m.rows if r.source == "reported"]
    assert reported and all(r.cite == "docs/report.md" for r in reported)
    assert (ROOT / "docs" / "report.md").is_file()  # the citation stays inside the repository
    assert any(r.stack == "fp8-report" and r.gpu_arch == "sm_120" and any(p.status == "fail" for p in r.probes)
               for r in reported)


def test_shipped_matrix_names_only_real_stacks() -> None:
    """A renamed stack takes its rows with it (fp8's walled rows became fp8-report's when fp8 was fixed)."""
    from rlstack import stacks

    names = set(stacks.stack_names())
    m = store.load(ROOT / "compat_matrix.yaml")
    assert {r.stack for r in m.rows} <= names
    for r in m.rows:  # probe ids that carry a stack's name carry this row's
        for p in r.probes:
            if p.id.startswith("resolve:coinstall:"):
                assert p.id.endswith(f"+{r.stack}"), (r.stack, p.id)
            elif p.id.startswith("resolve:"):
                assert p.id == f"resolve:{r.stack}", (r.stack, p.id)


@pytest.mark.parametrize(("text", "expect"), [
    ("rows:\n- {stack: fp8, source: measured, date: '2026-01-01', lock_hash: " + "a" * 64 + ", gpu_arch: sm90}\n",
     "row 0 (stack fp8): field 'gpu_arch'"),
    ("rows:\n- {stack: fp8, source: reported, date: '2026-01-01'}\n",
     "row 0 (stack fp8): field '(row)': Value error, a reported row must cite"),
    ("rows:\n- {stack: ok, source: reported, date: '2026-01-01', cite: r}\n"
     "- {stack: cpu, source: measured, date: '2026-01-01', lock_hash: " + "a" * 64 +
     ", probes: [{id: x, status: maybe}]}\n", "row 1 (stack cpu): field 'probes.0.status'"),
    ("rows:\n- {stack: fp8, source: guessed, date: '2026-01-01'}\n", "row 0 (stack fp8): field 'source'"),
    ("rows: [1, 2\n", "not valid YAML"),
])
def test_malformed_matrix_names_row_and_field(text: str, expect: str) -> None:
    with pytest.raises(schema.MatrixError) as exc:
        schema.parse(text, "m.yaml")
    assert expect in str(exc.value)


def test_merge_by_key_updates_probes_and_keeps_other_rows(tmp_path: Path) -> None:
    path = tmp_path / "compat_matrix.yaml"
    shutil.copy(ROOT / "compat_matrix.yaml", path)
    before = store.load(path).rows
    f1 = tmp_path / "a.json"
    f1.write_text(report().model_dump_json())
    store.merge([f1], path)[0]
    f2 = tmp_path / "b.json"
    f2.write_text(report(date="2026-12-03T10:00:00Z", results=[("runtime:fp8-matmul", "pass"),
                                                               ("runtime:bnb-4bit", "pass")]).model_dump_json())
    m = store.merge([f2], path)[0]
    assert len(m.rows) == len(before) + 1
    row = next(r for r in m.rows if r.lock_hash == "ab" * 32)
    assert {p.id: p.status for p in row.probes} == {"runtime:cuda-init": "pass", "runtime:fp8-matmul": "pass",
                                                   "runtime:bnb-4bit": "pass"}
    assert row.date.startswith("2026-12-03")
    # an older result does not overwrite a newer one
    store.merge([f1], path)[0]
    row = next(r for r in store.load(path).rows if r.lock_hash == "ab" * 32)
    assert {p.id: p.status for p in row.probes}["runtime:fp8-matmul"] == "pass"
    # another driver is another row
    f3 = tmp_path / "c.json"
    f3.write_text(report(driver="580.2").model_dump_json())
    assert len(store.merge([f3], path)[0].rows) == len(before) + 2


def _merge_one(args: tuple[str, str, int]) -> None:
    path, folder, n = args
    f = Path(folder) / f"r{n}.json"
    f.write_text(report(driver=f"570.{n}", results=[(f"runtime:p{n}", "pass")]).model_dump_json())
    store.merge([f], Path(path), init=True)


def test_concurrent_merges_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "compat_matrix.yaml"
    path.write_text("rows: []\n")
    n = 12
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(6) as pool:
        pool.map(_merge_one, [(str(path), str(tmp_path), i) for i in range(n)])
    m = store.load(path)
    assert sorted(r.driver or "" for r in m.rows) == sorted(f"570.{i}" for i in range(n))


def test_bad_probe_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text('{"stack": 1}')
    with pytest.raises(schema.MatrixError, match="not a probe report"):
        store.merge([f], tmp_path / "m.yaml")[0]


def test_render_replaces_only_between_markers(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# title\nbefore\n<!-- compat-matrix:start -->\nold\n"
                                        "<!-- compat-matrix:end -->\nafter\n")
    m = schema.Matrix(rows=[schema.row_from_report(report(lock=render.current_locks()["fp8"]))])
    store.write(m, tmp_path / "compat_matrix.yaml")
    publish_matrix([], tmp_path / "compat_matrix.yaml")
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# title\nbefore\n<!-- compat-matrix:start -->\n| stack |")
    assert text.endswith("<!-- compat-matrix:end -->\nafter\n") and "old" not in text
    assert "cuda-oom" in text
    page = (tmp_path / "docs" / "compat_matrix.html").read_text()
    assert "runtime:fp8-matmul" in page and "<td class='fail'" in page
    publish_matrix([], tmp_path / "compat_matrix.yaml")
    assert (tmp_path / "README.md").read_text() == text  # regenerating is stable


def test_html_escapes_evidence() -> None:
    r = report()
    r.results[0].reason = "<script>alert(1)</script>"
    page = render.render_html(schema.Matrix(rows=[schema.row_from_report(r)]))
    assert "<script>alert" not in page and "&lt;script&gt;" in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    m = store.load(ROOT / "compat_matrix.yaml")
    m = schema.Matrix(rows=store.merge_rows(m.rows, [schema.row_from_report(report())])[0])
    page = tmp_path / "compat_matrix.html"
    page.write_text(render.render_html(m))
    shot = tmp_path / "shot.png"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1400,900",
           page.as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    dom = subprocess.run([*cmd[:-2], "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    tables = 1 + any(render.split(m, render.current_locks())[2])  # older locks: a second, folded table
    assert dom.count("<tr>") == len(m.rows) + tables and "rlstack compatibility matrix" in dom


def _env(fp: str, devs: list[str]) -> dict[str, object]:
    return {"where": "native", "python": "3.12.3", "lock_match": not devs, "deviations": devs, "fingerprint": fp,
            "versions": {"torch": "2.11.0"}}


def test_rows_from_other_environments_never_merge(tmp_path: Path) -> None:
    from rlstack.probes.model import Environment

    path = tmp_path / "m.yaml"
    files = []
    for i, env in enumerate([_env("a" * 12, []), _env("b" * 12, ["numpy 2.5.2 (lock 2.3.5)"]), _env("a" * 12, [])]):
        r = report(date=f"2026-12-0{i + 1}T10:00:00Z")
        r.environment = Environment.model_validate(env)
        f = tmp_path / f"{i}.json"
        f.write_text(r.model_dump_json())
        files.append(f)
    m = store.merge(files, path, init=True)[0]
    assert len(m.rows) == 2
    labels = sorted(render.decided_label(r) for r in m.rows)
    assert labels == ["native, 1 off-lock", "native, = lock"]
    md = render.render_markdown(m, {"fp8": "ab" * 32})
    assert "| native, 1 off-lock |" in md
    page = render.render_html(m)
    assert "numpy 2.5.2 (lock 2.3.5)" in page and "none: the environment is the lock" in page


def test_unnamed_failures_get_todays_signatures(tmp_path: Path) -> None:
    r = report(results=[("runtime:grpo-step", "fail")])
    r.results[0].signature = None
    r.results[0].evidence = [Evidence(text="RuntimeError: self and mat2 must have the same dtype, but got Half and "
                                           "BFloat16")]
    row = schema.row_from_report(r)
    assert row.probes[0].wall == "unsloth-mixed-precision-env"
    assert r.results[0].signature is None, "the report itself is left as it was"


# --- nothing lost --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [None, "", "rows: []\n", "# only a comment\n"])
def test_missing_or_empty_matrix_is_refused_without_init(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "compat_matrix.yaml"
    if content is not None:
        path.write_text(content)
    for attempt in (lambda: store.load(path), lambda: publish_matrix([], path, readme=False)):
        with pytest.raises(schema.MatrixError, match="invoke matrix --init"):
            attempt()
    f = tmp_path / "r.json"
    f.write_text(report().model_dump_json())
    with pytest.raises(schema.MatrixError, match="--init"):
        store.merge([f], path)
    assert (path.read_text() if path.exists() else None) == content  # untouched
    m, _, _ = store.merge([f], path, init=True)
    assert len(m.rows) == 1 and len(store.load(path).rows) == 1


def test_merging_one_result_into_the_shipped_matrix_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "compat_matrix.yaml"
    shutil.copy(ROOT / "compat_matrix.yaml", path)
    before = {r.key for r in store.load(path).rows}
    f = tmp_path / "r.json"
    f.write_text(report(driver="999.1").model_dump_json())
    m, dropped, _ = store.merge([f], path)
    assert not dropped and before < {r.key for r in m.rows} and len(m.rows) == len(before) + 1


def test_rows_go_only_when_dropped_by_name(tmp_path: Path) -> None:
    path = tmp_path / "compat_matrix.yaml"
    shutil.copy(ROOT / "compat_matrix.yaml", path)
    rows = store.load(path).rows
    victim = rows[0]
    spec = f"{victim.stack}:{(victim.lock_hash or '')[:12]}:{victim.gpu_arch or ''}".rstrip(":")
    m, dropped, _ = store.merge([], path, drop=[spec])
    assert victim in dropped and victim.key not in {r.key for r in m.rows}
    assert len(m.rows) == len(rows) - len(dropped)
    with pytest.raises(schema.MatrixError, match="no row matches"):
        store.merge([], path, drop=["no-such-stack"])
    assert len(store.load(path).rows) == len(m.rows)  # a typo drops nothing


# --- results that cannot be true are refused -------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "expect"), [
    ({"stack": "nope"}, "unknown stack 'nope'"),
    ({"arch": "sm_999"}, "unknown GPU arch 'sm_999'"),
    ({"date": "2999-01-01T00:00:00Z"}, "dated 2999-01-01T00:00:00Z, after this machine's clock"),
])
def test_results_that_cannot_be_true_are_refused_with_nothing_merged(
        tmp_path: Path, bad: dict[str, str], expect: str, capsys: pytest.CaptureFixture[str]) -> None:
    from rlstack import cli

    path = tmp_path / "compat_matrix.yaml"
    shutil.copy(ROOT / "compat_matrix.yaml", path)
    before = path.read_text()
    good, wrong = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(report(driver="999.2").model_dump_json())
    wrong.write_text(report(**bad).model_dump_json())  # type: ignore[arg-type]
    with pytest.raises(store.RefusedResultError) as exc:
        store.merge([good, wrong], path)
    assert expect in str(exc.value) and str(wrong) in str(exc.value) and "nothing was merged" in str(exc.value)
    assert path.read_text() == before  # the good file of the batch is not merged either
    rc = cli.main(["host", "matrix", "--results", f"{good},{wrong}", "--file", str(path), "--no-readme"])
    err = capsys.readouterr().err
    assert rc == exc.value.exit_code != 0 and expect in err and "Traceback" not in err
    assert path.read_text() == before


def test_the_clock_skew_allowance_is_small(tmp_path: Path) -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    path = tmp_path / "m.yaml"
    f = tmp_path / "r.json"
    for ahead, taken in ((store.CLOCK_SKEW - timedelta(seconds=1), True), (store.CLOCK_SKEW + timedelta(minutes=1),
                                                                          False)):
        f.write_text(report(date=(now + ahead).isoformat()).model_dump_json())
        if taken:
            store.merge([f], path, init=True, now=now)
        else:
            with pytest.raises(store.RefusedResultError):
                store.merge([f], path, init=True, now=now)
    assert timedelta(hours=1) >= store.CLOCK_SKEW


def test_a_folder_or_binary_file_as_a_result_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00\x01")
    for f in (tmp_path, tmp_path / "bin.json"):
        with pytest.raises(schema.MatrixError, match=str(f)):
            store.merge([f], tmp_path / "m.yaml", init=True)


# --- merges follow the evidence's own time -------------------------------------------------------------------


def test_results_are_ordered_by_their_own_dates_and_none_is_dropped_silently(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.yaml"

    def result(date: str, results: list[tuple[str, str]]) -> Path:
        f = tmp_path / f"{date[:10]}.json"
        f.write_text(report(date=date, results=results).model_dump_json())
        return f

    store.merge([result("2026-12-01T10:00:00Z", [("runtime:a", "fail"), ("runtime:b", "fail")])], path, init=True)
    store.merge([result("2026-12-03T10:00:00Z", [("runtime:b", "pass")])], path)  # the row moves on; a stays
    m, _, not_taken = store.merge([result("2026-12-02T10:00:00Z", [("runtime:a", "pass"), ("runtime:b", "fail")])],
                                  path)
    (row,) = m.rows
    cells = {p.id: p for p in row.probes}
    # a: 12-02 is newer than a's own 12-01 (though older than the row); b: 12-03 is never replaced by 12-02
    assert {i: p.status for i, p in cells.items()} == {"runtime:a": "pass", "runtime:b": "pass"}
    assert row.date == "2026-12-03T10:00:00Z" and cells["runtime:a"].date == "2026-12-02T10:00:00Z"
    assert cells["runtime:b"].date is None  # decided at its row's date
    assert len(not_taken) == 1 and "runtime:b (matrix: 2026-12-03T10:00:00Z)" in not_taken[0]
    assert store.load(path) == m  # the dates are in the file, for the next merge
    # the command says so
    publish_matrix([tmp_path / "2026-12-01.json"], path, readme=False)
    out = capsys.readouterr().out
    assert out.count("not taken:") == 1 and "2 result(s) older than the matrix's" in out


def test_a_newer_result_replaces_an_older_one_whatever_the_merge_order(tmp_path: Path) -> None:
    files = []
    for date, status in (("2026-12-04T10:00:00Z", "pass"), ("2026-12-02T10:00:00Z", "fail")):
        f = tmp_path / f"{date[:10]}.json"
        f.write_text(report(date=date, results=[("runtime:a", status)]).model_dump_json())
        files.append(f)
    for order in (files, files[::-1]):
        path = tmp_path / f"m{order is files}.yaml"
        m, _, _ = store.merge(order, path, init=True)
        assert [(r.date, r.probes[0].status) for r in m.rows] == [("2026-12-04T10:00:00Z", "pass")]


# --- temporary files --------------------------------------------------------------------------------------------


def test_an_interrupted_write_leaves_no_temp_file_and_git_ignores_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "compat_matrix.yaml"
    shutil.copy(ROOT / "compat_matrix.yaml", path)
    before = path.read_text()
    f = tmp_path / "r.json"
    f.write_text(report(driver="999.3").model_dump_json())
    temps: list[Path] = []

    def interrupted(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        temps.append(Path(src))
        assert Path(src).parent == path.parent  # next to the target: the rename stays on one filesystem
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.merge([f], path)
    monkeypatch.undo()
    assert temps and path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compat_matrix.yaml", "compat_matrix.yaml.lock", "r.json"]
    # only kill -9 leaves the temp file behind: its name beside the real matrix is one git ignores
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = [temps[0].name, "compat_matrix.yaml.lock"]
    out = subprocess.run([git, "check-ignore", *names], cwd=ROOT, capture_output=True, text=True).stdout
    assert sorted(out.split()) == sorted(names)


# --- no machine-local path ---------------------------------------------------------------------------------------

LOCAL = ("/home/", "/root/", "/tmp/", "/work/", ".venv/", ".pyenv/")


def test_paths_of_the_probing_machine_never_reach_the_matrix(tmp_path: Path) -> None:
    from rlstack.probes.model import Environment

    r = report(results=[("resolve:fp8", "pass"), ("runtime:vllm-lora", "fail")])
    r.results[0].evidence = [Evidence(text="pinned", command="/home/alice/.pyenv/shims/uv pip compile r.in")]
    r.results[1].evidence = [Evidence(text='File "/tmp/site-fp8/vllm/v1/worker/gpu_worker.py", line 392, not in '
                                           "/home/alice/.venv/bin/python3 (no /dev/nvidia0 and /usr/local/cuda)")]
    r.environment = Environment.model_validate({**_env("c" * 12, []), "executable": "/home/alice/.venv/bin/python3"})
    f = tmp_path / "r.json"
    f.write_text(r.model_dump_json())
    path = tmp_path / "m.yaml"
    store.merge([f], path, init=True)
    text = path.read_text()
    assert not [p for p in LOCAL if p in text], text
    assert "$ uv pip compile r.in" in text and "<site-packages>/vllm/v1/worker/gpu_worker.py" in text
    assert "executable: python3" in text and "/dev/nvidia0" in text and "/usr/local/cuda" in text  # system paths stay
    assert schema.portable_text(text) == text  # idempotent: a second pass changes nothing


def test_the_committed_matrix_holds_no_machine_local_path() -> None:
    text = (ROOT / "compat_matrix.yaml").read_text()
    assert not [p for p in LOCAL if p in text]
    # /opt/ only as the images' own paths (the same everywhere), never a probing machine's /opt/...
    assert not [m for m in re.findall(r"/opt/[\w.+-]+", text) if not (m + "/").startswith(schema.IMAGE_PATHS)]
    data = yaml.safe_load(text)
    for row in data["rows"]:
        for p in row.get("probes", []):
            assert schema.portable_text(p.get("evidence", "")) == p.get("evidence", ""), (row["stack"], p["id"])


# --- how each result was decided; predicted, measured, reported ------------------------------------------------


def test_static_results_are_predicted_and_runtime_results_measured() -> None:
    from rlstack.probes.model import Environment

    static = report(results=[("resolve:fp8", "pass"), ("toolchain:torch-compiled-arch", "pass"),
                             ("runtime:cuda-init", "skip")])
    row = schema.row_from_report(static)
    assert (row.source, row.decided.how, row.decided.label()) == ("predicted", "static", "static (wheels, no GPU)")
    ran = report()
    ran.environment = Environment.model_validate({**_env("d" * 12, ["numpy 2.5.2 (lock 2.3.5)"]), "where": "image"})
    row = schema.row_from_report(ran)
    assert (row.source, row.decided.how, row.decided.where) == ("measured", "runtime", "image")
    assert row.decided.deviations == ["numpy 2.5.2 (lock 2.3.5)"]
    assert row.decided.label() == "image (tag not recorded), 1 off-lock"


@pytest.mark.parametrize(("text", "expect"), [
    ("{source: measured, decided: {how: static}, probes: [{id: 'resolve:fp8', status: pass}]}",
     "static results only are 'predicted'"),
    ("{source: predicted, decided: {how: runtime, where: native}, probes: [{id: 'runtime:a', status: pass}]}",
     "a runtime result is 'measured'"),
    ("{source: predicted, decided: {how: static}, probes: [{id: 'runtime:a', status: pass}]}",
     "the row's probes say 'runtime'"),
    ("{source: predicted, decided: {how: static, where: native}}", "a static result ran nowhere"),
])
def test_a_row_cannot_claim_more_than_its_results(text: str, expect: str) -> None:
    row = f"rows:\n- {{stack: fp8, date: '2026-12-01', lock_hash: {'a' * 64}, " + text[1:] + "\n"
    with pytest.raises(schema.MatrixError, match=expect):
        schema.parse(row)


def test_the_committed_matrix_says_how_each_row_was_decided() -> None:
    rows = store.load(ROOT / "compat_matrix.yaml").rows
    raw = yaml.safe_load((ROOT / "compat_matrix.yaml").read_text())["rows"]
    assert all("decided" in r for r in raw)  # written, not only derived when read
    for r in rows:
        ran = any(p.id.startswith("runtime:") and p.status != "skip" for p in r.probes)
        if r.source != "reported":
            assert r.source == ("measured" if ran else "predicted"), r.label()
        if r.source == "measured":
            assert r.decided.where in ("image", "native"), r.label()
    blackwell = [r for r in rows if r.gpu_arch in ("sm_100", "sm_120") and r.source != "reported"]
    assert blackwell and all(r.source == "predicted" for r in blackwell)  # no GPU of theirs ran anything


# --- the migration keeps every row -----------------------------------------------------------------------------

V1 = Path(__file__).parent / "data" / "compat_matrix_v1.yaml"


def _identity(row: dict[str, object]) -> tuple[object, ...]:
    env = row.get("environment")
    return (row["stack"], row.get("lock_hash"), row.get("gpu_arch"), row.get("driver"), row.get("toolkit"),
            row.get("cite"), env.get("fingerprint") if isinstance(env, dict) else None)


def _kept(old: dict[str, object], new: schema.Row) -> None:
    """Every field the old row had, with the same value: evidence and the executable made portable, a row of
    static results only 'predicted' instead of 'measured', a failed probe without a wall named by a signature added
    since (a merge names it from the row's own evidence), and nothing else changed."""
    now = new.model_dump(mode="json", exclude_none=True)
    for field, value in old.items():
        if field == "probes":
            assert isinstance(value, list)
            got = {p["id"]: p for p in now["probes"]}
            if now["date"] == old["date"]:
                assert len(got) == len(value)
            for p in value:
                cell = {**got[p["id"]]}
                if now["date"] == old["date"]:
                    assert cell.pop("evidence", "") == schema.portable_text(p.get("evidence", "")), p["id"]
                    cell.pop("date", None)
                    if "wall" not in p and p.get("status") == "fail":
                        cell.pop("wall", None)
                    assert cell == {k: v for k, v in p.items() if k not in ("evidence", "date")}, p["id"]
        elif field == "environment":
            assert isinstance(value, dict)
            exe = schema.portable_text(str(value.get("executable", "")))
            assert now["environment"] == {**value, **({"executable": exe} if "executable" in value else {})}
        elif field == "source" and value == "measured" and new.decided.how == "static":
            assert now["source"] == "predicted"
        elif field == "date":
            assert schema.when(now["date"]) >= schema.when(str(value))
        else:
            assert now[field] == value, field


def test_the_migration_keeps_every_row_and_field(tmp_path: Path) -> None:
    path = tmp_path / "compat_matrix.yaml"
    shutil.copy(V1, path)
    old = yaml.safe_load(V1.read_text())["rows"]
    assert all("decided" not in r for r in old)  # the fixture is the schema before `decided`
    assert store.upgrade(path) == len(old)
    assert store.upgrade(path) is None  # current now: a second run writes nothing
    new = {_identity(r.model_dump(mode="json", exclude_none=True)): r for r in store.load(path).rows}
    assert len(new) == len(old) == len({_identity(r) for r in old})
    for r in old:
        _kept(r, new[_identity(r)])


def test_the_committed_matrix_keeps_every_row_of_the_last_commit() -> None:
    """Against `git show HEAD:compat_matrix.yaml`: each of its rows is still here with its data (a merge since may
    only have moved a row on to a newer date)."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run([git, "show", "HEAD:compat_matrix.yaml"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"no compat_matrix.yaml at HEAD: {proc.stderr.strip()}")
    old = yaml.safe_load(proc.stdout)["rows"]
    new = {_identity(r.model_dump(mode="json", exclude_none=True)): r
           for r in store.load(ROOT / "compat_matrix.yaml").rows}
    assert len(new) >= len(old)
    for r in old:
        _kept(r, new[_identity(r)])


# --- the README and the page: current locks first, older folded ------------------------------------------------


def test_current_locks_lead_and_older_locks_are_folded() -> None:
    from rlstack.probes.model import Environment

    cur, old = "cd" * 32, "ab" * 32
    now_r = report(lock=cur, date="2026-12-05T10:00:00Z")
    now_r.environment = Environment.model_validate(_env("e" * 12, []))
    rows = [schema.row_from_report(report(lock=old, arch="sm_120")), schema.row_from_report(now_r),
            *[r for r in store.load(ROOT / "compat_matrix.yaml").rows if r.source == "reported"]]
    m = schema.Matrix(rows=rows)
    current = {"fp8": cur, "cpu": "ef" * 32}
    md = render.render_markdown(m, current)
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| stack | lock | GPU | driver | toolkit | decided | source |")
    assert table[1].startswith("| fp8 | cdcdcdcdcdcd | sm_90 |") and "| native, = lock | measured |" in table[1]
    assert all("| reported ([report](docs/report.md)) |" in line for line in table[2:]) and len(table) > 2
    assert "abababababab" not in md
    assert "1 row of an older lock (fp8) stays in compat_matrix.yaml" in md
    assert "No result yet at the current lock of: cpu" in md
    page = render.render_html(m, current)
    assert page.index("cdcdcdcdcdcd") < page.index("<details class='older'>") < page.index("abababababab")


def test_a_matrix_file_with_no_readme_beside_it_is_refused_before_the_merge(tmp_path: Path) -> None:
    """`invoke matrix --file elsewhere/m.yaml` merged, then ended in a FileNotFoundError traceback on README.md."""
    m = schema.Matrix(rows=[schema.row_from_report(report(lock=render.current_locks()["fp8"]))])
    path = tmp_path / "m.yaml"
    store.write(m, path)
    before = path.read_bytes()
    with pytest.raises(schema.MatrixError, match="--no-readme"):
        publish_matrix([], path, drop=["fp8"])
    assert path.read_bytes() == before
    publish_matrix([], path, readme=False)
