"""Shims for the locked library versions (rlstack.payload.train.compat)."""

from __future__ import annotations

import sys
import types
from typing import Any, ClassVar

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


@pytest.mark.parametrize("loader", ["unsloth", "unsloth-fp8", "transformers"])
@pytest.mark.parametrize("checkpointing", [True, False])
def test_trainer_config_keeps_the_recipes_checkpointing_and_exports_precision(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, loader: str, checkpointing: bool) -> None:
    """Unsloth's trainer applies args.gradient_checkpointing to every layer around each step (for_training), so the
    config must carry the recipe's value under Unsloth too: False there switched checkpointing off in the 2026-12-03
    fp8 run. And ACCELERATE_MIXED_PRECISION is set before the trainer exists (its loss reads it)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    import os

    from rlstack.payload.recipes import load
    from rlstack.payload.train.grpo import trainer_config
    from rlstack.payload.train.loading import Loaded

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    recipe = load("gsm8k-grpo", [f"grpo.gradient_checkpointing={str(checkpointing).lower()}"])
    loaded = Loaded(model=torch.nn.Linear(2, 2), tokenizer=None, base_model="b", loader=loader, device="cpu")
    config = trainer_config(recipe, loaded, tmp_path / "checkpoints")
    assert config.gradient_checkpointing is checkpointing
    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "no"  # the CPU trains in float32


def test_the_recipes_loss_options_survive_a_config_that_overrides_them(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Any,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Unsloth's GRPOConfig sets mask_truncated_completions=True and epsilon_high=0.28 for loss_type dapo whatever
    it is given; rlstack sets the recipe's back and says so. A config that keeps them is left alone, silently."""
    trl = pytest.importorskip("trl")
    import dataclasses

    from rlstack.payload.recipes import load
    from rlstack.payload.train.grpo import grpo_config

    @dataclasses.dataclass
    class ForcingConfig(trl.GRPOConfig):  # type: ignore[misc]
        def __post_init__(self) -> None:
            super().__post_init__()
            if self.loss_type == "dapo":
                self.mask_truncated_completions, self.epsilon_high = True, 0.28

    monkeypatch.setattr(trl, "GRPOConfig", ForcingConfig)
    smoke = load("smoke-cpu")
    config = grpo_config(smoke, tmp_path, use_vllm=False, dtype_name="float32")
    assert config.mask_truncated_completions is False and config.epsilon_high is None
    said = capsys.readouterr().err
    assert "mask_truncated_completions True -> False" in said and "epsilon_high 0.28 -> None" in said
    report = load("gsm8k-grpo")  # DAPO's two, explicit in the report's recipe: nothing to set back
    config = grpo_config(report, tmp_path, use_vllm=False, dtype_name="float32")
    assert config.mask_truncated_completions is True and config.epsilon_high == 0.28
    assert "kept over" not in capsys.readouterr().err
    monkeypatch.undo()
    plain = grpo_config(smoke, tmp_path, use_vllm=False, dtype_name="float32")  # TRL's own: the same values
    assert plain.mask_truncated_completions is False and plain.epsilon_high in (None, plain.epsilon)


@pytest.mark.parametrize(("mask", "loader", "zoo", "applies"), [
    (True, "transformers", None, True),  # TRL's own loss honours it
    (True, "unsloth", "2026.6.1", False),  # zoo 2026.6.1 rebuilds the completion mask from the ids
    (True, "unsloth-fp8", "2026.10.6", True),  # zoo 2026.10.6 reapplies TRL's rows
    (True, "unsloth", "2026.8.1", False),  # not read: no claim
    (True, "unsloth", None, False),
    (True, "unsloth", "not-a-version", False),
    (False, "transformers", None, False),
])
def test_truncation_mask_applies_where_the_loss_honours_it(mask: bool, loader: str, zoo: str | None,
                                                           applies: bool) -> None:
    from rlstack.payload.train.compat import truncation_mask_applies

    assert truncation_mask_applies(mask, loader, zoo) is applies


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

    src = inspect.getsource(grpo._train)
    assert "alias_guided_decoding_params()" in src
    assert src.index("alias_guided_decoding_params()") < src.index("from trl import GRPOTrainer")


class _FakeAOTensor:
    """Stands in for a torchao Float8Tensor parameter: only its class's module is looked at."""


_FakeAOTensor.__module__ = "torchao.quantization.quantize_.workflows.float8.float8_tensor"


class _FakeModel:
    load_lora: Any = None  # Unsloth's get_peft_model sets it when the model has a vLLM engine

    def __init__(self, params: list[object]) -> None:
        self._params = params

    def parameters(self) -> list[object]:
        return list(self._params)


def _zoo_style_load_lora() -> Any:
    """Like unsloth_zoo.vllm_utils.load_lora (2026.7.6-2026.10.6): a function decorated with torch.inference_mode
    that reads model.state_dict(). Records the modes it ran under."""
    import torch

    @torch.inference_mode
    def load_lora(model: object, save_directory: str, load_tensors: bool = False,
                  lora_request_id: int | None = None) -> dict[str, object]:
        return {"model": model, "dir": save_directory, "load_tensors": load_tensors, "id": lora_request_id,
                "inference_mode": torch.is_inference_mode_enabled(), "grad": torch.is_grad_enabled()}

    return load_lora


