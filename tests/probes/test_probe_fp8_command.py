"""`probe-fp8` asks the report's question of both FP8 stacks: the reference's walls come first, the working
stack's verdict decides the exit, and the matrix's runtime rows are listed as current or stale. The probes
themselves are stand-ins here (test_probe_fp8_slow.py runs the real ones)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlstack.matrix import fp8 as commands
from rlstack.matrix import store
from rlstack.matrix.schema import Matrix, ProbeCell, Row
from rlstack.probes import suite
from rlstack.probes.model import Evidence, ProbeReport, ProbeResult

REF_LOCK, NEW_LOCK, OLD_LOCK = "a" * 64, "b" * 64, "c" * 64


def _report(stack: str, lock: str, results: list[tuple[str, str, str | None]]) -> ProbeReport:
    res = [ProbeResult(id=i, layer=i.split(":")[0], status=s, reason=f"{i} {s}",  # type: ignore[arg-type]
                       evidence=[Evidence(text="ev")] if s == "fail" else [], signature=w,
                       fix="do this" if s == "fail" else None) for i, s, w in results]
    return ProbeReport(stack=stack, lock_hash=lock, gpu_arch="sm_120", toolkit="13.0.88", torch_cuda="13.0",
                       host="h", date="2026-12-03T10:00:00Z", layers=["resolve", "contract", "toolchain"],
                       results=res, duration_s=0.1)


REF = [("resolve:fp8-report", "pass", None),
       ("resolve:coinstall:portable+fp8-report", "fail", "torch-pin-conflict"),
       ("contract:vllm-lora-worker-manager", "fail", "lora-warmup-rank"),
       ("toolchain:flashinfer-sm12x-nvcc", "fail", "flashinfer-sm12x-cuda")]
NEW_PASS = [("resolve:fp8", "pass", None), ("contract:vllm-lora-worker-manager", "pass", None),
            ("toolchain:flashinfer-sm12x-nvcc", "pass", None)]


Results = list[tuple[str, str, str | None]]


@dataclass
class FakeSuite:
    """suite.run's stand-in: `plan` gives each stack's results; `calls` records how each stack was asked."""

    plan: dict[str, Results]
    calls: list[tuple[str, list[str] | None]] = field(default_factory=list)


@pytest.fixture
def fake_suite(monkeypatch: pytest.MonkeyPatch, stack_tree: Path) -> FakeSuite:
    fake = FakeSuite(plan={commands.FP8_REPORT_STACK: REF, commands.FP8_STACK: NEW_PASS})

    def fake_run(name: str, *, layers=None, gpu_arch=None, with_stacks=None, fresh=False, **kw):  # type: ignore[no-untyped-def]
        fake.calls.append((name, with_stacks))
        return _report(name, REF_LOCK if name == commands.FP8_REPORT_STACK else NEW_LOCK, fake.plan[name])

    monkeypatch.setattr(suite, "run", fake_run)
    return fake


def _matrix(root: Path, rows: list[Row]) -> None:
    store.write(Matrix(rows=rows), root / "compat_matrix.yaml")


def _runtime_row(stack: str, lock: str, arch: str, status: str) -> Row:
    return Row(stack=stack, lock_hash=lock, gpu_arch=arch, source="measured", date="2026-12-02T10:00:00Z",
               probes=[ProbeCell(id="runtime:cuda-init", status="pass"),
                       ProbeCell(id="runtime:grpo-step", status=status,
                                 wall="grpo-align-completion-tool-mask" if status == "fail" else None)])


def test_reference_walls_then_fp8_verdict_exit_0(fake_suite: FakeSuite, capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.probe_fp8() == 0
    out = capsys.readouterr().out
    ref_at, new_at = out.index("== fp8-report:"), out.index("== fp8:")
    assert ref_at < new_at
    assert "fp8-report stack) on sm_120: BLOCKED by 3 wall(s)" in out
    assert "fp8 stack) on sm_120: no wall found" in out
    # each wall of the reference, looked up in fp8 (the co-install question answered by fp8's own resolution)
    assert "[torch-pin-conflict] resolve:coinstall:portable+fp8-report FAIL -> fp8 resolve:fp8 PASS" in out
    assert ("[lora-warmup-rank] contract:vllm-lora-worker-manager FAIL -> fp8 contract:vllm-lora-worker-manager "
            "PASS") in out
    assert "fp8: none measured yet" in out and "-> exit 0" in out
    # the reference is resolved with portable (the report's torch knot); fp8 alone (it is its own image)
    assert fake_suite.calls == [("fp8-report", ["portable"]), ("fp8", None)]


def test_a_failing_fp8_probe_fails_the_command(fake_suite: FakeSuite, capsys: pytest.CaptureFixture[str]) -> None:
    fake_suite.plan[commands.FP8_STACK] = [*NEW_PASS[:2], ("toolchain:flashinfer-sm12x-nvcc", "fail",
                                                      "flashinfer-sm12x-cuda")]
    assert commands.probe_fp8() == 1
    assert "fp8: FAILS, 1 probe(s) fail: flashinfer-sm12x-cuda" in capsys.readouterr().out


def test_runtime_rows_current_or_stale(fake_suite: FakeSuite, stack_tree: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _matrix(stack_tree, [_runtime_row("fp8-report", OLD_LOCK, "sm_90", "fail"),
                         _runtime_row("fp8", NEW_LOCK, "sm_120", "pass"),
                         Row(stack="fp8", lock_hash=NEW_LOCK, gpu_arch="sm_90", source="measured",  # static only
                             date="2026-12-03", probes=[ProbeCell(id="resolve:fp8", status="pass")])])
    assert commands.probe_fp8() == 0
    out = capsys.readouterr().out
    assert "fp8-report sm_90 2026-12-02 lock cccccccccccc (stale" in out
    assert "walls: grpo-align-completion-tool-mask" in out
    assert "fp8 sm_120 2026-12-02 lock bbbbbbbbbbbb (= the stack's lock)" in out
    assert "fp8 sm_90" not in out  # no runtime probe in that row
    assert "runtime at this lock: sm_120 no failure" in out

    # a runtime failure measured at fp8's current lock is a failure of fp8, whatever the static layers say
    _matrix(stack_tree, [_runtime_row("fp8", NEW_LOCK, "sm_120", "fail")])
    assert commands.probe_fp8() == 1
    assert "sm_120 FAIL (grpo-align-completion-tool-mask)" in capsys.readouterr().out
    # the same failure at an older lock is history, not a verdict on this lock
    _matrix(stack_tree, [_runtime_row("fp8", OLD_LOCK, "sm_120", "fail")])
    assert commands.probe_fp8() == 0


def test_a_failure_rlstack_caused_and_fixed_later_is_listed_not_held_against_fp8(
        fake_suite: FakeSuite, stack_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The H200 rows of 2026-12-03: grpo-step failed on rlstack's own tiny model (its pad token was its eos),
    fixed in rlstack at the wall's probe_fixed time. Rows measured before it are to be measured again; a row
    measured after it that fails the same way fails fp8 again, and so does a failure with no wall named."""
    from rlstack.probes import signatures

    wall = "unsloth-pad-token-out-of-range"
    fixed = signatures.by_id(wall).probe_fixed  # type: ignore[union-attr]
    assert fixed

    def row(date: str, wall_id: str | None) -> Row:
        return Row(stack="fp8", lock_hash=NEW_LOCK, gpu_arch="sm_90", source="measured", date=date,
                   probes=[ProbeCell(id="runtime:vllm-lora", status="pass"),
                           ProbeCell(id="runtime:grpo-step", status="fail", wall=wall_id)])

    _matrix(stack_tree, [row("2026-12-03T19:35:15Z", wall)])
    assert commands.probe_fp8() == 0
    out = capsys.readouterr().out
    assert f"walls: {wall} (rlstack's probe setup, fixed since: measure again)" in out
    assert f"sm_90 failed only on rlstack's own {wall}, fixed in rlstack since: to be measured again" in out
    _matrix(stack_tree, [row("2026-12-04T09:00:00Z", wall)])
    assert commands.probe_fp8() == 1
    assert f"sm_90 FAIL ({wall})" in capsys.readouterr().out
    _matrix(stack_tree, [row("2026-12-03T19:35:15Z", None)])
    assert commands.probe_fp8() == 1


