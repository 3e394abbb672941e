"""The signature matcher: the report's walls are named from their real messages, any log can be diagnosed,
and a malformed signatures file is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack.cli import main
from rlstack.core.errors import RlstackError
from rlstack.probes import signatures
from rlstack.probes.model import Evidence, ProbeResult

REPORT_LINES = {
    "flashinfer-sm12x-cuda": "RuntimeError: SM 12.x requires CUDA >= 12.9",
    "lora-warmup-rank": "AttributeError: 'LRUCacheWorkerLoRAManager' object has no attribute "
                        "'get_dummy_lora_warmup_rank'",
    "grpo-align-completion-tool-mask": "NameError: name 'align_completion_tool_mask' is not defined",
    "torch-pin-conflict": "Because vllm==0.21.0 depends on torch==2.11.0 and you require torch==2.10.0, we can",
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "no-nvidia-runtime": 'docker: Error response from daemon: could not select device driver "" with '
                         "capabilities: [[gpu]].",
    "torch-arch-unsupported": "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the "
                              "current PyTorch installation.",
    "trl-vllm-guided-decoding-params": "ImportError: cannot import name 'GuidedDecodingParams' from "
                                       "'vllm.sampling_params' (/opt/venv/lib/python3.12/site-packages/vllm/"
                                       "sampling_params.py)",
    "hf-generate-unused-token-type-ids": "ValueError: The following `model_kwargs` are not used by the model: "
                                         "['token_type_ids'] (note: typos in the generate arguments will also "
                                         "show up in this list)",
    # both seen on the H200 (2026-12-03) with unsloth 2026.7.5 + unsloth_zoo 2026.7.6 + torchao 0.18.0
    "torchao-float8-inference-cast": "NotImplementedError: Float8Tensor dispatch: attempting to run unimplemented "
                                     "operator/function: func=<OpOverload(op='aten.to', overload='device')>, "
                                     "types=(<class 'torchao.quantization.Float8Tensor'>,)",
    "inference-tensor-version-counter": "[rank0]: RuntimeError: Cannot set version_counter for inference tensor",
    # read in trl 0.24.0's trl/scripts/vllm_serve.py against vLLM 0.21.0 (the fp8 lock)
    "trl-vllm-serve-get-open-port": "ImportError: cannot import name 'get_open_port' from 'vllm.utils' "
                                    "(/usr/local/lib/python3.11/site-packages/vllm/utils/__init__.py)",
    "trl-vllm-serve-sampling-kwargs": "TypeError: Unexpected keyword argument 'truncate_prompt_tokens'",
    # both seen on the H200 (2026-12-03): zoo 2026.10.6 loading a tiny model whose pad token was its eos token, and
    # the fp8 stack (transformers 4.57.6, through vLLM) reading a tokenizer the portable stack had saved
    "unsloth-pad-token-out-of-range": "RuntimeError: Unsloth: Could not find a valid pad token for runs/tiny/"
                                      "tiny-7746dec5de3b - please inspect the tokenizer. A temporary "
                                      "'<\uff5cPAD\u2581TOKEN\uff5c>' was added.",
    "tokenizer-class-transformers5": "RuntimeError: Failed to load the tokenizer. If the tokenizer is a custom "
                                     "tokenizer not yet available in the HuggingFace transformers library, consider "
                                     "setting `trust_remote_code=True` in LLM",
    "cuda-toolkit-major-mismatch": "RuntimeError: The detected CUDA version (12.8) mismatches the version that "
                                   "was used to compile\nPyTorch (13.0). Please make sure to use the same CUDA "
                                   "versions.",
}


@pytest.mark.parametrize(("wall", "line"), list(REPORT_LINES.items()))
def test_each_wall_is_named_from_its_message(wall: str, line: str) -> None:
    hits = signatures.diagnose(f"INFO starting\n{line}\nINFO done\n")
    assert hits and hits[0].signature.id == wall
    assert hits[0].line == 2


def test_clean_log_matches_nothing() -> None:
    assert signatures.diagnose("step 1 loss 0.3\nstep 2 loss 0.2\nsaved adapter\n") == []


def test_several_walls_in_one_log_in_order() -> None:
    log = "\n".join([REPORT_LINES["lora-warmup-rank"], "x", REPORT_LINES["flashinfer-sm12x-cuda"]])
    assert [h.signature.id for h in signatures.diagnose(log)] == ["lora-warmup-rank", "flashinfer-sm12x-cuda"]


def test_bad_regex_and_duplicate_ids_are_errors(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("signatures:\n  - {id: a, pattern: '(', title: t, explanation: e, fix: f}\n")
    with pytest.raises(RlstackError, match="signature #0 \\(a\\).*pattern"):
        signatures.load(p)
    p.write_text("signatures:\n  - {id: a, pattern: x, title: t, explanation: e, fix: f}\n"
                 "  - {id: a, pattern: y, title: t, explanation: e, fix: f}\n")
    with pytest.raises(RlstackError, match="duplicate signature ids: a"):
        signatures.load(p)


def test_crashed_probe_gets_a_wall_from_its_evidence() -> None:
    res = ProbeResult(id="runtime:x", layer="runtime", status="fail", reason="exited 1",
                      evidence=[Evidence(text="...\n" + REPORT_LINES["cuda-oom"])])
    assert signatures.match_result(res).signature == "cuda-oom"


def test_diagnose_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "crash.log"
    log.write_text("loading\n" + REPORT_LINES["grpo-align-completion-tool-mask"] + "\n")
    assert main(["diagnose", str(log)]) == 1
    out = capsys.readouterr().out
    assert "[grpo-align-completion-tool-mask] line 2" in out and "fix:" in out
    log.write_text("all fine\n")
    assert main(["diagnose", str(log)]) == 0
    assert main(["diagnose", str(tmp_path / "missing.log")]) == 2


@pytest.mark.parametrize("wall", ["trl-vllm-guided-decoding-params", "hf-generate-unused-token-type-ids"])
def test_diagnose_names_the_gpu_stack_walls(wall: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 12's two GPU failures: `rlstack diagnose` on a crash log names each, with its fix."""
    log = tmp_path / "crash.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   + REPORT_LINES[wall] + "\n")
    assert main(["diagnose", str(log)]) == 1
    out = capsys.readouterr().out
    assert f"[{wall}] line 3" in out and "fix:" in out


