"""From the committed locks alone, with no GPU: probe-fp8 finds fp8-report's four walls as its image meets them
(the report's combination: the torch pin conflict, two API drifts, and a toolkit wheel without nvcc) with evidence
and fix, the fp8 stack passes the same static probes on every arch it
claims, and the portable stack's static probes pass. Downloads the locked wheels (~1.7 GB cold; cached in
RLSTACK_CACHE, default ~/.cache/rlstack), so it is marked slow."""

from __future__ import annotations

import json

import pytest

from rlstack.matrix import fp8 as commands
from rlstack.probes import suite
from rlstack.stacks.model import load_stack

pytestmark = pytest.mark.slow

STATIC = ["resolve", "contract", "toolchain"]
WALLS = {"torch-pin-conflict", "lora-warmup-rank", "grpo-align-completion-tool-mask", "flashinfer-jit-no-nvcc"}


def test_probe_fp8_report_finds_every_wall_from_the_locks() -> None:
    r = suite.run("fp8-report", layers=STATIC, gpu_arch="sm_120", with_stacks=["portable"])
    by_id = {x.id: x for x in r.results}
    walls = {x.signature for x in r.failed}
    assert walls == WALLS
    assert all(x.fix and x.evidence for x in r.failed)
    pins = by_id["resolve:coinstall:portable+fp8-report"].reason
    assert "vllm==0.21.0" in pins and "torch==2.10.0" in pins and "torch==2.11.0" in pins
    lora = by_id["contract:vllm-lora-worker-manager"]
    assert ("vllm/v1/worker/lora_model_runner_mixin.py", 107) in {(e.file, e.line) for e in lora.evidence}
    grpo = by_id["contract:unsloth-grpo-loss-namespace"]
    assert ("unsloth_zoo/rl_replacements.py", 863) in {(e.file, e.line) for e in grpo.evidence}
    fi = by_id["toolchain:flashinfer-sm12x-nvcc"]
    assert ("flashinfer/compilation_context.py", 56) in {(e.file, e.line) for e in fi.evidence}
    assert by_id["toolchain:torch-compiled-arch"].status == "pass"


@pytest.mark.parametrize("arch", load_stack("fp8").gpu_archs)
def test_fp8_static_probes_pass_on_each_arch(arch: str) -> None:
    r = suite.run("fp8", layers=STATIC, gpu_arch=arch)
    assert not r.failed, [(x.id, x.reason) for x in r.failed]
    status = {x.id: x.status for x in r.results}
    assert status["contract:vllm-lora-worker-manager"] == "pass"
    assert status["contract:unsloth-grpo-loss-namespace"] == "pass"
    assert status["toolchain:flashinfer-sm12x-nvcc"] == "pass"


def test_probe_fp8_command_answers_for_both_stacks(capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.probe_fp8(json_=True) == 0
    data = json.loads(capsys.readouterr().out)
    ref, new = data["reports"]["fp8-report"], data["reports"]["fp8"]
    assert {x["signature"] for x in ref["results"] if x["status"] == "fail"} == WALLS
    assert not [x for x in new["results"] if x["status"] == "fail"]


def test_portable_static_probes_pass() -> None:
    r = suite.run("portable", layers=STATIC, gpu_arch="sm_120")
    assert not r.failed, [(x.id, x.reason) for x in r.failed]
    assert {x.id: x.status for x in r.results}["contract:unsloth-grpo-loss-namespace"] == "pass"


def test_discovery_alone_finds_the_reports_contract_walls() -> None:
    """No case data: the LoRA-warmup replacement and the align_completion_tool_mask paste are found in the
    wheels' sources by discovery, and named by the log signatures."""
    r = suite.run("fp8-report", layers=["contract"], gpu_arch="sm_120", discovered_only=True)
    assert not [x for x in r.results if x.id.startswith("contract:")]
    walls = {x.signature for x in r.failed}
    assert {"lora-warmup-rank", "grpo-align-completion-tool-mask"} <= walls
    lora = next(x for x in r.failed if x.signature == "lora-warmup-rank")
    assert ("vllm/v1/worker/lora_model_runner_mixin.py", 107) in {(e.file, e.line) for e in lora.evidence}


def test_discovery_on_portable_finds_nothing_unexplained() -> None:
    r = suite.run("portable", layers=["contract"], gpu_arch="sm_120", discovered_only=True)
    assert r.exit_code == 0, [(x.id, x.reason) for x in r.failed]
    summary = next(x for x in r.results if x.id == "discovered:summary")
    assert "contracts checked" in summary.reason
