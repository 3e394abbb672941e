"""Shims for the locked library versions (rlstack.payload.train.compat)."""

from __future__ import annotations

import sys
import types

import pytest


def test_mixed_precision_is_exported_for_unsloth(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5 no longer exports ACCELERATE_MIXED_PRECISION; unsloth's loss reads it (default fp16)."""
    from rlstack.payload.train.compat import export_mixed_precision

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    assert export_mixed_precision(True, False) == "bf16"
    import os

    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert export_mixed_precision(False, True) == "fp16"
    assert export_mixed_precision(False, False) == "no"


class _StructuredOutputsParams:
    def __init__(self, regex: str | None = None) -> None:
        self.regex = regex


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, **names: object) -> types.ModuleType:
    """Put a fake `vllm` and `vllm.sampling_params` (holding `names`) in sys.modules for this test only."""
    vllm = types.ModuleType("vllm")
    sp = types.ModuleType("vllm.sampling_params")
    for name, value in names.items():
        setattr(sp, name, value)
    vllm.sampling_params = sp  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    return sp


def test_guided_decoding_params_aliased_for_new_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM >= 0.12 has only StructuredOutputsParams; trl 0.24 imports GuidedDecodingParams from it."""
    from rlstack.payload.train.compat import alias_guided_decoding_params

    sp = _fake_vllm(monkeypatch, StructuredOutputsParams=_StructuredOutputsParams)
    assert alias_guided_decoding_params() is True
    assert sp.GuidedDecodingParams is _StructuredOutputsParams  # type: ignore[attr-defined]
    from vllm.sampling_params import GuidedDecodingParams  # type: ignore[import-not-found]  # trl's own import

    assert GuidedDecodingParams(regex="####").regex == "####"  # trl 0.24 builds it as (regex=...)
    assert alias_guided_decoding_params() is False  # already there: nothing more to do


def test_guided_decoding_params_left_alone_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlstack.payload.train.compat import alias_guided_decoding_params

    class Old:
        pass

    sp = _fake_vllm(monkeypatch, GuidedDecodingParams=Old, StructuredOutputsParams=_StructuredOutputsParams)
    assert alias_guided_decoding_params() is False
    assert sp.GuidedDecodingParams is Old  # type: ignore[attr-defined]
    sp = _fake_vllm(monkeypatch)  # an old vLLM with neither name: nothing to alias to
    assert alias_guided_decoding_params() is False
    assert not hasattr(sp, "GuidedDecodingParams")


def test_guided_decoding_params_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import importlib.util

    from rlstack.payload.train.compat import alias_guided_decoding_params

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.delitem(sys.modules, "vllm.sampling_params", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))

    def no_import(name: str, *a: object) -> None:
        raise AssertionError(f"imported {name} although vllm is not installed")

    monkeypatch.setattr(importlib, "import_module", no_import)
    assert alias_guided_decoding_params() is False


def test_training_aliases_before_importing_the_trainer() -> None:
    """The transformers loader never imports unsloth (which sets the alias itself), so train must."""
    import inspect

    from rlstack.payload.train import grpo

    src = inspect.getsource(grpo.run)
    assert "alias_guided_decoding_params()" in src
    assert src.index("alias_guided_decoding_params()") < src.index("from trl import GRPOTrainer")