def test_token_type_ids_wall_without_backticks_only_for_that_key() -> None:
    """Some transformers releases print model_kwargs without backticks; another unused key is another wall."""
    ids = [h.signature.id for h in signatures.diagnose(
        "ValueError: The following model_kwargs are not used by the model: ['token_type_ids']")]
    assert ids == ["hf-generate-unused-token-type-ids"]
    assert signatures.diagnose("ValueError: The following `model_kwargs` are not used by the model: ['foo']") == []


def test_unsloth_appended_pad_token_is_a_wall_only_when_it_indexes_past_the_embeddings() -> None:
    """zoo 2026.6.1 says it appends a pad token and goes on: harmless where the embeddings have spare rows, a wall
    when the loss then reads past them (the H200 log of 2026-12-03)."""
    said = "runs/tiny/tiny-7746dec5de3b does not have a padding token! Will use pad_token = <|PAD_TOKEN|>."
    assert signatures.diagnose(f"{said}\nstep 1 loss 0.2\nsaved adapter\n") == []
    log = f"{said}\n...\nunknown:0: unknown: block: [2,0,0], thread: [32,0,0] Assertion `index out of bounds: 0 <= " \
          "tmp21 < 384` failed.\ntorch.AcceleratorError: CUDA error: device-side assert triggered\n"
    assert [h.signature.id for h in signatures.diagnose(log)] == ["unsloth-pad-token-out-of-range"]
