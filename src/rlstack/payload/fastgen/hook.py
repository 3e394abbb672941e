"""Swap fastgen in behind ``model.generate`` so TRL's GRPOTrainer (use_vllm=False) uses it unchanged.

TRL 0.24 generates with ``unwrapped_model.generate(**inputs, generation_config=..., disable_compile=True)`` where
``unwrapped_model`` is the very PEFT model object the trainer holds. Setting an instance attribute ``generate`` on
that object reroutes exactly that call. Under Unsloth the same holds: Unsloth replaces ``generate`` on the *base*
model (``unsloth_fast_generate``, reached through PeftModel.generate), and its GRPO trainer wraps the PEFT model's
``generate`` attribute for the duration of a generation and puts it back afterwards, so the hook on the PEFT model
is what runs and Unsloth's generate is not called (it stays the fallback).

Fallback, once: the first exception of any kind in the fast path (an option fastgen does not implement, a shadow
that cannot be built, not enough GPU memory, a compile or CUDA error) prints its reason once, frees the engine
and sends this and every later call of the run to the original ``generate``. Why not retry: each retry would
rebuild the shadow (seconds, and gigabytes) to fail the same way, every step.

Once it has served a call, the hook says how, once (``FastGenerator.describe``: the shadow, fused projections,
the graph mode), so a training log records which path its rollouts took.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from rlstack.payload.fastgen.api import get_engine, release
from rlstack.payload.fastgen.errors import FastgenError, error_text
from rlstack.payload.fastgen.options import FastgenOptions
from rlstack.payload.fastgen.sampling import resolve_generation_config, sampling_from_resolved

_ORIGINAL_ATTR = "_rlstack_fastgen_original_generate"
_FAILED_ATTR = "_rlstack_fastgen_failed"
log = logging.getLogger(__name__)


def install(model: Any, options: FastgenOptions | None = None, **engine_options: Any) -> Any:
    """Make ``model.generate`` use fastgen (engine built lazily on the first call). Returns the model.

    ``options`` (a FastgenOptions; its fields as keywords on top, ``engine_options``) are checked here, at
    install; the engine that uses them is made on the first call."""
    if installed(model):
        return model
    chosen = FastgenOptions.of(options, **engine_options)
    original = model.generate  # bound method of the class (under Unsloth: PeftModel.generate -> Unsloth's)

    def fast_generate(*args: Any, **kwargs: Any) -> Any:
        if failure(model) is None:
            try:
                return _serve(model, chosen, args, kwargs)
            except Exception as exc:
                _mark_failed(model, exc)
        return original(*args, **kwargs)

    object.__setattr__(model, _ORIGINAL_ATTR, original)
    object.__setattr__(model, "generate", fast_generate)
    return model


def install_on_trainer(trainer: Any, options: FastgenOptions | None = None, **engine_options: Any) -> Any:
    """install() on the model a (GRPO) trainer generates with; call after the trainer is constructed."""
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped) if hasattr(trainer, "accelerator") \
        else trainer.model
    return install(model, options, **engine_options)


def installed(model: Any) -> bool:
    return _ORIGINAL_ATTR in vars(model)


def failure(model: Any) -> str | None:
    """Why fastgen stopped serving this model for the rest of the run (None while it serves)."""
    return vars(model).get(_FAILED_ATTR)


def uninstall(model: Any) -> None:
    """Restore the class's generate (the engine and its caches are released with it, the failure mark dropped).

    Through release(), not by dropping the attribute: the engine sits in reference cycles, and dropped here it
    stayed allocated until the cyclic collector ran, while a release() after this found no engine to collect
    (bench/rollout_peers.py's second variant then peaked with the first's memory still held: docs/archive/notes.md)."""
    if not installed(model):
        return
    del model.__dict__["generate"]
    del model.__dict__[_ORIGINAL_ATTR]
    model.__dict__.pop(_FAILED_ATTR, None)
    release(model)


def _mark_failed(model: Any, exc: BaseException) -> None:
    """Record the failure, drop the engine (its shadow, caches and CUDA graphs hold GPU memory the original
    generate may need) and say so once, on stderr, where the trainer's progress lines go."""
    reason = error_text(exc)
    if not isinstance(exc, FastgenError):  # an unexpected failure: keep its traceback in the log
        log.warning("fastgen failed", exc_info=exc)
    object.__setattr__(model, _FAILED_ATTR, reason)
    release(model)
    one_line = " ".join(reason.split())
    print(f"rlstack fastgen: falling back to the model's own generate for the rest of this run: {one_line}",
          file=sys.stderr, flush=True)


def _serve(model: Any, options: FastgenOptions | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    kwargs = dict(kwargs)
    kwargs.pop("disable_compile", None)
    input_ids = kwargs.pop("input_ids", args[0] if args else None)
    attention_mask = kwargs.pop("attention_mask", None)
    generator = kwargs.pop("generator", None)
    gc = kwargs.pop("generation_config", None)
    if input_ids is None or (args and len(args) > 1):
        raise FastgenError("fastgen needs input_ids (and optionally attention_mask) as keywords", "")
    resolved = resolve_generation_config(gc, model, **kwargs)
    if resolved.return_dict_in_generate or resolved.output_scores or resolved.output_logits:
        raise FastgenError("fastgen returns plain token tensors only", "")
    sampling, max_new_tokens = sampling_from_resolved(resolved)
    out = get_engine(model, options).generate(input_ids, attention_mask, max_new_tokens, sampling, generator)
    say_how_once(model, "rlstack fastgen:")
    return out


def say_how_once(model: Any, prefix: str) -> None:
    """After a served call (the shadow, graph and fusion exist by then), print once per engine, on stderr, how
    fastgen generates (``FastGenerator.describe``): `rlstack train`'s hook and `rlstack eval --fastgen` both. Per
    engine, not per model: an engine built again (after ``release``, with other options) serves another way."""
    engine = get_engine(model)
    if not engine.announced:  # kept on the engine: a reference on the model would keep a released engine alive
        engine.announced = True
        print(f"{prefix} generating with {engine.describe()}", file=sys.stderr, flush=True)
