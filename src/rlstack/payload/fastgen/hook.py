"""Swap fastgen in behind ``model.generate`` so TRL's GRPOTrainer (use_vllm=False) uses it unchanged.

TRL 0.24 generates with ``unwrapped_model.generate(**inputs, generation_config=..., disable_compile=True)`` where
``unwrapped_model`` is the very PEFT model object the trainer holds. Setting an instance attribute ``generate`` on
that object reroutes exactly that call; anything fastgen cannot serve (beam search, repetition penalty, ...) falls
through to the original method, so behaviour never silently changes.
"""

from __future__ import annotations

import logging
from typing import Any

from rlstack.payload.fastgen.engine import FastgenError, get_engine, sampling_from_generation_config

_ORIGINAL_ATTR = "_rlstack_fastgen_original_generate"
log = logging.getLogger(__name__)


def install(model: Any, **engine_options: Any) -> Any:
    """Make ``model.generate`` use fastgen (engine built lazily on the first call). Returns the model.

    engine_options: compile (default: on CUDA), merge_lora (default True), length_bucket (128),
    compile_mode ("reduce-overhead").
    """
    if installed(model):
        return model
    original = model.generate  # bound method of the class

    def fast_generate(*args: Any, **kwargs: Any) -> Any:
        try:
            return _serve(model, original, engine_options, args, kwargs)
        except FastgenError as exc:
            log.warning("fastgen: falling back to model.generate: %s", exc)
            return original(*args, **kwargs)

    object.__setattr__(model, _ORIGINAL_ATTR, original)
    object.__setattr__(model, "generate", fast_generate)
    return model


def install_on_trainer(trainer: Any, **engine_options: Any) -> Any:
    """install() on the model a (GRPO) trainer generates with; call after the trainer is constructed."""
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped) if hasattr(trainer, "accelerator") \
        else trainer.model
    return install(model, **engine_options)


def installed(model: Any) -> bool:
    return _ORIGINAL_ATTR in vars(model)


def uninstall(model: Any) -> None:
    """Restore the class's generate (the engine and its caches are dropped with it)."""
    if not installed(model):
        return
    del model.__dict__["generate"]
    del model.__dict__[_ORIGINAL_ATTR]
    model.__dict__.pop("_rlstack_fastgen_engine", None)


def _serve(model: Any, original: Any, options: dict[str, Any], args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> Any:
    import copy

    kwargs = dict(kwargs)
    kwargs.pop("disable_compile", None)
    input_ids = kwargs.pop("input_ids", args[0] if args else None)
    attention_mask = kwargs.pop("attention_mask", None)
    generator = kwargs.pop("generator", None)
    gc = kwargs.pop("generation_config", None)
    if input_ids is None or (args and len(args) > 1):
        raise FastgenError("fastgen needs input_ids (and optionally attention_mask) as keywords", "")
    gc = copy.deepcopy(model.generation_config) if gc is None else copy.deepcopy(gc)
    generation_fields = {k: v for k, v in kwargs.items() if hasattr(gc, k)}
    others = set(kwargs) - set(generation_fields) - {"use_cache", "return_dict_in_generate"}
    if others:
        raise FastgenError(f"fastgen does not take generate arguments {sorted(others)}", "")
    gc.update(**generation_fields)
    if gc.return_dict_in_generate or gc.output_scores or gc.output_logits:
        raise FastgenError("fastgen returns plain token tensors only", "")
    sampling, max_new_tokens = sampling_from_generation_config(gc, model)
    return get_engine(model, **options).generate(input_ids, attention_mask, max_new_tokens, sampling, generator)