def test_load_lora_leaves_inference_mode_for_torchao_weights() -> None:
    """zoo's load_lora detaches the torchao FP8 weights under inference mode: 'Cannot set version_counter for
    inference tensor' at the first rollout (H200, zoo 2026.7.6). The shim runs it under no_grad instead."""
    import functools

    import torch

    from rlstack.payload.train.compat import load_lora_outside_inference_mode

    load_lora = _zoo_style_load_lora()
    model = _FakeModel([torch.zeros(1), _FakeAOTensor()])
    model.load_lora = functools.partial(load_lora, model)  # as Unsloth binds it
    assert model.load_lora("d", load_tensors=True)["inference_mode"] is True
    assert load_lora_outside_inference_mode(model) is True
    got = model.load_lora("d", load_tensors=True)  # as Unsloth's trainer calls it
    assert got["inference_mode"] is False and got["grad"] is False
    assert got["model"] is model and got["dir"] == "d" and got["load_tensors"] is True and got["id"] is None
    assert model.load_lora("e", lora_request_id=3)["id"] == 3
    with torch.inference_mode():  # a caller inside inference mode does not put it back
        assert model.load_lora("d")["inference_mode"] is False
    assert load_lora_outside_inference_mode(model) is False  # already rebound: nothing more to do


def test_load_lora_left_alone_without_torchao_or_zoo_partial() -> None:
    import functools

    import torch

    from rlstack.payload.train.compat import load_lora_outside_inference_mode

    load_lora = _zoo_style_load_lora()
    plain = _FakeModel([torch.zeros(1)])  # a bf16 / 4-bit model: zoo's own inference mode is fine there
    plain.load_lora = functools.partial(load_lora, plain)
    bound = plain.load_lora
    assert load_lora_outside_inference_mode(plain) is False
    assert plain.load_lora is bound
    assert load_lora_outside_inference_mode(_FakeModel([_FakeAOTensor()])) is False  # no load_lora (no vLLM engine)
    other = _FakeModel([_FakeAOTensor()])
    other.load_lora = functools.partial(lambda m, d: d, other)  # not a decorated zoo function
    assert load_lora_outside_inference_mode(other) is False


class _RecordingFastLanguageModel:
    """A fake `unsloth.FastLanguageModel` (unsloth needs a GPU to import) that records what the loader asks for."""

    calls: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    @classmethod
    def from_pretrained(cls, **kwargs: Any) -> tuple[Any, Any]:
        cls.calls.append(("from_pretrained", kwargs))
        return types.SimpleNamespace(name="base"), types.SimpleNamespace(name="tok")

    @classmethod
    def get_peft_model(cls, model: Any, **kwargs: Any) -> Any:
        cls.calls.append(("get_peft_model", kwargs))
        return types.SimpleNamespace(name="peft")


@pytest.mark.parametrize(("scheme", "asked"), [("block", "block"), ("row", True)])
def test_fp8_loader_asks_for_the_scheme_then_applies_the_shims(monkeypatch: pytest.MonkeyPatch, scheme: str,
                                                                asked: object) -> None:
    """--fp8 asks Unsloth for the recipe's FP8 scheme with vLLM rollouts, and the torchao shims run after
    get_peft_model (which binds load_lora), on the model the trainer will get."""
    from rlstack.payload.recipes import LoraSpec, ModelSpec
    from rlstack.payload.train import compat, loading

    _RecordingFastLanguageModel.calls = []
    fake = types.ModuleType("unsloth")
    fake.FastLanguageModel = _RecordingFastLanguageModel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "unsloth", fake)
    monkeypatch.setattr(loading, "has", lambda module: True)
    shimmed: list[tuple[str, object]] = []
    monkeypatch.setattr(compat, "load_lora_outside_inference_mode",
                        lambda m: shimmed.append(("load_lora", m.name)) or True)
    monkeypatch.setattr(compat, "mark_torchao_fp8_for_no_grad", lambda m: shimmed.append(("tag", m.name)) or False)

    loaded = loading._load_unsloth("/models/x", "x", ModelSpec(name="/models/x", fp8_scheme=scheme),  # type: ignore[arg-type]
                                   LoraSpec(r=16, alpha=16), fp8=True, seed=3, gc=False)
    (name, kwargs), (peft_name, _) = _RecordingFastLanguageModel.calls
    assert (name, peft_name) == ("from_pretrained", "get_peft_model")
    assert kwargs["load_in_fp8"] == asked and kwargs["fast_inference"] is True and kwargs["max_lora_rank"] == 16
    assert shimmed == [("load_lora", "peft"), ("tag", "peft")]
    assert loaded.model.name == "peft" and loaded.loader == "unsloth-fp8"


def test_fp8_scheme_is_checked() -> None:
    from pydantic import ValidationError

    from rlstack.payload.recipes import ModelSpec

    with pytest.raises(ValidationError, match="fp8_scheme"):
        ModelSpec(name="x", fp8_scheme="tensor")  # type: ignore[arg-type]


