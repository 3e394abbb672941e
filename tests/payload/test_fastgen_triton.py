"""fastgen's triton decode attention (decode_attention="triton", fastgen.split_attention): its kernel and the
engine around it in Triton's CPU interpreter (a process of their own, see tests/payload/triton_interpreted.py),
and the refusals that keep it off where it cannot run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlstack.payload import fastgen  # noqa: E402

HERE = Path(__file__).resolve().parent


def test_the_kernel_and_the_engine_in_tritons_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
                           str(HERE / "triton_interpreted.py")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=HERE.parents[1])
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail and "deselected" not in tail, tail


def _tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=512)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def test_off_cuda_without_the_interpreter_it_is_refused_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(fastgen.FastgenError, match="runs on CUDA .*TRITON_INTERPRET=1") as err:
        fastgen.FastGenerator(_tiny(), compile=False, decode_attention="triton")
    assert "use decode_attention='matmul'" in str(err.value)  # what to do instead


def test_unknown_kinds_and_a_triton_attention_without_fastgens_own_are_refused() -> None:
    with pytest.raises(fastgen.FastgenError, match="unknown decode_attention 'flex'"):
        fastgen.FastGenerator(_tiny(), compile=False, decode_attention="flex")  # retired on 2026-12-04
    with pytest.raises(fastgen.FastgenError, match="decode_attention needs fastgen's own decode attention"):
        fastgen.FastGenerator(_tiny(), compile=False, decode_attention="triton", gqa_attention=False)