def test_probe_fixed_must_be_a_time(tmp_path: Path) -> None:
    from rlstack.core.errors import RlstackError
    from rlstack.probes import signatures

    bad = tmp_path / "s.yaml"
    bad.write_text("signatures:\n  - {id: a, pattern: x, title: t, explanation: e, fix: f, probe_fixed: yesterday}\n")
    with pytest.raises(RlstackError, match="probe_fixed.*not an ISO 8601 time"):
        signatures.load(bad)


def test_json_holds_both_reports_and_output_writes_each(fake_suite: FakeSuite, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.probe_fp8(json_=True, output=tmp_path / "out") == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["reports"]) == {"fp8-report", "fp8"} and data["exit"] == 0
    assert data["reference"] == "fp8-report" and data["stack"] == "fp8"
    assert {r["signature"] for r in data["reports"]["fp8-report"]["results"] if r["status"] == "fail"} == {
        "torch-pin-conflict", "lora-warmup-rank", "flashinfer-sm12x-cuda"}
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["probe-fp8-report-sm_120.json", "probe-fp8-sm_120.json"]
    ProbeReport.model_validate_json((tmp_path / "out" / "probe-fp8-sm_120.json").read_text())


def test_suggest_searches_from_the_reference(fake_suite: FakeSuite, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(commands, "run_suggest", lambda stack, arch, json_=False: asked.append(stack) or (0, None))
    assert commands.probe_fp8(suggest=True) == 0
    assert asked == ["fp8-report"]