def _fake_tagger(monkeypatch: pytest.MonkeyPatch, *, works: bool = True) -> list[tuple[object, str]]:
    """A fake `unsloth.models.loader_utils._tag_model_with_fp8_torchao_config` (unsloth needs a GPU to import)."""
    calls: list[tuple[object, str]] = []

    def tag(model: Any, fp8_mode: str) -> None:
        calls.append((model, fp8_mode))
        if works:
            model.torchao_config = types.SimpleNamespace(qat_scheme=None)

    unsloth = types.ModuleType("unsloth")
    models = types.ModuleType("unsloth.models")
    loader_utils = types.ModuleType("unsloth.models.loader_utils")
    loader_utils._tag_model_with_fp8_torchao_config = tag  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "unsloth", unsloth)
    monkeypatch.setitem(sys.modules, "unsloth.models", models)
    monkeypatch.setitem(sys.modules, "unsloth.models.loader_utils", loader_utils)
    return calls


class _FakePeft(_FakeModel):
    def __init__(self, base: _FakeModel) -> None:
        super().__init__(base.parameters())
        self.base = base

    def get_base_model(self) -> _FakeModel:
        return self.base


def test_torchao_fp8_model_is_tagged_for_no_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unsloth tags load_in_fp8 models with torchao_config (its GRPO forwards then use no_grad), but not a local
    folder: its fp8 mode is None there. The shim tags the base model as Unsloth would have, row-wise."""
    from rlstack.payload.train.compat import mark_torchao_fp8_for_no_grad

    calls = _fake_tagger(monkeypatch)
    base = _FakeModel([_FakeAOTensor()])
    peft = _FakePeft(base)
    assert mark_torchao_fp8_for_no_grad(peft) is True
    assert calls == [(base, "row")]
    assert base.torchao_config.qat_scheme is None  # type: ignore[attr-defined]
    assert mark_torchao_fp8_for_no_grad(peft) is False  # tagged already
    assert len(calls) == 1


def test_torchao_tag_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from rlstack.payload.train.compat import mark_torchao_fp8_for_no_grad

    calls = _fake_tagger(monkeypatch, works=False)
    assert mark_torchao_fp8_for_no_grad(_FakeModel([torch.zeros(1)])) is False  # no torchao weights
    assert calls == []
    assert mark_torchao_fp8_for_no_grad(_FakeModel([_FakeAOTensor()])) is False  # the tagger failed quietly
    assert len(calls) == 1
    monkeypatch.setitem(sys.modules, "unsloth.models.loader_utils", None)  # an unsloth without the tagger
    assert mark_torchao_fp8_for_no_grad(_FakeModel([_FakeAOTensor()])) is False


def _wrapper_subclass() -> type:
    """A wrapper tensor subclass with torchao's detach (return_and_correct_aliasing), named like a torchao class."""
    import torch
    from torch.utils._python_dispatch import return_and_correct_aliasing

    class Wrapped(torch.Tensor):
        @staticmethod
        def __new__(cls, data: torch.Tensor) -> Any:
            return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

        def __init__(self, data: torch.Tensor) -> None:
            self._data = data

        def __tensor_flatten__(self) -> tuple[list[str], None]:
            return ["_data"], None

        @staticmethod
        def __tensor_unflatten__(inner: dict[str, Any], meta: None, size: Any, stride: Any) -> Any:
            return Wrapped(inner["_data"])

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten.detach.default:
                return return_and_correct_aliasing(func, args, kwargs or {}, Wrapped(args[0]._data.detach()))
            raise NotImplementedError(func)

    Wrapped.__module__ = "torchao.quantization.fake"
    return Wrapped


def test_load_lora_shim_on_a_real_tensor_subclass() -> None:
    """The wall itself, on the CPU: zoo's load_lora reads model.state_dict() in inference mode, which detaches a
    torchao-style wrapper parameter made outside inference mode (as the Trainer's model.to(device) leaves it) and
    dies with 'Cannot set version_counter for inference tensor'. Through the shim the same call succeeds."""
    import functools

    import torch

    from rlstack.payload.train.compat import load_lora_outside_inference_mode

    model = torch.nn.Linear(3, 2, bias=False)
    model.weight = torch.nn.Parameter(_wrapper_subclass()(torch.randn(2, 3)), requires_grad=False)
    model.lora_A = torch.nn.Parameter(torch.zeros(1, 3))

    @torch.inference_mode
    def load_lora(model: Any, save_directory: str, load_tensors: bool = False) -> dict[str, Any]:
        return {k: v for k, v in model.state_dict().items() if k.startswith("lora_")}

    model.load_lora = functools.partial(load_lora, model)
    with pytest.raises(RuntimeError, match="version_counter"):
        model.load_lora("d", load_tensors=True)
    assert load_lora_outside_inference_mode(model) is True
    got = model.load_lora("d", load_tensors=True)
    assert list(got) == ["lora_A"] and not got["lora_A"].requires_grad
