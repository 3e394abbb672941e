"""Files a user hands the probe and matrix commands: a probe report for `invoke matrix --results`, the matrix
file, a log for `diagnose`, and a stack's lock for `probe`. Each bad one is a clear error naming the file (and,
for a report, the first wrong field) with an exit code and a hint; never a traceback or a raw pydantic dump."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstack import stacks
from rlstack.core.errors import LockError, RlstackError
from rlstack.host import commands as host_commands
from rlstack.matrix.schema import MatrixError
from rlstack.probes import commands, resolve
from rlstack.probes.model import Evidence, ProbeReport, ProbeResult
from rlstack.stacks import locks, resolver

GOOD = ProbeReport(stack="cpu", lock_hash="a" * 64, gpu_arch="sm_90", toolkit=None, torch_cuda="12.8", host="h",
                   date="2026-12-01T00:00:00Z", layers=["resolve"], duration_s=0.1,
                   results=[ProbeResult(id="resolve:cpu", layer="resolve", status="pass", reason="ok",
                                        evidence=[Evidence(text="x")])])


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_written_report_reads_back(tmp_path: Path) -> None:
    path = _write(tmp_path, "r.json", GOOD.model_dump_json().encode())
    assert commands.read_report_file(path) == GOOD


@pytest.mark.parametrize(("data", "said"), [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a binary file, not a probe report (a NUL byte at offset 8)"),
    (b"\x9a\xff{}", "not a probe report: byte 0 is not UTF-8 text"),
    (b'{"stack": "cpu",', "not JSON: line 1 column 17"),
    (b"[1, 2]", "field '(the whole file)': Input should be a valid dictionary"),
    (b'{"stack": "cpu", "lock_hash": "x"}', "field 'gpu_arch': Field required (and 7 more problem(s))"),
    (b"[" * 100_000, "nested too deeply"),
])
def test_bad_reports_name_the_file_and_the_first_field(tmp_path: Path, data: bytes, said: str) -> None:
    path = _write(tmp_path, "r.json", data)
    with pytest.raises(commands.ProbeReportError) as exc:
        commands.read_report_file(path)
    assert str(exc.value).startswith(f"{path}: ") and said in str(exc.value)
    assert "pydantic" not in str(exc.value) and exc.value.hint and exc.value.exit_code == 7


def test_a_directory_and_a_missing_file_are_not_reports(tmp_path: Path) -> None:
    with pytest.raises(commands.ProbeReportError, match="is a directory, not a probe report"):
        commands.read_report_file(tmp_path)
    with pytest.raises(commands.ProbeReportError, match="no such probe report"):
        commands.read_report_file(tmp_path / "gone.json")


def test_matrix_results_refuses_malformed_reports_by_field(tmp_path: Path) -> None:
    """Through the command: a malformed report is named with its first bad field, not pydantic's listing."""
    matrix = tmp_path / "m.yaml"
    bad = _write(tmp_path, "bad.json", json.dumps({**GOOD.model_dump(mode="json"), "gpu_arch": 5}).encode())
    with pytest.raises(RlstackError) as exc:
        host_commands.matrix(results=[str(bad)], file=str(matrix), init=True, no_readme=True)
    assert f"{bad}: not a probe report: field 'gpu_arch': Input should be a valid string" == exc.value.message
    assert exc.value.exit_code == 7 and exc.value.hint and not matrix.exists()
    with pytest.raises(RlstackError, match="is a directory"):
        host_commands.matrix(results=[str(tmp_path)], file=str(matrix), init=True, no_readme=True)


def test_binary_or_folder_matrix_file_is_a_matrix_error(tmp_path: Path) -> None:
    binary = _write(tmp_path, "m.yaml", bytes(range(256)))
    with pytest.raises(MatrixError, match="a binary file, not a matrix file") as exc:
        host_commands.matrix(check=True, file=str(binary))
    assert exc.value.hint and binary.read_bytes() == bytes(range(256))
    with pytest.raises(MatrixError, match="is a directory"):
        host_commands.matrix(check=True, file=str(tmp_path))


def test_diagnose_refuses_folders_and_binary_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RlstackError, match="is a directory, not a log file"):
        commands.diagnose(str(tmp_path))
    noise = _write(tmp_path, "noise.bin", bytes(range(128, 256)) * 8)  # no NUL, but not text
    with pytest.raises(RlstackError, match="a binary file, not a log file"):
        commands.diagnose(str(noise))
    log = _write(tmp_path, "run.log", b"caf\xe9 ok\nstep 1 loss 0.3\n")  # one stray byte stays a log
    assert commands.diagnose(str(log)) == 0
    assert "no known failure signature" in capsys.readouterr().out


@pytest.mark.parametrize("arch", ["foo;rm", "sm_", "90", "sm_90 ", "SM_90", ""])
def test_probe_refuses_a_gpu_arch_that_is_no_arch_before_probing(arch: str) -> None:
    """`--gpu-arch 'foo;rm'` used to pass every static probe (exit 0) or be reported as a wall."""
    from rlstack.core.options import UsageError

    with pytest.raises(UsageError, match="is not a GPU arch"):
        commands.probe(stack="cpu", gpu_arch=arch, layer="resolve")


# --- the probes refuse an edited lock ------------------------------------------------------------------------


def test_resolve_probe_fails_on_an_edited_lock(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolver, "offline_reference", lambda *a: None)  # no uv cache: the edit is still caught
    cpu = stacks.load_stack("cpu")
    assert resolve.probe_stack(cpu).status == "pass"
    cpu.lock_file.write_text(cpu.lock_file.read_text().replace("180885b6d7b05a19", "000085b6d7b05a19"))
    res = resolve.probe_stack(cpu)
    assert res.status == "fail" and "edited by hand" in res.reason and "invoke lock --stack cpu" in (res.fix or "")
    with pytest.raises(locks.EditedLockError) as exc:
        commands.probe(stack="cpu", layer="contract")
    assert "requirements.lock: edited after 'invoke lock' wrote it" in str(exc.value)
    assert exc.value.exit_code == LockError.exit_code


# --- fuzz: any bytes, any JSON ---------------------------------------------------------------------------------


def _read(path: Path) -> None:
    try:
        report = commands.read_report_file(path)
    except commands.ProbeReportError as exc:
        assert str(path) in str(exc) and exc.hint
    else:
        assert isinstance(report, ProbeReport)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.binary(max_size=300))
def test_any_bytes_are_a_report_or_a_clear_error(tmp_path: Path, data: bytes) -> None:
    _read(_write(tmp_path, "r.json", data))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                    max_leaves=12)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(field=st.sampled_from([*ProbeReport.model_fields, "results.0.status", "results.0.evidence", "extra"]),
       value=JSON)
def test_a_report_with_any_field_replaced(tmp_path: Path, field: str, value: object) -> None:
    data = GOOD.model_dump(mode="json")
    if field.startswith("results.0."):
        data["results"][0][field.split(".")[-1]] = value
    else:
        data[field] = value
    _read(_write(tmp_path, "r.json", json.dumps(data).encode()))


def test_a_pipe_is_no_log_and_a_folder_is_no_output(tmp_path: Path) -> None:
    """`diagnose FIFO` waited forever for a writer; `probe -o DIR` was an IsADirectoryError traceback."""
    import os

    from rlstack.core.fileio import FolderError

    os.mkfifo(tmp_path / "fifo.log")
    with pytest.raises(RlstackError, match="not a regular file"):
        commands.diagnose(str(tmp_path / "fifo.log"))
    with pytest.raises(FolderError, match="is a folder, not a file"):
        commands.write_report(GOOD, tmp_path)
