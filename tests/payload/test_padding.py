"""Padding a Llama checkpoint to block-aligned widths keeps its function (rlstack.payload.padding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.payload import padding

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _llama(tmp_path: Path, *, tied: bool, **over: object) -> Path:
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=tied, **over)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms at 1 would hide a wrong rescale: make them differ per channel
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    out = tmp_path / ("tied" if tied else "untied")
    model.save_pretrained(str(out))
    return out


def _logits(folder: Path, ids: object) -> object:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("tied", [True, False])
def test_padded_copy_has_aligned_widths_and_the_same_logits(tmp_path: Path, tied: bool) -> None:
    src = _llama(tmp_path, tied=tied)
    dst = tmp_path / "padded"
    widths = padding.pad_folder(src, dst, 32)
    cfg = json.loads((dst / "config.json").read_text())
    # 2 kv heads x 8 = 16 is not a multiple of 32: 4 kv heads, 12 query heads (the group of 3 kept), hidden 96
    assert (widths.kv_heads, widths.heads, widths.hidden) == (4, 12, 96)
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (
        96, 12, 4, 8)
    state = safetensors_torch.load_file(str(dst / padding.WEIGHTS))
    assert all(s % 32 == 0 for t in state.values() for s in t.shape[-1:]), "every input width is block-aligned"
    ids = torch.randint(0, 96, (2, 17), generator=torch.Generator().manual_seed(1))
    a, b = _logits(src, ids), _logits(dst, ids)
    assert float((a - b).abs().max()) < 1e-5


def test_without_the_norm_rescale_the_function_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: padding the hidden size without rescaling the norms moves the logits."""
    src = _llama(tmp_path, tied=True)
    monkeypatch.setattr(padding.math, "sqrt", lambda x: 1.0)
    padding.pad_folder(src, tmp_path / "bad", 32)
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(2))
    assert float((_logits(src, ids) - _logits(tmp_path / "bad", ids)).abs().max()) > 1e-3


def test_refuses_what_it_cannot_pad(tmp_path: Path) -> None:
    src = _llama(tmp_path, tied=True, attention_bias=True)
    with pytest.raises(padding.PaddingError, match="biases"):
        padding.pad_folder(src, tmp_path / "x", 32)
    config = json.loads((_llama(tmp_path, tied=False) / "config.json").read_text())
    with pytest.raises(padding.PaddingError, match="not part of the Llama layout"):
        padding.pad_state({"model.extra.weight": torch.zeros(3, 48)}, config, 32)
    with pytest.raises(padding.PaddingError, match="intermediate size 64"):
        padding.pad_state({}, config, 128)
