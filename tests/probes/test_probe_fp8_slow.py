"""From the committed locks alone, with no GPU: probe-fp8 finds the report's four walls with evidence and fix,
and the portable stack's static probes pass. Downloads the locked wheels (~1.7 GB cold; cached in
RLSTACK_CACHE, default ~/.cache/rlstack), so it is marked slow."""

from __future__ import annotations

import pytest

from rlstack.probes import suite

pytestmark = pytest.mark.slow


def test_probe_fp8_finds_every_wall_from_the_locks() -> None:
    r = suite.run("fp8", layers=["resolve", "contract", "toolchain"], gpu_arch="sm_120", with_stacks=["portable"])
    by_id = {x.id: x for x in r.results}
    walls = {x.signature for x in r.failed}
    assert walls == {"torch-pin-conflict", "lora-warmup-rank", "grpo-align-completion-tool-mask",
                     "flashinfer-sm12x-cuda"}
    assert all(x.fix and x.evidence for x in r.failed)
    pins = by_id["resolve:coinstall:portable+fp8"].reason
    assert "vllm==0.21.0" in pins and "torch==2.10.0" in pins and "torch==2.11.0" in pins
    lora = by_id["contract:vllm-lora-worker-manager"]
    assert ("vllm/v1/worker/lora_model_runner_mixin.py", 107) in {(e.file, e.line) for e in lora.evidence}
    grpo = by_id["contract:unsloth-grpo-loss-namespace"]
    assert ("unsloth_zoo/rl_replacements.py", 863) in {(e.file, e.line) for e in grpo.evidence}
    fi = by_id["toolchain:flashinfer-sm12x-nvcc"]
    assert ("flashinfer/compilation_context.py", 56) in {(e.file, e.line) for e in fi.evidence}
    assert by_id["toolchain:torch-compiled-arch"].status == "pass"


def test_portable_static_probes_pass() -> None:
    r = suite.run("portable", layers=["resolve", "contract", "toolchain"], gpu_arch="sm_120")
    assert not r.failed, [(x.id, x.reason) for x in r.failed]
    assert {x.id: x.status for x in r.results}["contract:unsloth-grpo-loss-namespace"] == "pass"
