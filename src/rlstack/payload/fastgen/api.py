"""The per-model engine and the drop-in ``generate``: one FastGenerator a model, made on first use and released
(with its shadow, caches and graphs) when the slower path needs the memory. torch is imported inside functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlstack.payload.fastgen.engine import FastGenerator
from rlstack.payload.fastgen.keywords import ENGINE_ATTR
from rlstack.payload.fastgen.options import FastgenOptions
from rlstack.payload.fastgen.sampling import Sampling, sampling_from_generation_config


def release(model: Any) -> None:
    """Drop the model's engine (its bf16 shadow, static caches and CUDA graphs) and return the freed memory to the
    allocator, for the slower path that runs next (transformers' generate) to use. Best effort: never raises.

    Why a collection first: the engine sits in reference cycles (its compiled step and its draw's closures refer
    back to it), so dropping it freed nothing until Python's cyclic collector happened to run: a second engine in
    one process then peaked with the first's shadow and caches still allocated (docs/archive/notes.md; hook.uninstall
    releases through here for that reason)."""
    if vars(model).pop(ENGINE_ATTR, None) is not None:
        import gc

        gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # freeing cached memory is an optimisation; the fallback must still run
        pass


def get_engine(model: Any, options: FastgenOptions | None = None, **keywords: Any) -> FastGenerator:
    """The model's FastGenerator, created on first use (``options``, and keywords on top of them, only apply then).

    Looked up in the object's own attributes, never through getattr: a PeftModel forwards unknown attributes to
    the model it wraps, so getattr found the engine built on the bare base before LoRA wrapped it, and decoded
    without the adapter (caught by the eval test's LoRA case once the tiny model's weights changed)."""
    engine = vars(model).get(ENGINE_ATTR) if hasattr(model, "__dict__") else getattr(model, ENGINE_ATTR, None)
    if engine is None or engine.model is not model:
        engine = FastGenerator(model, options, **keywords)
        object.__setattr__(model, ENGINE_ATTR, engine) if _is_module(model) else setattr(model, ENGINE_ATTR, engine)
    return engine


def _is_module(model: Any) -> bool:
    try:
        import torch

        return isinstance(model, torch.nn.Module)
    except ImportError:  # pragma: no cover - torch is present wherever a model is
        return False


def generate(model: Any, input_ids: Any, attention_mask: Any | None = None, max_new_tokens: int = 256, *,
             generation_config: Any = None, do_sample: bool = True, temperature: float = 1.0,
             top_k: int | None = None, top_p: float = 1.0, min_p: float | None = None, min_new_tokens: int = 0,
             eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
             generator: Any = None, options: FastgenOptions | None = None, **engine_options: Any) -> Any:
    """Fast drop-in for ``model.generate(input_ids, attention_mask, ...)`` returning [B, P + T] ids.

    Pass either a transformers ``generation_config`` (resolved exactly like ``generate`` does, including its
    global defaults such as top_k=50) or the explicit sampling arguments. ``options`` (a FastgenOptions) and
    ``engine_options`` (its fields as keywords, on top) configure the per-model engine the first time it is
    created.
    """
    if generation_config is not None:
        sampling, max_new_tokens = sampling_from_generation_config(generation_config, model)
    else:
        eos_ids = () if eos_token_id is None else (
            (int(eos_token_id),) if isinstance(eos_token_id, int) else tuple(int(e) for e in eos_token_id))
        sampling = Sampling(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            min_new_tokens=min_new_tokens, eos_token_ids=eos_ids,
                            pad_token_id=int(pad_token_id if pad_token_id is not None else
                                             (eos_ids[0] if eos_ids else 0)))
    return get_engine(model, options, **engine_options).generate(input_ids, attention_mask, max_new_tokens, sampling,
                                                        generator)
