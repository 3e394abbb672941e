"""compat_matrix.yaml: schema errors name the row and field, merges keep every row (also when several
processes merge at once), rendering touches only the README section, and the HTML page renders in a real
headless Chromium."""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
from pathlib import Path

import pytest

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
    f.write_text(report(arch=f"sm_{80 + n}", results=[(f"runtime:p{n}", "pass")]).model_dump_json())
    store.merge([f], Path(path), init=True)


def test_concurrent_merges_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "compat_matrix.yaml"
    path.write_text("rows: []\n")
    n = 12
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(6) as pool:
        pool.map(_merge_one, [(str(path), str(tmp_path), i) for i in range(n)])
    m = store.load(path)
    assert sorted(r.gpu_arch for r in m.rows) == sorted(f"sm_{80 + i}" for i in range(n))


def test_bad_probe_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text('{"stack": 1}')
    with pytest.raises(schema.MatrixError, match="not a probe report"):
        store.merge([f], tmp_path / "m.yaml")[0]


def test_render_replaces_only_between_markers(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# title\nbefore\n<!-- compat-matrix:start -->\nold\n"
                                        "<!-- compat-matrix:end -->\nafter\n")
    m = schema.Matrix(rows=[schema.row_from_report(report())])
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
    m = schema.Matrix(rows=store.merge_rows(m.rows, [schema.row_from_report(report())]))
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
    assert dom.count("<tr>") == len(m.rows) + 1 and "rlstack compatibility matrix" in dom


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
    labels = sorted(render.env_label(r) for r in m.rows)
    assert labels == ["native, 1 off-lock", "native, = lock"]
    md = render.render_markdown(m)
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
    m, _ = store.merge([f], path, init=True)
    assert len(m.rows) == 1 and len(store.load(path).rows) == 1


def test_merging_one_result_into_the_shipped_matrix_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "compat_matrix.yaml"
    shutil.copy(ROOT / "compat_matrix.yaml", path)
    before = {r.key for r in store.load(path).rows}
    f = tmp_path / "r.json"
    f.write_text(report(arch="sm_89").model_dump_json())
    m, dropped = store.merge([f], path)
    assert not dropped and before < {r.key for r in m.rows} and len(m.rows) == len(before) + 1


def test_rows_go_only_when_dropped_by_name(tmp_path: Path) -> None:
    path = tmp_path / "compat_matrix.yaml"
    shutil.copy(ROOT / "compat_matrix.yaml", path)
    rows = store.load(path).rows
    victim = rows[0]
    spec = f"{victim.stack}:{(victim.lock_hash or '')[:12]}:{victim.gpu_arch or ''}".rstrip(":")
    m, dropped = store.merge([], path, drop=[spec])
    assert victim in dropped and victim.key not in {r.key for r in m.rows}
    assert len(m.rows) == len(rows) - len(dropped)
    with pytest.raises(schema.MatrixError, match="no row matches"):
        store.merge([], path, drop=["no-such-stack"])
    assert len(store.load(path).rows) == len(m.rows)  # a typo drops nothing
