"""A fast, portable rollout generator for GRPO: static KV cache + a compiled (CUDA-graphed) decode step.

Why: with ``use_vllm=False`` TRL calls ``model.generate`` eagerly on the PEFT model with a dynamic cache. For a 4B
model at batch 8 every decode step is ~1,000 small kernel launches issued from Python (plus LoRA's extra two
matmuls per projection), so the GPU idles most of the time while the step is memory-bound at ~2 ms. This module
keeps everything inside the portable stack (torch + transformers + peft, no vLLM):

* LoRA is folded into a *shadow* copy of the projection weights (``W + scale * B @ A``, refreshed before every
  generation, base weights never modified, so training sees exactly the weights it had). 4-bit bitsandbytes bases
  are dequantized into the shadow. Everything else (embeddings, norms, rotary buffers) is shared, not copied.
* The KV cache is a transformers ``StaticCache`` sized to a bucketed length, so every decode step has the same
  shapes and ``torch.compile(mode="reduce-overhead")`` replays one CUDA graph per step.
* Sampling reproduces transformers' default logits warpers (min_new_tokens, temperature, top-k, top-p, min-p) in
  torch on the float32 logits, so the distribution is the one TRL samples from; the generation config is
  resolved by the model's own ``_prepare_generation_config``, so transformers 4.57 and 5.x each get their own rules.
  On CUDA the pick (sampling, EOS bookkeeping, the next step's inputs) can be captured into the same graph as
  the decode step, so the loop launches nothing but replays (``sample_in_graph``). Off by default: its A/B on
  the H200 (2026-12-04, one lease) gave 4.68 against 4.72 ms a token at 8 sequences and 7.42 against 7.45 at
  64, because the pick's GPU work stays in the graph (0.23 / 0.47 ms); its GPU tests pass.
* Each layer's q/k/v and gate/up projections run as one GEMM each (``fuse_projections``, ``fastgen.fused``), as
  vLLM serves them. On by default: its A/B on the H200 (2026-12-04, one process, bench/fastgen_profile.py) gave
  4.16 against 4.78 ms a token at 8 sequences and 7.02 against 7.47 at 64 (690 -> 582 kernels a step), and the
  portable GRPO step 2.66 against 3.03 s (rollout 2.17 against 2.42 s); its GPU tests pass.
* Under Unsloth (the portable stack's default loader) the model classes are patched with Unsloth's kernels; the
  shadow is then built from a pristine copy of the modeling module, so decoding runs transformers' code on the
  trained tensors (``patched_members``, ``shadow_class``).
* ``fp8`` (off until measured on a GPU) computes the projections in FP8 (e4m3 weights and activations,
  row-wise or per-tensor scales, ``torch._scaled_mm``), half the weight bytes a step; the rollouts then
  come from an FP8 approximation of the policy (``fastgen.fp8``).
* ``reference_kernels`` trades the fused kernels for generate's own (the model's modules, eager, replayed in a
  CUDA graph), for evaluations that must give generate's greedy tokens (``rlstack eval --fastgen
  --reference-kernels``): fused bf16 kernels flip near-ties (see FastGenerator).
* Nothing is allocated before a memory check: the shadow's and the cache's bytes (``plan_memory``) against free
  GPU memory, refusing with the numbers (``FastgenMemoryError``) when they do not fit with a margin.

Everything heavy is imported inside functions: ``import rlstack.payload.fastgen`` must stay cheap.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from rlstack.core.errors import RlstackError

ENGINE_ATTR = "_rlstack_fastgen_engine"
READ_KWARG = "fastgen_read"  # how many cache slots a decode step's attention reads (attend_bucket)
SLOT_KWARG = "fastgen_slot"  # the [1] tensor of the slot a decode step writes (decode_attention="triton")
GROUPS_KWARG = "fastgen_groups"  # (entry table, prompt length) of shared_prompt (fastgen.split_attention.attend)
TUNING_KWARG = "fastgen_tuning"  # attention_tuning's split_attention.Tuning (decode_attention="triton")
# FastGenerator(decode_attention=...): how a decode step attends; "auto" (the default) picks with auto_attention
DECODE_ATTENTION = ("auto", "matmul", "triton")
FP8_SCALES = ("off", "row", "tensor")  # FastGenerator(fp8=...): off, or the FP8 scales' granularity (fastgen.fp8)
# FastGenerator(draw=...): a sampling pick's top-k and draw in torch, or fastgen.topk_draw; "auto" (the default)
# picks with auto_draw
DRAWS = ("auto", "torch", "triton")


class FastgenError(RlstackError):
    """A generation request fastgen cannot serve (the caller may fall back to ``model.generate``)."""


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The subset of a GenerationConfig fastgen implements; same semantics and order as transformers' warpers."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float | None = None
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0


_UNSUPPORTED_IF_SET = {
    # field: the value that means "off" in transformers
    "num_beams": 1,
    "num_beam_groups": 1,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "num_return_sequences": 1,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "encoder_repetition_penalty": 1.0,
    "length_penalty": 1.0,
    "min_length": 0,
    "remove_invalid_values": False,
}
_UNSUPPORTED_IF_NOT_NONE = ("bad_words_ids", "force_words_ids", "suppress_tokens", "begin_suppress_tokens",
                            "sequence_bias", "guidance_scale", "watermarking_config", "stop_strings",
                            "assistant_model", "prompt_lookup_num_tokens", "forced_bos_token_id",
                            "forced_eos_token_id", "exponential_decay_length_penalty", "max_time", "top_h")


def resolve_generation_config(gc: Any, model: Any = None, **kwargs: Any) -> Any:
    """The GenerationConfig ``model.generate(generation_config=gc, **kwargs)`` would run with.

    Why not merge the configs ourselves: the rule differs between transformers versions, and getting it wrong
    changes what is sampled. transformers 5 fills only the fields the caller left None, from the model's config and
    then from global defaults (TRL's ``top_k=None`` becomes 50). transformers 4.57 keeps the caller's values and
    replaces only those still equal to the global default by the model's (``top_k=None`` stays None: no top-k);
    its ``GenerationConfig.update`` has no ``defaults_only`` and overwrote every field, which is how fastgen lost
    TRL's max_new_tokens there. So ask the model: its own ``_prepare_generation_config`` (present in both, called
    by ``generate`` itself). Without a model (or one lacking it), fill the None fields, as transformers 5 does.
    kwargs that are not generation options raise FastgenError.
    """
    import copy

    prepare = getattr(model, "_prepare_generation_config", None) if model is not None else None
    if callable(prepare):
        resolved, unused = prepare(gc, **kwargs)
        if unused:
            raise FastgenError(f"fastgen does not take generate arguments {sorted(unused)}", "")
        return resolved
    if gc is None:
        from transformers import GenerationConfig

        gc = GenerationConfig()
    resolved = copy.deepcopy(gc)
    model_gc = getattr(model, "generation_config", None)
    fills: list[dict[str, Any]] = [model_gc.to_dict()] if model_gc is not None else []
    defaults_fn = getattr(type(resolved), "_get_default_generation_params", None)
    if defaults_fn is not None:
        fills.append(defaults_fn())
    for fill in fills:
        for key, value in fill.items():
            if not key.startswith("_") and getattr(resolved, key, None) is None:
                setattr(resolved, key, value)
    unused = {k for k in kwargs if not hasattr(resolved, k)}
    if unused:
        raise FastgenError(f"fastgen does not take generate arguments {sorted(unused)}", "")
    for key, value in kwargs.items():
        setattr(resolved, key, value)
    return resolved


def sampling_from_generation_config(gc: Any, model: Any = None, **kwargs: Any) -> tuple[Sampling, int]:
    """Resolve a GenerationConfig (plus generate kwargs) exactly as ``model.generate`` would
    (``resolve_generation_config``) and return (Sampling, max_new_tokens).

    Raises FastgenError for anything fastgen does not implement, so callers can fall back to ``generate``.
    """
    return sampling_from_resolved(resolve_generation_config(gc, model, **kwargs))


def sampling_from_resolved(gc: Any) -> tuple[Sampling, int]:
    """(Sampling, max_new_tokens) of an already resolved GenerationConfig (see resolve_generation_config)."""
    for name, off in _UNSUPPORTED_IF_SET.items():
        value = getattr(gc, name, None)
        if value is not None and value != off:
            raise FastgenError(f"fastgen does not implement generation option {name}={value!r}",
                               "use model.generate for this configuration")
    for name in _UNSUPPORTED_IF_NOT_NONE:
        if getattr(gc, name, None) not in (None, [], {}):
            raise FastgenError(f"fastgen does not implement generation option {name}",
                               "use model.generate for this configuration")
    if gc.max_new_tokens is None:
        raise FastgenError("fastgen needs max_new_tokens (the resolved generation config has none)",
                           "set max_new_tokens in the generation config")
    eos = gc.eos_token_id
    eos_ids: tuple[int, ...] = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(int(e) for e in eos))
    pad = gc.pad_token_id if gc.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    sampling = Sampling(
        do_sample=bool(gc.do_sample),
        temperature=float(gc.temperature if gc.temperature is not None else 1.0),
        top_k=int(gc.top_k) if gc.top_k else None,
        top_p=float(gc.top_p if gc.top_p is not None else 1.0),
        min_p=float(gc.min_p) if gc.min_p else None,
        min_new_tokens=int(gc.min_new_tokens or 0),
        eos_token_ids=eos_ids,
        pad_token_id=int(pad),
    )
    return sampling, int(gc.max_new_tokens)


def _mask_eos_before_min(logits: Any, sampling: Sampling, step: Any, eos: Any) -> Any:
    """transformers' MinNewTokensLengthLogitsProcessor (EOS masked while step < min_new_tokens) with the step and
    the EOS ids as device tensors ([1] and [E]): no host sync and no host-to-device copy, so a CUDA graph can
    hold it (a masked logit is -inf either way; an unmasked one gets + 0.0, which leaves every float32 value as it
    was)."""
    import torch

    if not sampling.eos_token_ids or sampling.min_new_tokens <= 0:
        return logits
    penalty = torch.where(step < sampling.min_new_tokens, -math.inf, 0.0).to(logits.dtype)
    logits = logits.clone()
    logits[:, eos] = logits[:, eos] + penalty
    return logits


def _warp(logits: Any, sampling: Sampling) -> Any:
    """Temperature, TopK, TopP, MinP as transformers' warpers apply them (after MinNewTokens): the logits the
    sampling distribution is the softmax of (removed tokens at -inf). The softmax itself is left to the draw,
    which does not need it (see _draw)."""
    import torch

    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:  # 0 or None: no top-k, as transformers' TopK
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if sampling.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - sampling.top_p)
        remove_sorted[..., -1:] = False  # keep at least one token
        remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, -math.inf)
    if sampling.min_p is not None:
        probs = logits.softmax(dim=-1)
        top = probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < sampling.min_p * top, -math.inf)
    return logits


def _draw(warped: Any, generator: Any, invalid: Any) -> Any:
    """torch.multinomial(softmax(warped), 1) as aten computes it for one sample, without the softmax: aten draws
    q ~ Exp(1) and takes argmax(p / q); log is monotone and log p = warped - logsumexp(warped), a constant per
    row, so argmax(warped - log q) is the same token from the same noise of the same generator (the Gumbel-max
    form; equal up to rounding at an exact tie: every seeded CPU test against transformers' generate agrees).
    Why: the pick's GPU work (0.23 ms a token at 8 sequences on the H200, bench/fastgen_profile.py pick_parts)
    held a softmax and a sum over the whole vocabulary besides the top-k and the draw. What it leaves out are
    multinomial's input checks, host syncs that a CUDA graph cannot hold: rows that are not a distribution (a
    NaN or +inf logit, or none finite) are marked in ``invalid`` instead, which the caller checks once per
    generate."""
    import torch

    invalid.logical_or_(~torch.isfinite(warped.amax(dim=-1)))
    q = torch.empty_like(warped).exponential_(1, generator=generator)
    return (warped - q.log()).argmax(dim=-1)


def error_text(exc: BaseException, head: int = 300, tail: int = 1200) -> str:
    """An exception as one string for a warning, the engine's ``*_error`` fields and the fallback's reason (the
    training hook's, the evaluation's): its start (what failed) and
    its end (why). A Triton CompilationError states its reason after the kernel source it quotes: a cut after
    the first 500 characters kept the source and lost the reason (bench/notes.md, the 2026-12-04 20:18 lease)."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) <= head + tail:
        return text
    return f"{text[:head]} [... {len(text) - head - tail} characters ...] {text[-tail:]}"


ATTN_NAME = "rlstack_fastgen"


def gqa_decode_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                         scaling: float | None = None, **kwargs: Any) -> tuple[Any, None]:
    """Attention for the shadow decoder. Prefill (several query tokens) goes to transformers' own sdpa function
    unchanged; a decode step reads the cache up to ``fastgen_read`` (a keyword the engine passes through the
    model's forward, which hands its extra keywords to the attention function in transformers 4.57 and 5.x: the
    filled slots rounded up, ``attend_bucket``; the slots after them are masked out anyway, so the result is the
    same up to the reduction's rounding, and the bytes read follow the generation instead of the cache's length)
    and attends through grouped matmuls that read each KV head once (transformers' sdpa path with a padding mask
    first materializes K/V repeated to every query head, ~4x the cache's bytes written and read again per step);
    with ``fastgen_slot`` (decode_attention="triton") through fastgen.split_attention instead, which reads the
    slots up to that one only. torch's flex_attention in their place was measured and retired (bench/notes.md,
    2026-12-04 20:18 lease)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    read = kwargs.pop(READ_KWARG, None)
    slot = kwargs.pop(SLOT_KWARG, None)
    groups = kwargs.pop(GROUPS_KWARG, None)
    tuning = kwargs.pop(TUNING_KWARG, None)
    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if read is not None and read < key.shape[2]:
        key, value = key[:, :, :read], value[:, :, :read]
        if attention_mask is not None:
            attention_mask = attention_mask[..., :read]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if slot is not None:
        from rlstack.payload.fastgen import split_attention

        keep = None if attention_mask is None else attention_mask[:, 0, -1, :]  # [b, L]: bool (keep) or additive
        out = split_attention.attend(query, key, value, keep, slot, scale, groups, tuning=tuning)
        return out.transpose(1, 2).contiguous(), None
    b, h, _, d = query.shape
    kv = key.shape[1]
    qg = query.reshape(b, kv, h // kv, d)
    scores = torch.matmul(qg, key.transpose(-1, -2))  # [b, kv, g, L]
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale  # softmax in >= float32
    if attention_mask is not None:
        mask = attention_mask[:, 0, -1, :][:, None, None, :]  # [b, 1, 1, L]: bool (keep) or additive
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(
            scores.dtype)
    probs = scores.softmax(dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).reshape(b, h, 1, d)
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> str:
    """Register fastgen's decode attention with transformers; the name to put in the config."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, gqa_decode_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    return ATTN_NAME


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _is_quantized(module: Any) -> bool:
    """A bitsandbytes 4-bit / 8-bit linear layer (its weight is packed: it cannot be shared with a dense model)."""
    return type(getattr(module, "weight", None)).__name__ in ("Params4bit", "Int8Params")


# Pristine copies of modeling modules, by original module name (see _pristine_module), and the way back.
_PRISTINE: dict[str, Any] = {}
_PRISTINE_ORIGIN: dict[str, str] = {}


def patched_members(module: Any) -> list[str]:
    """What was replaced in a transformers modeling module after it was imported: classes defined in its source
    whose name now points at a class from elsewhere, and methods of its classes that come from another module.

    Why: Unsloth patches the model classes themselves when it loads a model (FastQwen3Model.pre_patch sets
    ``Qwen3ForCausalLM.forward``, ``Qwen3Model.forward``, ``Qwen3DecoderLayer.forward``, ``Qwen3Attention.forward``
    to its own kernels, whose inference path keeps its own KV layout and cannot take a StaticCache, and rebinds
    ``modeling_qwen3.Qwen3RotaryEmbedding`` to its own rotary class). A shadow built from those classes would run
    Unsloth's code, not transformers'. An untouched module returns [] (decorators keep ``__module__``).
    """
    import re
    import types
    from pathlib import Path

    name = module.__name__
    package = name.split(".")[0]
    try:
        source = Path(module.__file__).read_text(encoding="utf-8")
    except (OSError, TypeError):
        return []

    def foreign(origin: str | None) -> bool:  # transformers' own decorators (hub_kernels) are not patches
        return origin is not None and origin.split(".")[0] != package

    out = []
    for cls_name in re.findall(r"^class (\w+)\b", source, flags=re.MULTILINE):
        obj = getattr(module, cls_name, None)
        if not isinstance(obj, type):
            continue
        if foreign(obj.__module__):
            out.append(f"{cls_name} -> {obj.__module__}.{obj.__qualname__}")
            continue
        for attr, fn in vars(obj).items():
            if isinstance(fn, types.FunctionType) and foreign(fn.__module__):
                out.append(f"{cls_name}.{attr} -> {fn.__module__}")
    return out


def _pristine_module(name: str) -> Any:
    """A fresh execution of the modeling module ``name`` from its source file: the classes exactly as transformers
    wrote them, whatever was patched into the imported module since. It is registered as a sibling module
    (``<package>._rlstack_fastgen_pristine_<leaf>``) so its relative imports resolve to the same transformers
    package; it shares everything else (configs, cache classes, attention registries) with the live one.

    Module-level functions that Unsloth wraps and keeps the originals of (``masking_utils.create_causal_mask``
    under ``_unsloth_original_create_causal_mask``: a torch.compile'd wrapper) are bound back to the originals,
    so the shadow's compiled decode step does not nest another compiled function."""
    import importlib.util
    import sys

    cached = _PRISTINE.get(name)
    if cached is not None:
        return cached
    original = sys.modules[name]
    package, _, leaf = name.rpartition(".")
    new_name = f"{package}._rlstack_fastgen_pristine_{leaf}"
    spec = importlib.util.spec_from_file_location(new_name, original.__file__)
    if spec is None or spec.loader is None:
        raise FastgenError(f"fastgen: cannot re-read the source of {name}", "grpo.fast_generation=false")
    module = importlib.util.module_from_spec(spec)
    sys.modules[new_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[new_name]
        raise
    try:
        import transformers.masking_utils as masking_utils

        for attr in list(vars(module)):
            kept = getattr(masking_utils, f"_unsloth_original_{attr}", None)
            if kept is not None:
                setattr(module, attr, kept)
    except ImportError:  # pragma: no cover - transformers without masking_utils (< 4.53)
        pass
    _PRISTINE[name] = module
    _PRISTINE_ORIGIN[new_name] = name
    return module


def _kind(cls: type) -> tuple[str, str]:
    """(original module, qualified name) of a module class: a pristine copy's classes are the same kind as the
    live module's classes they were copied from."""
    return _PRISTINE_ORIGIN.get(cls.__module__, cls.__module__), cls.__qualname__


def _params_on_meta() -> Any:
    """Context: every parameter registered while it is active goes to the meta device (no memory), buffers stay
    real. Why not ``torch.device("meta")`` for all: modules whose buffers the shadow cannot take from the trained
    model (a rotary embedding Unsloth replaced by its own class) must compute their own, as the model's
    constructor does. This is what accelerate's init_empty_weights(include_buffers=False) does; written out to
    keep fastgen's imports to torch + transformers + peft."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def manager() -> Any:
        original = torch.nn.Module.register_parameter

        def register(module: Any, name: str, param: Any) -> None:
            original(module, name, param)
            if param is not None and param.device.type != "meta":
                kept = module._parameters[name]
                module._parameters[name] = torch.nn.Parameter(kept.to("meta"), requires_grad=kept.requires_grad)

        torch.nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            torch.nn.Module.register_parameter = original  # type: ignore[method-assign]

    return manager()


def shadow_class(model_class: type, pristine: bool | None = None) -> tuple[type, list[str]]:
    """The class to build the shadow from, and the patches that made it a pristine copy ([] when the live class
    is used). pristine=None: a pristine copy exactly when the class's modeling module was patched."""
    import sys

    module = sys.modules.get(model_class.__module__)
    patches = patched_members(module) if module is not None else []
    use_pristine = bool(patches) if pristine is None else pristine
    if not use_pristine:
        return model_class, []
    copy = _pristine_module(model_class.__module__)
    cls = getattr(copy, model_class.__name__, None)
    if not isinstance(cls, type):
        raise FastgenError(f"fastgen: {model_class.__name__} is not defined in {model_class.__module__}'s source",
                           "grpo.fast_generation=false")
    return cls, patches or ["(forced)"]


class _Shadow:
    """A plain transformers model whose LoRA'd projections hold merged weights (``W + scale * B @ A``) and whose
    other tensors are shared with (or, where their dtype differs from the generation dtype, cast copies of) the
    trained model. ``refresh()`` recomputes the merged weights in place, so compiled graphs stay valid.

    Quantized (bitsandbytes) bases are dequantized into the shadow: LoRA'd ones on every refresh (with the merge),
    the others once (a 4-bit base is frozen). When the model's modeling module was patched (Unsloth), the shadow is
    built from a pristine copy of it, so generation runs transformers' code on the trained tensors."""

    def __init__(self, peft_model: Any, dtype: Any, gqa_attention: bool = True, pristine: bool | None = None,
                 fuse_projections: bool = True, fp8: str = "off") -> None:
        import copy

        import torch
        from peft.tuners.lora import LoraLayer

        # the transformers model (with LoRA modules inside when it is a PEFT model)
        lora_root = peft_model.get_base_model() if _is_peft(peft_model) else peft_model
        config = copy.deepcopy(lora_root.config)
        config.use_cache = True
        config._attn_implementation = _register_attention() if gqa_attention else "sdpa"
        self.dtype = dtype
        cls, self.patches = shadow_class(type(lora_root), pristine)
        with _params_on_meta():
            shadow = cls(config)
        shadow.eval()
        device = next(p for p in lora_root.parameters()).device
        self._merged: list[tuple[Any, Any]] = []  # (lora layer, shadow weight buffer)
        self._casts: list[tuple[Any, Any]] = []  # (source tensor, cast copy)
        self._cast_by_id: dict[int, Any] = {}
        self.own_buffers: list[str] = []  # buffers the shadow computed itself (no same-kind source)
        lora_names = {name for name, mod in lora_root.named_modules() if isinstance(mod, LoraLayer)}
        # remove_duplicate=False: a module registered under several names (Unsloth sets the model's one rotary
        # embedding as self_attn.rotary_emb of every layer) must be found under each, model.rotary_emb included
        src_modules = dict(lora_root.named_modules(remove_duplicate=False))
        groups: list[tuple[str, tuple[str, ...]]] = []
        fused_bufs: dict[str, Any] = {}
        views: dict[str, Any] = {}

        def owned(name: str) -> bool:  # and on the device the group's buffer goes to (a split device_map)
            src = src_modules.get(name)
            if src is None or not (name in lora_names or _is_quantized(src)):
                return False
            base = src.get_base_layer() if name in lora_names else src
            return bool(base.weight.device == device)

        if fuse_projections:  # the shadow's own weights only: see fastgen.fused
            from rlstack.payload.fastgen import fused

            groups = fused.plan(shadow, owned)
            fused_bufs, views = fused.allocate(shadow, groups, dtype, device)
        for name, mod in shadow.named_modules():
            src = src_modules.get(name)
            if src is None:
                raise FastgenError(f"fastgen: cannot map module {name} of the shadow model",
                                   "use merge_lora=False for this model")
            if name in lora_names or _is_quantized(src):
                base = src.get_base_layer() if name in lora_names else src
                shape = (base.out_features, base.in_features)
                buf = views[name] if name in views else torch.empty(shape, dtype=dtype, device=base.weight.device)
                if name not in lora_names:  # frozen quantized base: dequantize once
                    with torch.no_grad():
                        buf.copy_(_dense_weight(base).reshape(shape).to(dtype))
                else:
                    self._merged.append((src, buf))
                mod._parameters["weight"] = torch.nn.Parameter(buf, requires_grad=False)
                if getattr(base, "bias", None) is not None:
                    mod._parameters["bias"] = torch.nn.Parameter(self._share(base.bias), requires_grad=False)
                continue
            for pname, param in list(mod._parameters.items()):
                if param is None:
                    continue
                src_param = src._parameters.get(pname)
                if src_param is None:
                    raise FastgenError(f"fastgen: no source for {name}.{pname}", "use merge_lora=False")
                mod._parameters[pname] = torch.nn.Parameter(self._share(src_param), requires_grad=False)
            same_kind = _kind(type(src)) == _kind(type(mod))
            for bname, own in list(mod._buffers.items()):
                if own is None:
                    continue
                src_buf = src._buffers.get(bname) if same_kind else None
                if src_buf is not None and src_buf.shape == own.shape and src_buf.dtype == own.dtype:
                    mod._buffers[bname] = src_buf
                else:
                    mod._buffers[bname] = own.to(device)
                    self.own_buffers.append(f"{name}.{bname}" if name else bname)
            if same_kind:
                for attr, value in vars(src).items():  # plain tensor attributes, e.g. rotary original_inv_freq
                    if isinstance(value, torch.Tensor) and not attr.startswith("_") and hasattr(mod, attr):
                        setattr(mod, attr, value)
            else:
                for attr, value in list(vars(mod).items()):
                    if isinstance(value, torch.Tensor) and not attr.startswith("_"):
                        setattr(mod, attr, value.to(device))
        if getattr(config, "tie_word_embeddings", False) and hasattr(shadow, "lm_head"):
            shadow.lm_head._parameters["weight"] = shadow.get_input_embeddings()._parameters["weight"]
        leftover = [n for n, p in shadow.named_parameters() if p.is_meta] + \
                   [n for n, b in shadow.named_buffers() if b.is_meta]
        if leftover:
            raise FastgenError(f"fastgen: shadow model has unmapped tensors: {leftover[:5]}", "use merge_lora=False")
        # GEMMs a decode step saves by fusing (0 where nothing could be fused: shared weights, biases, other names)
        self.fused_gemms_saved = fused.install(shadow, groups, fused_bufs) if groups else 0
        self._fp8: list[Any] = []  # fastgen.fp8.Fp8Weight of every projection (fp8), quantized at each refresh
        if fp8 != "off":
            from rlstack.payload.fastgen import fp8 as fp8_module

            self._fp8 = fp8_module.install(shadow, fp8)
        self.model = shadow
        self.refresh()

    def _share(self, tensor: Any) -> Any:
        if tensor.dtype == self.dtype or not tensor.is_floating_point():
            return tensor.detach()
        known = self._cast_by_id.get(id(tensor))
        if known is not None:
            return known
        copy = tensor.detach().to(self.dtype)
        self._casts.append((tensor, copy))
        self._cast_by_id[id(tensor)] = copy
        return copy

    def refresh(self) -> None:
        """Recompute merged weights (and cast copies) from the live trained tensors.

        Each merged weight is written once and read once more: the base (dequantized straight into it where
        bitsandbytes can, ``_dense_into``), then ``W += scale * B @ A`` as one GEMM whose output accumulates onto
        it (``addmm_``, rounded once). Why not PEFT's ``get_delta_weight`` (kept for what the GEMM form does not
        cover, ``_plain_lora``): it writes B @ A, scales it into another tensor and adds that, ~5 more passes over
        each weight than the GEMM, on every generate of a GRPO step."""
        import torch

        with torch.no_grad():
            for src, dst in self._casts:
                dst.copy_(src.detach())
            for layer, buf in self._merged:
                _dense_into(layer.get_base_layer(), buf)
                if getattr(layer, "merged", False):
                    raise FastgenError("fastgen: the LoRA adapter is merged into the base weights already",
                                       "unmerge it, or use merge_lora=False")
                for adapter in layer.active_adapters:
                    if adapter in getattr(layer, "lora_A", {}) and not layer.disable_adapters:
                        if getattr(layer, "use_dora", {}).get(adapter, False):
                            raise FastgenError("fastgen does not merge DoRA adapters", "use merge_lora=False")
                        if _plain_lora(layer, adapter):
                            a = layer.lora_A[adapter].weight
                            b = layer.lora_B[adapter].weight
                            buf.addmm_(b.to(buf.dtype), a.to(buf.dtype), alpha=float(layer.scaling[adapter]))
                        else:
                            buf.add_(layer.get_delta_weight(adapter).to(self.dtype))
            for weight in self._fp8:  # the FP8 copies from the weights as they are now (just merged, or trained)
                weight.quantize()


def _plain_lora(layer: Any, adapter: str) -> bool:
    """Whether ``adapter``'s delta on ``layer`` is ``scale * B.weight @ A.weight`` and nothing else (two linear
    maps, no fan_in_fan_out transpose, no PEFT variant such as DoRA, a number for the scale): what the refresh's
    one GEMM computes. Anything else goes through PEFT's own ``get_delta_weight``."""
    import torch

    b_modules = getattr(layer, "lora_B", None)
    a, b = layer.lora_A[adapter], b_modules[adapter] if b_modules is not None and adapter in b_modules else None
    return (isinstance(a, torch.nn.Linear) and isinstance(b, torch.nn.Linear)
            and not getattr(layer, "fan_in_fan_out", False)
            and adapter not in (getattr(layer, "lora_variant", None) or {})
            and isinstance(layer.scaling.get(adapter), int | float))


def _dense_into(base: Any, buf: Any) -> None:
    """Write the base layer's dense weight into ``buf``: a bitsandbytes 4-bit weight on CUDA is dequantized
    straight into it (bitsandbytes' ``out=``, one write; its CPU backend has no such kernel), anything else
    through ``_dense_weight`` and a copy."""
    weight = base.weight
    state = getattr(weight, "quant_state", None)
    if (type(weight).__name__ == "Params4bit" and buf.is_cuda and state is not None and weight.data.shape[0] != 1
            and tuple(state.shape) == tuple(buf.shape) and state.dtype == buf.dtype and buf.is_contiguous()):
        import bitsandbytes.functional as bnbf

        bnbf.dequantize_4bit(weight.data, state, out=buf)
        return
    buf.copy_(_dense_weight(base).reshape(buf.shape).to(buf.dtype))


def _dense_weight(base: Any) -> Any:
    """The base layer's weight as a dense tensor (dequantizing bitsandbytes 4-bit / 8-bit weights)."""
    weight = base.weight
    cls = type(weight).__name__
    if cls == "Params4bit":
        import bitsandbytes.functional as bnbf

        return bnbf.dequantize_4bit(weight.data, weight.quant_state)
    if cls == "Int8Params":
        from peft.utils.integrations import dequantize_bnb_weight

        return dequantize_bnb_weight(weight, state=base.state)
    return weight.detach()


def _round_up(n: int, m: int) -> int:
    return ((n + m - 1) // m) * m


# Free memory the shadow must leave: a fraction of its own estimate plus a floor. Chosen, not measured: it has
# to absorb what the estimate leaves out (prefill activations, inductor/cuBLAS workspaces, the CUDA graph pool,
# allocator fragmentation). The GPU benchmark records the estimate beside the measured peak (rollout_peers.py).
MEMORY_MARGIN_FRACTION = 0.10
MEMORY_MARGIN_BYTES = 2 * 2**30


class FastgenMemoryError(FastgenError):
    """The shadow or a KV cache would not fit in free GPU memory (fastgen refuses before allocating)."""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes fastgen is about to allocate for one (batch, cache length): ``shadow`` (merged or dequantized
    projection weights and dtype-cast copies; 0 once built), ``kv`` (the static cache: 2 x layers x batch x KV heads
    x head_dim x length), ``logits`` (float32 logits and the sampling warpers' copies of them)."""

    shadow: int
    kv: int
    logits: int
    batch: int
    length: int

    @property
    def total(self) -> int:
        return self.shadow + self.kv + self.logits

    @property
    def margin(self) -> int:
        return int(self.total * MEMORY_MARGIN_FRACTION) + MEMORY_MARGIN_BYTES


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def shadow_bytes(model: Any, dtype: Any, merge_lora: bool = True, fp8: bool = False) -> int:
    """Bytes the shadow allocates for ``model`` (what it shares with the trained model costs nothing): a dense
    ``dtype`` weight per LoRA'd projection and per quantized linear, a cast copy of every other floating tensor
    whose dtype differs from ``dtype`` (e.g. an fp32 embedding under PEFT's prepare_model_for_kbit_training), and
    with ``fp8`` one byte an element for the e4m3 copy of every linear but the output embedding (fastgen.fp8)."""
    import torch

    if not merge_lora and _is_peft(model):
        return 0
    from peft.tuners.lora import LoraLayer

    root = model.get_base_model() if _is_peft(model) else model
    itemsize = torch.empty((), dtype=dtype).element_size()
    total = 0
    dense_ids: set[int] = set()
    lora_bases = {id(mod.get_base_layer()) for mod in root.modules() if isinstance(mod, LoraLayer)}
    for mod in root.modules():
        if isinstance(mod, LoraLayer) or (_is_quantized(mod) and id(mod) not in lora_bases):
            base: Any = mod.get_base_layer() if isinstance(mod, LoraLayer) else mod
            total += int(base.out_features) * int(base.in_features) * itemsize
            dense_ids.add(id(base.weight))  # the bias is shared or cast like any other tensor
            dense_ids.update(id(t) for n, t in mod.named_parameters() if "lora_" in n)  # trained model only
    seen: set[int] = set()
    for tensor in root.parameters():
        if id(tensor) in dense_ids or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if tensor.is_floating_point() and tensor.dtype != dtype:
            total += tensor.numel() * itemsize
    if fp8:
        head = root.get_output_embeddings()
        from rlstack.payload.fastgen.fp8 import fits

        for name, mod in root.named_modules():  # a LoRA layer's base among them, its A and B not
            if (isinstance(mod, torch.nn.Linear) and mod is not head and ".lora_" not in f".{name}"
                    and fits(mod.out_features, mod.in_features)):
                total += int(mod.out_features) * int(mod.in_features)
    return total


def plan_memory(model: Any, batch: int, length: int, dtype: Any, *, include_shadow: bool = True,
                merge_lora: bool = True, fp8: bool = False) -> MemoryPlan:
    """The MemoryPlan of serving ``batch`` sequences in a cache of ``length`` tokens (see MemoryPlan)."""
    import torch

    root = model.get_base_model() if _is_peft(model) else model
    cfg = _text_config(root.config)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    itemsize = torch.empty((), dtype=dtype).element_size()
    kv = 2 * int(cfg.num_hidden_layers) * batch * kv_heads * head_dim * length * itemsize
    logits = batch * int(cfg.vocab_size) * 4 * 6  # fp32 logits, sorted copy, cumsum, softmax, masks
    shadow = shadow_bytes(model, dtype, merge_lora, fp8) if include_shadow else 0
    return MemoryPlan(shadow=shadow, kv=kv, logits=logits, batch=batch, length=length)


def free_gpu_bytes(device: Any) -> tuple[int, int, int]:
    """(usable, free on the device, cached by torch): the driver's free memory plus what torch's caching allocator
    holds reserved but unallocated, which our allocations reuse before asking the driver."""
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    cached = max(0, int(torch.cuda.memory_reserved(device)) - int(torch.cuda.memory_allocated(device)))
    return int(free) + cached, int(free), cached


def check_memory(plan: MemoryPlan, device: Any) -> None:
    """Refuse (FastgenMemoryError, with the numbers) when ``plan`` plus its margin exceeds free GPU memory."""
    usable, free, cached = free_gpu_bytes(device)
    need = plan.total + plan.margin
    if need <= usable:
        return
    gib = 2**30
    raise FastgenMemoryError(
        f"fastgen: not enough free GPU memory: needs {need / gib:.2f} GiB = shadow weights {plan.shadow / gib:.2f}"
        f" + KV cache {plan.kv / gib:.2f} ({plan.batch} x {plan.length} tokens) + logits {plan.logits / gib:.2f}"
        f" + margin {plan.margin / gib:.2f} GiB; usable {usable / gib:.2f} GiB (device free {free / gib:.2f}"
        f" + cached by torch {cached / gib:.2f})",
        "fewer sequences per generation (grpo.per_device_train_batch_size) or a shorter "
        "grpo.max_completion_length, or grpo.fast_generation=false",
    )


@dataclasses.dataclass
class _Loop:
    """The decode loop's state, on the device so that one captured graph can advance it: the token to feed, its
    position and (transformers 4.x) cache slot, the index of the token being picked, the tokens picked so far (as
    wide as the cache, which bounds any call on it) and the rows that have not emitted EOS."""

    tok: Any  # [B, 1]
    pos: Any  # [B, 1]
    slot: Any  # [1]
    k: Any  # [1]
    tokens: Any  # [B, cache length]
    unfinished: Any  # [B] bool
    invalid: Any  # [B] bool: a row sampled from probabilities that were not a distribution (see _draw)
    entries: Any  # [B, rows an entry] int32: shared_prompt's sequences of one prompt (split_attention.entry_table)
    prompt: Any  # [1]: the prompt's slots (shared_prompt)
    seed: Any  # [1]: the generation's seed of draw="triton"'s random numbers (fastgen.topk_draw)

    def tensors(self) -> list[Any]:
        return [self.tok, self.pos, self.slot, self.k, self.tokens, self.unfinished, self.invalid]

    @classmethod
    def new(cls, batch: int, length: int, device: Any, per_entry: int = 1) -> _Loop:
        import torch

        def longs(*shape: int) -> Any:
            return torch.zeros(shape, dtype=torch.long, device=device)

        return cls(tok=longs(batch, 1), pos=longs(batch, 1), slot=longs(1), k=longs(1), tokens=longs(batch, length),
                   unfinished=torch.ones((batch,), dtype=torch.bool, device=device),
                   invalid=torch.zeros((batch,), dtype=torch.bool, device=device),
                   entries=torch.full((batch, per_entry), -1, dtype=torch.int32, device=device),
                   prompt=longs(1), seed=longs(1))


def _first_compiled_call(call: Callable[[], Any], state: list[Any]) -> tuple[Any, str | None]:
    """The first call of a torch.compile'd function (the decode step, the pick): (its output, None), or where it
    raised, (None, why) with ``state`` (the tensors the call may have advanced in place) set back, for the caller
    to fall back to eager and say so. Dynamo's suppress_errors is off for the call: Unsloth turns it on for the
    whole process (unsloth_zoo patching_utils.py), and a failed compile would then run eager in silence, under
    fastgen's name and at eager speed."""
    import torch._dynamo

    snapshot = [t.clone() for t in state]
    try:
        with torch._dynamo.config.patch(suppress_errors=False):
            return call(), None
    except Exception as exc:
        for cur, old in zip(state, snapshot, strict=True):
            cur.copy_(old)
        return None, error_text(exc)


def compile_settings(mode: str | None, emulate_precision_casts: bool) -> dict[str, Any]:
    """torch.compile's ``mode`` or ``options`` for the decode step: the mode alone, or with
    ``emulate_precision_casts`` inductor's options for that mode plus the option (torch.compile takes a mode or
    options, not both; ``torch._inductor.list_mode_options`` is what a mode means)."""
    if not emulate_precision_casts:
        return {"mode": mode}
    import torch._inductor

    # (list_mode_options(None) lists every mode's options: no mode is no options)
    modal = torch._inductor.list_mode_options(mode) if mode else {}
    return {"options": {**modal, "emulate_precision_casts": True}}


def auto_attention(device_type: str, own_attention: bool, attend_bucket: int, triton_why: str | None) -> str:
    """What ``decode_attention="auto"`` (the default) decodes with: the triton split kernel on CUDA where the engine
    attends with its own function (the merged shadow, gqa_attention), reads the whole cache (attend_bucket 0: the
    kernel reads the filled slots itself) and Triton imports (``triton_why`` is None); else the grouped matmuls.

    Why triton on CUDA: measured on the H200 (2026-12-05, bench/results/rollout_peers_triton.md, portable's
    Unsloth loader) 9,436 against 8,628 tokens/s at 64 sequences (+9.4 %) and 1,986 against 1,965 at 8 (+1.1 %);
    the profile of the same lease (fidelity libraries, torch 2.11) 6.83 against 7.07 ms a step at 64 and 4.256
    against 4.248 at 8. Never on the CPU, where the kernel only runs in Triton's interpreter (tests)."""
    if device_type == "cuda" and own_attention and attend_bucket == 0 and triton_why is None:
        return "triton"
    return "matmul"


def auto_draw(device_type: str, compile_pick: bool, reference_kernels: bool, triton_why: str | None) -> str:
    """What ``draw="auto"`` (the default) draws with: fastgen.topk_draw's kernels on CUDA where Triton imports
    (``triton_why`` is None), unless compile_pick (which fuses the torch pick instead) or reference_kernels (which
    promises transformers' kernels) is on; else torch.

    Why the kernels on CUDA: measured through portable's default path (Unsloth loader, NF4 base, H100, run id
    20261205T114508-01aa62, bench/results/rollout_peers_pair_h100.md) in one process, twice in opposite orders:
    1,684 and 1,672 tokens/s against 1,637 and 1,639 at 8 sequences (+2.9 %, +2.0 %), 9,168 and 9,094 against
    8,902 and 8,913 at 64 (+3.0 %, +2.0 %), where the two default runs differ by 0.1 %; fastgen's GPU tests passed
    on the same machine, the kernels' draw exact against transformers' top-k plus their noise among them. The
    samplings the kernels do not draw (top-p, min-p, no top-k) fall to torch at each call (``draw_why``)."""
    if device_type == "cuda" and triton_why is None and not compile_pick and not reference_kernels:
        return "triton"
    return "torch"


def auto_rotary(device_type: str, decode_attention: str, shared_prompt: bool, family_why: str | None) -> str | None:
    """Why ``fuse_rotary=None`` ("auto", the default) leaves the q/k norms, the rotary and the cache write to
    inductor's kernels (None: it fuses them into the triton attention). It fuses on CUDA where the decode attention
    is the triton kernel (``decode_attention`` as resolved), shared_prompt is off and the model type is one
    ``fastgen.rotary_attention`` knows (``family_why``, from the config; each module is checked again when the
    engine is built, and a module it cannot serve turns it off there, saying why).

    Why on CUDA: measured through portable's default path (Unsloth loader, NF4 base, H100, run id
    20261205T132029-c23955, bench/results/rollout_peers_rotary_h100.md) in one process after the default: 1,720
    against 1,610 tokens/s at 8 sequences (+6.8 %, 4.65 against 4.97 ms a step) and 9,307 against 8,921 at 64
    (+4.3 %); vLLM bf16 in the same lease 1,693 / 9,782 (1.02x / 0.95x with it, 0.95x / 0.91x without). In the
    other order on another H100 (run id 20261205T152008-c90011, bench/results/rollout_peers_swapped_h100.md): 1,744
    / 9,296 with it, measured second, against 1,631 / 9,036 without it, measured first; vLLM bf16 1,563 / 9,690
    (1.12x / 0.96x). On a real
    model (SmolLM2-135M, bf16, the same H100) its greedy tokens equal generate's on 75.4 % of positions (the
    default engine 71.7-72.7 % on the H200; both flip bf16 near-ties: the largest logit gap at a divergence
    0.125) and its per-token KL to the training model is 0.00178 (generate against itself 0.00166). The
    compiled and captured f32 engine decodes generate's greedy tokens (GPU test)."""
    if device_type != "cuda":
        return "off CUDA"
    if decode_attention != "triton":
        return f"the decode attention is {decode_attention!r}, not the triton kernel"
    if shared_prompt:
        return "shared_prompt reads the prompt in a pass of its own"
    return family_why


def _refuse_kernel_changes(**options: Any) -> None:
    """reference_kernels promises transformers' kernels: refuse, naming it, any option that would change them
    (given a value other than its default), rather than drop it in silence."""
    defaults = {"compile": (None, False), "graph": ("manual", "none"), "attend_bucket": (0,),
                "decode_attention": ("auto", "matmul"), "compile_pick": (False,), "fp8": ("off",),
                "prefill_once": (None, False), "emulate_precision_casts": (False,), "attention_tuning": (None,),
                "draw": ("auto", "torch"), "fuse_rotary": (None, False)}
    changed = [f"{name}={value!r}" for name, value in options.items() if value not in defaults[name]]
    if changed:
        raise FastgenError(f"fastgen: reference_kernels decodes with transformers' own kernels; "
                           f"{', '.join(changed)} would change them",
                           "drop those options, or reference_kernels for fastgen's faster kernels")


class FastGenerator:
    """Generate completions for a (PEFT or plain) causal LM with a static KV cache and a compiled decode step.

    One instance per model (see ``get_engine``); it keeps one StaticCache (and one captured CUDA graph) per
    (batch, bucketed length) so repeated GRPO steps replay the same graph.

    * ``merge_lora=True`` decodes with a shadow of merged weights (plain models get a shadow that shares every
      tensor, so the custom decode attention can be used without touching the caller's model);
      ``merge_lora=False`` decodes through the PEFT modules themselves (no extra memory, extra LoRA matmuls).
    * ``graph="manual"``: inductor-compiled decode step captured once into a torch.cuda.CUDAGraph and replayed
      (with ``sample_in_graph``, Python only replays it; otherwise it picks between replays); ``"trees"``:
      torch.compile(mode="reduce-overhead") cudagraph trees; ``"none"``: compiled kernels launched from Python.
      ``compile=False``: eager (CPU default).
    * ``sample_in_graph=True`` (manual graphs; default off, see the module docstring): the pick is captured with
      the step; not for a call with its own ``generator`` or ``on_logits``, and where its capture fails
      (``fused_error``) the step is captured alone and the pick runs eagerly between replays.
    * ``fuse_projections=True`` (the default; the shadow's own weights only, see the module docstring): each
      layer's q/k/v and gate/up projections run as one GEMM each (``rlstack.payload.fastgen.fused``);
      ``fused_gemms_saved`` says how many GEMMs a step no longer launches (0: nothing could be fused).
    * ``attend_bucket=N`` (default 0, off until measured on a GPU): a decode step's attention reads the filled
      cache slots rounded up to N instead of the whole cache (``read_length``); one compiled step and graph per
      read length. Needs fastgen's own decode attention (``gqa_attention`` and the merged shadow).
    * ``decode_attention="triton"``: a decode step attends through a split-KV Triton kernel
      (``fastgen.split_attention``) that reads the filled slots only, their number taken from the device at every
      step: one graph, no per-length compiles. Same requirement; CUDA (or Triton's CPU interpreter).
      ``"matmul"``: grouped matmuls over the whole static cache. ``"auto"`` (the default): triton on CUDA where
      it can run, matmul elsewhere (``auto_attention``, which says why: measured 9 % faster at 64 sequences).
    * ``shared_prompt=True`` (with decode_attention="triton"; default off until measured on a GPU): the prompt's
      cache slots are read once per group of sequences with the same prompt (GRPO's G generations of one prompt
      keep G copies of its K/V, ~40 % of a 512-token rollout's reads at 64 sequences), up to
      ``split_attention.rows_per_entry`` sequences a read; the groups are found once a generation (one read of
      the prompt ids to the host, before the loop).
    * ``prefill_once`` (default on, off under reference_kernels; not yet measured on a GPU): a prompt that
      several rows repeat (GRPO's G generations of each prompt) is prefilled once, into the first rows of the
      cache, and its K/V and last logits copied to the rows that repeat it (``_prefill``). Why: the prefill is
      compute-bound, and at 64 sequences (8 prompts x 8) of ~210 tokens it is most of a generation's fixed cost
      (~0.64 ms of the 6.8 ms a token on the H200, 2026-12-05). Where the cache is not yet allocated (a shape's
      first call) or its layers are not ones it knows (keys/values tensors of the batch's rows), every row is
      prefilled, as before.
    * ``attention_tuning="block_n:num_warps:programs:num_stages[:fused]"`` (with decode_attention="triton";
      default None: ``split_attention.TUNING``): the triton kernel's launch shape for this engine, e.g. a shape
      bench/attention_sweep.py found faster, measured in the whole step (``--variant attention_tuning=...``)
      before it becomes TUNING.
    * ``fuse_rotary=True`` (with decode_attention="triton", not with shared_prompt; ``None``, the default, chooses
      it on CUDA where it can serve the model: ``auto_rotary``, measured 6.8 % faster at 8 sequences and 4.3 % at
      64 through portable's default path on the H100): a decode step's q/k RMSNorm (Qwen3's), rotary embedding and
      cache write run inside the triton attention kernel (``split_attention.Prologue``) instead of two inductor
      kernels a layer around it (0.20 ms a step at 8 sequences, 0.32 at 64 on the H200, 2026-12-05), through
      fastgen's own attention forward for the decode step (``fastgen.rotary_attention``: Llama, Mistral, Qwen2,
      Qwen3). Asked for by name, a model or module it cannot serve is refused when the engine is made or built;
      chosen by the default, it steps aside saying why (``rotary_why``, an info line), and where the first compile
      of the step with it fails, the step is compiled without it before anything goes eager. Eager's roundings are kept
      (the query's dtype after the norm, the weight, each rotary product and their sum), so the cache holds the
      key transformers' update would write.
    * ``emulate_precision_casts=True`` (compiled engines; default off until measured on a GPU): inductor's
      option of that name, which rounds a fused kernel's intermediates to the dtype eager rounds them to (an
      RMSNorm's output to bf16 before the weight multiplies it, where inductor otherwise keeps float32). Why:
      every compiled bf16 engine measured on the H200 agreed with eager generate on 68-81 % of greedy positions
      while transformers' eager static cache agreed on 100 %; one of the ways a fused kernel computes other bits
      than eager's is these skipped roundings (the reductions' order is another, which this leaves). On the CPU
      backend of torch 2.10 the option does not compile (a torch bug): the step then runs eagerly, saying why
      (``compile_error``).
    * ``compile_pick=True`` (compiled engines; default off until measured on a GPU): the pick (EOS mask, warpers,
      draw, next inputs) runs through inductor, which fuses its passes over the [B, vocabulary] logits into a few
      kernels (eager: ~15, each reading or writing the whole tensor: 0.47 ms at 64 sequences on the H200). Random
      numbers stay aten's (inductor's ``fallback_random``), so the draw consumes the generator as the eager pick
      does. Where its compile fails (``pick_error``) the eager pick takes over, once, saying why.
    * ``draw="triton"`` (``"auto"``, the default, chooses it on CUDA: ``auto_draw``, measured 2-3 % faster through
      portable's default path at 8 and 64 sequences on the H100; ``"torch"`` the torch pick's draw): a sampling pick's
      temperature, top-k and draw run as two Triton kernels (``fastgen.topk_draw``) instead of torch.topk, a masked
      copy, Exp(1) noise over the vocabulary, its log and an argmax (0.17-0.3 ms a token at 8 sequences, ~0.4-0.65 at 64
      on the H200, 2026-12-04). The same distribution (transformers' top-k, ties kept), another random stream: Triton's
      Philox, seeded once a generation from the call's generator (or torch's default), so a seeded call repeats its
      tokens but not the torch draw's; the second kernel also does the pick's bookkeeping for its row (EOS, pad, token
      buffer, position), leaving two counter increments to torch. Where the sampling is not top-k alone (top-p, min-p,
      no top-k, top_k > 128) the torch draw serves, said once (``draw_why``); where the kernels fail on their first
      launch (``draw_error``) the torch draw serves from then on, said once. Not with compile_pick (both replace the
      pick's kernels: "auto" then draws in torch).
    * A split-K Triton GEMM for o_proj and down_proj at decode (``skinny_gemm``) was measured slower than cuBLAS
      on every projection at 8 rows on the H200 (o_proj 0.522 against 0.432 ms a step, down_proj 0.788 against
      0.707; 2026-12-05, bench/notes.md) and retired.
    * ``fp8="row"`` or ``"tensor"`` (default "off": its rollouts come from an FP8 approximation of the policy):
      every projection but lm_head through its FP8 copy (``fastgen.fp8``: e4m3 with row-wise or per-tensor
      scales, torch._scaled_mm; compute capability >= 8.9, or the CPU); ``fp8_weights`` says how many copies.
      Needs the merged shadow.
    * ``reference_kernels=True`` (default off; 100 % of generate's greedy tokens on the H200, 2026-12-05):
      decode with transformers' own modules and kernels, as its generate does over a static cache: the model
      itself (a PEFT model's LoRA modules unmerged), no inductor, no fastgen attention, no fused projections; on
      CUDA the eager step is captured into a CUDA graph and replayed, so what is left of fastgen is the static
      cache, the graph and the in-place pick.
      Why: every fused bf16 engine measured (fastgen's default, transformers' own compiled static cache) agreed
      with eager generate on 68-81 % of greedy positions on the H200, flipping near-ties; transformers' static
      cache run eagerly agreed on 100 % (bench/notes.md). This is that path at graph speed, for evaluations that
      must give generate's answers. It refuses the options that change the kernels (compile=True, attend_bucket,
      decode_attention, compile_pick, graph="trees"), and models whose classes Unsloth patched (their
      forward is not transformers' code).
    """

    def __init__(self, model: Any, *, compile: bool | None = None, merge_lora: bool = True,
                 length_bucket: int = 128, graph: str = "manual", gqa_attention: bool = True,
                 compile_mode: str | None = None, memory_check: bool | None = None,
                 pristine: bool | None = None, sample_in_graph: bool = False,
                 fuse_projections: bool = True, attend_bucket: int = 0, decode_attention: str = "auto",
                 compile_pick: bool = False, reference_kernels: bool = False,
                 fp8: str = "off", shared_prompt: bool = False, prefill_once: bool | None = None,
                 emulate_precision_casts: bool = False, attention_tuning: str | None = None,
                 draw: str = "auto", fuse_rotary: bool | None = None) -> None:
        self.model = model
        param = next(model.parameters())
        self.device = param.device
        if graph not in ("manual", "trees", "none"):
            raise FastgenError(f"fastgen: unknown graph mode {graph!r}", "use manual, trees or none")
        self.reference_kernels = reference_kernels
        if reference_kernels:
            _refuse_kernel_changes(compile=compile, graph=graph, attend_bucket=attend_bucket,
                                   decode_attention=decode_attention, compile_pick=compile_pick, fp8=fp8,
                                   prefill_once=prefill_once, emulate_precision_casts=emulate_precision_casts,
                                   attention_tuning=attention_tuning, draw=draw, fuse_rotary=fuse_rotary)
            compile, merge_lora, gqa_attention, fuse_projections = False, False, False, False
        # off under reference_kernels: generate prefills every row, and a GEMM of fewer rows may round otherwise
        self.prefill_once = (not reference_kernels) if prefill_once is None else prefill_once
        self.compile = (self.device.type == "cuda") if compile is None else compile
        # the eager step is captured too where reference_kernels asks for transformers' kernels (see _capture)
        self.graph = graph if ((self.compile or reference_kernels) and self.device.type == "cuda") else "none"
        self.compile_mode = compile_mode
        self.length_bucket = length_bucket
        self.peft = _is_peft(model)
        self.merge_lora = merge_lora and self.peft
        self.gqa_attention = gqa_attention
        self.pristine = pristine
        self.sample_in_graph = sample_in_graph
        self.fuse_projections = fuse_projections
        if not isinstance(attend_bucket, int) or isinstance(attend_bucket, bool) or attend_bucket < 0:
            raise FastgenError(f"fastgen: attend_bucket must be a number of cache slots >= 0, not {attend_bucket!r}",
                               "0 reads the whole cache; e.g. 256 reads the filled slots rounded up to 256")
        if decode_attention not in DECODE_ATTENTION:
            raise FastgenError(f"fastgen: unknown decode_attention {decode_attention!r}",
                               f"use one of {', '.join(DECODE_ATTENTION)}")
        from rlstack.payload.fastgen import split_attention, triton_support

        self.tuning: Any = None  # attention_tuning's launch shape (None: split_attention.TUNING)
        if attention_tuning is not None:
            try:
                self.tuning = split_attention.Tuning.parse(str(attention_tuning))
            except ValueError as exc:
                raise FastgenError(f"fastgen: {exc}", "bench/attention_sweep.py prints each shape's spec") from None
        # the merged shadow (a plain model's shares every tensor); reference_kernels decodes through the model
        self.own_decoder = not reference_kernels and (self.merge_lora or not self.peft)
        own_attention = gqa_attention and self.own_decoder
        # where the kernel cannot run and why (asked once: "auto" chooses with it, "triton" is refused with it)
        triton_why = triton_support.available(self.device.type, "decode_attention='triton'")
        if decode_attention == "auto":
            decode_attention = auto_attention(self.device.type, own_attention, attend_bucket, triton_why)
        for name, value, off in (("attend_bucket", attend_bucket, 0), ("decode_attention", decode_attention, "matmul")):
            if value != off and not own_attention:
                raise FastgenError(f"fastgen: {name} needs fastgen's own decode attention",
                                   f"keep gqa_attention=True and merge_lora=True (the defaults), or {name}={off!r}")
        if decode_attention == "triton" and triton_why is not None:
            raise FastgenError(f"fastgen: {triton_why}", "use decode_attention='matmul' here")
        if fp8 not in FP8_SCALES:
            raise FastgenError(f"fastgen: unknown fp8 {fp8!r}", f"use one of {', '.join(FP8_SCALES)}")
        if fp8 != "off":
            from rlstack.payload.fastgen import fp8 as fp8_module

            why = fp8_module.unavailable(self.device)
            if why is not None:
                raise FastgenError(f"fastgen: {why}", "use fp8='off' (the default) here")
            if not self.own_decoder:
                raise FastgenError("fastgen: fp8 needs the merged shadow (its weights are what it quantizes)",
                                   "keep merge_lora=True (the default)")
        self.fp8 = fp8
        if shared_prompt and decode_attention != "triton":
            raise FastgenError("fastgen: shared_prompt reads the prompt once per group through the triton decode "
                               "attention", "add decode_attention='triton', or drop shared_prompt")
        self.shared_prompt = shared_prompt
        if self.tuning is not None and decode_attention != "triton":
            raise FastgenError("fastgen: attention_tuning is the triton decode attention's launch shape",
                               "add decode_attention='triton' (the default on CUDA), or drop attention_tuning")
        if decode_attention == "triton":
            split_attention.kernel()  # built here, not inside the compiled step (see kernel)
            if (self.tuning or split_attention.TUNING).fuse_merge:  # its ticket counters (split_attention.counters)
                split_attention.counters(self.device)
        self.attend_bucket = attend_bucket
        self.decode_attention = decode_attention
        from rlstack.payload.fastgen import rotary_attention

        family_why = rotary_attention.family_why_not(_text_config(model.config))
        # why "auto" (None) left the rotary to inductor, or turned it off later (a module _build found it cannot
        # serve, a first compile that failed with it: _rotary_off); None: fused
        self.rotary_why: str | None = None
        self._rotary_asked = bool(fuse_rotary)  # asked for by name: a module it cannot serve is an error
        self.decoder: Any = None  # built on the first generate(), after the memory check (see _build)
        if fuse_rotary is None:
            why_not = auto_rotary(self.device.type, decode_attention, shared_prompt, family_why)
            fuse_rotary = why_not is None
            if why_not is not None and self.device.type == "cuda":
                self._rotary_off(why_not)
            self.rotary_why = why_not  # (off CUDA, nothing to say)
        elif fuse_rotary:
            if decode_attention != "triton":
                raise FastgenError("fastgen: fuse_rotary does the norms, the rotary and the cache write in the triton "
                                   "decode attention", "keep decode_attention 'auto' on CUDA (or 'triton'), or drop "
                                   "fuse_rotary")
            if shared_prompt:
                raise FastgenError("fastgen: fuse_rotary attends every slot in one pass, not shared_prompt's two",
                                   "choose one of them")
            if family_why is not None:
                raise FastgenError(f"fastgen: fuse_rotary: {family_why}", "drop fuse_rotary for this model")
        self.fuse_rotary = bool(fuse_rotary)
        if draw not in DRAWS:
            raise FastgenError(f"fastgen: unknown draw {draw!r}", f"use one of {', '.join(DRAWS)}")
        self._draw_asked = draw == "triton"  # asked for by name: a sampling it leaves to torch is a warning
        draw_triton_why = triton_support.available(self.device.type, "draw='triton'")
        if draw == "auto":
            draw = auto_draw(self.device.type, compile_pick, reference_kernels, draw_triton_why)
        if draw == "triton":
            if draw_triton_why is not None:
                raise FastgenError(f"fastgen: {draw_triton_why}", "use draw='torch' (or 'auto', the default) here")
            if compile_pick:
                raise FastgenError("fastgen: compile_pick and draw='triton' both replace the pick's kernels",
                                   "choose one of them")
            from rlstack.payload.fastgen import topk_draw

            topk_draw.kernels()  # built here, outside any graph a pick is captured in
        self.draw = draw
        self.draw_why: str | None = None  # why the last sampling call drew in torch despite draw="triton"
        self.draw_error: str | None = None  # the kernels' first launch failed: torch draws from then on
        self._draw_ok = False
        self.compile_pick = compile_pick and self.compile
        self.emulate_precision_casts = emulate_precision_casts and self.compile
        self._pick_compiled: Any = None  # torch.compile of _pick, built with the step (compile_pick)
        self._pick_ok = False
        self.pick_error: str | None = None
        # memory_check: refuse before allocating when the shadow / a cache would not fit (default: on CUDA)
        self.memory_check = (self.device.type == "cuda") if memory_check is None else memory_check
        self.dtype = _generation_dtype(model)
        self._shadow: _Shadow | None = None
        self.patches: list[str] = []  # what made the shadow a pristine copy (Unsloth's class patches)
        self.last_plan: MemoryPlan | None = None
        self._caches: dict[tuple[int, int], Any] = {}
        # (batch, length, slots read) -> (graph, logits) of the step alone; slots read == length without
        # attend_bucket
        self._graphs: dict[tuple[int, int, int], Any] = {}
        self._fused: dict[tuple[int, int, int, Sampling], Any] = {}  # + sampling -> graph of the step and the pick
        self._loops: dict[tuple[int, int], _Loop] = {}
        self._eos: dict[tuple[int, ...], Any] = {}
        self.fused_error: str | None = None
        self._pool: Any = None
        self.compiles = 0
        self.compile_error: str | None = None
        self.graph_error: str | None = None
        self._compiled_ok = False
        self._step: Any = None
        self._takes_cache_position = False
        self.announced = False  # hook.say_how_once said how this engine serves
        self.prefilled_rows = 0  # rows the last generate's prefill ran (fewer than its batch with prefill_once)

    def _build(self) -> None:
        """Build the decoder (the merged shadow, or the PEFT model's base) and the compiled step, once."""
        if self.decoder is not None:
            return
        model = self.model
        if self.own_decoder:
            self._shadow = _Shadow(model, self.dtype, gqa_attention=self.gqa_attention, pristine=self.pristine,
                                   fuse_projections=self.fuse_projections, fp8=self.fp8)
            self.patches = self._shadow.patches
            self.decoder = self._shadow.model
        else:
            import sys

            root = model.get_base_model() if self.peft else model
            module = sys.modules.get(type(root).__module__)
            patched = patched_members(module) if module is not None else []
            if patched:
                raise FastgenError(f"fastgen: the model's classes are patched ({patched[0]}, ...): decoding through "
                                   "them is not transformers' code",
                                   "use transformers' generate for its kernels" if self.reference_kernels
                                   else "use merge_lora=True (the default)")
            self.decoder = root
        if self.fuse_rotary:
            from rlstack.payload.fastgen import rotary_attention

            served = rotary_attention.install(self.decoder)
            if isinstance(served, str):
                if self._rotary_asked:
                    raise FastgenError(f"fastgen: fuse_rotary: {served}", "drop fuse_rotary for this model")
                self._rotary_off(served)  # "auto" chose it from the config; a module says otherwise
        import inspect

        self._takes_cache_position = "cache_position" in inspect.signature(self.decoder.forward).parameters
        if self.compile:
            import torch
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            mode = self.compile_mode or ("reduce-overhead" if self.graph == "trees" else None)
            self._step = torch.compile(self._decode, fullgraph=False, dynamic=False,
                                       **compile_settings(mode, self.emulate_precision_casts))
            if self.compile_pick:
                # fallback_random: aten's RNG kernels, not inductor's own (another stream of numbers)
                self._pick_compiled = torch.compile(FastGenerator._pick, fullgraph=False, dynamic=False,
                                                    options={"fallback_random": True})
        else:
            self._step = self._decode

    def describe(self) -> str:
        """One line on how this engine serves (the hook prints it once a run), so a training log says which path
        its rollouts took: the measured step time means little without it."""
        if self._shadow is not None:
            shadow = f"{str(self.dtype).removeprefix('torch.')} shadow" + (", LoRA merged" if self.peft else "")
        else:
            shadow = "the model's own modules" if self.peft else "the model's weights"
        if self.reference_kernels:
            graph = "transformers' kernels" + (" in a CUDA graph" if self.graph == "manual" else ", eager")
        else:
            graph = f"graph {self.graph}" if self.compile else "eager (compile off)"
        parts = [shadow, f"fused projections ({self.fused_gemms_saved} GEMMs fewer a step)"
                 if self.fused_gemms_saved else "projections apart", graph]
        if self.decode_attention != "matmul":
            parts.append(f"{self.decode_attention} decode attention"
                         + (f" (launch {self.tuning.spec()})" if self.tuning is not None else "")
                         + (", the prompt read once a group" if self.shared_prompt else ""))
        if self.fp8 != "off":
            parts.append(f"FP8 projections ({self.fp8_weights} e4m3 weights, {self.fp8}-wise scales)")
        if self.attend_bucket:
            parts.append(f"attention over the filled cache in {self.attend_bucket}-slot steps")
        if self.compile_mode:
            parts.append(f"compile mode {self.compile_mode}")
        if self.prefill_once:
            parts.append("each distinct prompt prefilled once")
        if self.emulate_precision_casts and self.compile:  # (a failed compile turned compile off: eager)
            parts.append("inductor rounding as eager does")
        if self.sample_in_graph:
            parts.append("pick inside the graph")
        if self.fuse_rotary:
            parts.append("q/k norm, rotary and cache write in the attention kernel")
        if self.draw == "triton":
            parts.append("top-k draw in Triton" if self.draw_error is None
                         else "top-k draw in torch (the Triton kernels failed)")
        if self._pick_compiled is not None or self.pick_error:
            parts.append("pick compiled" if self.pick_error is None else "pick eager (its compile failed)")
        if self.patches:
            parts.append(f"pristine copy of {len(self.patches)} patched members")
        return ", ".join(parts)

    @property
    def fp8_weights(self) -> int:
        """FP8 copies the shadow computes through (fp8; a fused group's is one; 0 before the shadow is built)."""
        return len(self._shadow._fp8) if self._shadow is not None else 0

    @property
    def fused_gemms_saved(self) -> int:
        """GEMMs a decode step no longer launches (fuse_projections; 0 before the shadow is built or without one)."""
        return self._shadow.fused_gemms_saved if self._shadow is not None else 0

    def plan(self, batch: int, length: int) -> MemoryPlan:
        """What serving ``batch`` sequences in a ``length``-token cache would allocate now (see MemoryPlan)."""
        return plan_memory(self.model, batch, length, self.dtype,
                           include_shadow=self.decoder is None and self.own_decoder, merge_lora=self.own_decoder,
                           fp8=self.fp8 != "off")

    def _reserve(self, batch: int, length: int) -> None:
        """Before anything new is allocated for this shape: the memory check (on CUDA), then the build."""
        if self.decoder is not None and (batch, length) in self._caches:
            return
        plan = self.plan(batch, length)
        self.last_plan = plan
        if self.memory_check:
            check_memory(plan, self.device)
        self._build()

    def _decode(self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any,
                slot: Any = None, read: int | None = None, groups: Any = None) -> Any:
        """One decode step's float32 logits [B, V]; ``slot`` ([1] on the device, the slot this step writes) goes
        where it is used: as cache_position (transformers 4.x) and to the triton decode attention, with
        ``groups`` (shared_prompt: the loop's entry table and prompt length)."""
        extra = self._cache_kwargs(slot) | (
            {READ_KWARG: read} if read is not None else {}) | (
            {SLOT_KWARG: slot} if self.decode_attention == "triton" and slot is not None else {}) | (
            {GROUPS_KWARG: groups} if groups is not None else {}) | (
            {TUNING_KWARG: self.tuning} if self.tuning is not None and slot is not None else {})
        out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           past_key_values=cache, use_cache=True, **extra)
        if self.fuse_rotary and slot is not None:
            # the layers' write counters (transformers 5), which update() advanced and the kernel does not: one
            # kernel for all of them (the next step's mask reads layer 0's)
            lengths = self._lengths(cache)
            if lengths:
                import torch

                torch._foreach_add_(lengths, 1)
        return out.logits[:, -1, :].float()

    def read_length(self, filled: int, length: int) -> int:
        """The cache slots a decode step's attention reads when ``filled`` slots hold keys (this step's
        included): all ``length`` of them, or with ``attend_bucket`` the filled ones rounded up to it. Each
        distinct value is its own compiled step and CUDA graph, so a generation through a cache of L slots
        captures up to L / attend_bucket graphs (on the first call of each shape, like the one it replaces)."""
        return min(length, _round_up(filled, self.attend_bucket)) if self.attend_bucket else length

    def _cache_kwargs(self, cache_position: Any) -> dict[str, Any]:
        """``cache_position`` where the decoder's forward takes it (transformers 4.x). Why pass it: without it,
        4.57 derives the write position from ``StaticCache.get_seq_length()``, which counts the non-zero key slots
        of batch row 0; a left-padded row 0 whose pad token embeds to zero (an embedding with padding_idx, or
        Unsloth's zeroed pad row) has zero keys there, so the count falls short and decode overwrites the prompt.
        transformers 5 counts writes in the cache itself and its forward has no such argument."""
        return {"cache_position": cache_position} if self._takes_cache_position else {}

    def _rotary_off(self, why: str, level: int = logging.INFO) -> None:
        """Leave the q/k norms, the rotary and the cache write to transformers' forward (inductor's kernels) from
        here on, saying why: what "auto" does where the fused path cannot serve (``level``: info where that is
        expected, a warning where something failed)."""
        from rlstack.payload.fastgen import rotary_attention

        if self.decoder is not None:
            rotary_attention.uninstall(self.decoder)
        self.fuse_rotary, self.rotary_why = False, why
        logging.getLogger(__name__).log(level, "fastgen: the q/k norms, rotary and cache write stay in inductor's "
                                        "kernels: %s", why)

    @staticmethod
    def _lengths(cache: Any) -> list[Any]:
        import torch

        return [layer.cumulative_length for layer in cache.layers
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def _decode_step(self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any,
                     slot: Any = None, read: int | None = None, groups: Any = None) -> Any:
        """One decode step through the compiled function; if compilation itself fails (an unsupported model or
        torch build), fall back to eager decoding, with a warning, rather than failing the training run. The
        cache length is rolled back first because the failed call may have advanced it."""
        if not self.compile:
            return self._decode(input_ids, attention_mask, position_ids, cache, slot, read, groups)
        import torch

        if self.graph == "trees":
            torch.compiler.cudagraph_mark_step_begin()
        if self._compiled_ok:
            return self._step(input_ids, attention_mask, position_ids, cache, slot, read, groups)
        out, why = _first_compiled_call(
            lambda: self._step(input_ids, attention_mask, position_ids, cache, slot, read, groups),
            self._lengths(cache))
        if why is not None and self.fuse_rotary and not self._rotary_asked:
            # "auto" chose the rotary in the kernel: the step without it compiles before anything goes eager
            # (eager is several times slower; a kernel helper inductor could not see did this on the H100)
            self._rotary_off(f"the compiled step with it failed: {why}", logging.WARNING)
            out, why = _first_compiled_call(
                lambda: self._step(input_ids, attention_mask, position_ids, cache, slot, read, groups),
                self._lengths(cache))
        if why is None:
            self._compiled_ok = True
            return out
        self.compile_error = why
        logging.getLogger(__name__).warning("fastgen: compiled decoding failed, using eager: %s", why)
        self.compile = False
        self.graph = "none"
        self._step = self._decode
        return self._decode(input_ids, attention_mask, position_ids, cache, slot, read, groups)

    def _capture(self, cache: Any, loop: _Loop, body: Callable[[], Any],
                 warm: Callable[[], Any] | None = None) -> tuple[Any, Any] | None:
        """(graph, body's output) of ``body`` captured once, right after a prefill: the two warm-up runs (``warm``,
        default ``body``) see a valid cache, and what they advance (the cache's write positions, the loop's state)
        is set back before and after, so their writes land where the first real step overwrites them. None when
        the warm-up left compilation off (nothing compiled to capture). Raises what capture raises."""
        import torch

        state = self._lengths(cache) + loop.tensors()
        snap = [t.clone() for t in state]
        rng = torch.cuda.get_rng_state(self.device)  # a fused warm-up samples: its draws are given back

        def restore() -> None:
            for cur, old in zip(state, snap, strict=True):
                cur.copy_(old)

        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    restore()
                    (warm or body)()
            torch.cuda.current_stream().wait_stream(stream)
            restore()
            if not (self.compile or self.reference_kernels):  # the warm-up's compile failed: nothing to capture
                return None
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self._pool):
                out = body()
            return g, out
        finally:
            torch.cuda.synchronize()
            restore()
            torch.cuda.set_rng_state(rng, self.device)

    def _captured(self, key: tuple[int, int, int], cache: Any, mask: Any, loop: _Loop) -> Any:
        """(graph, logits) of one decode step alone for this cache and read length (key: batch, length, slots
        read), reading the loop's token, position and (transformers 4.x) slot in place; captured on first use
        (a later read length mid-generation: the warm-ups write the slot the next real step overwrites, as
        after a prefill). None when capture is impossible (graph_error)."""
        if key in self._graphs:
            return self._graphs[key]
        read = self._read_arg(key)
        entry = None
        try:
            # the warm-up goes through _decode_step, which compiles, or falls back to eager and says so
            groups = self._groups(loop)
            entry = self._capture(cache, loop,
                                  lambda: self._step(loop.tok, mask, loop.pos, cache, loop.slot, read, groups),
                                  warm=lambda: self._decode_step(loop.tok, mask, loop.pos, cache, loop.slot, read,
                                                                 groups))
        except Exception as exc:
            self.graph_error = error_text(exc)
            logging.getLogger(__name__).warning("fastgen: CUDA graph capture failed, launching kernels: %s",
                                                self.graph_error)
        self._graphs[key] = entry
        return entry

    def _read_arg(self, key: tuple[int, int, int]) -> int | None:
        """What _decode passes as the read length: None for the whole cache, so that without attend_bucket the
        compiled step is the one it always was (no extra keyword)."""
        return key[2] if key[2] < key[1] else None

    def _captured_fused(self, key: tuple[int, int, int], cache: Any, mask: Any, loop: _Loop,
                        sampling: Sampling) -> Any:
        """The graph of one decode step and the pick after it (sample_in_graph); None where it cannot be captured
        (fused_error, said once per shape) or the step alone could not be: the caller then replays the step
        alone. The step alone is captured first either way: its capture proves the compiled step (and the
        profile bench times it)."""
        fkey = (*key, sampling)
        if fkey in self._fused:
            return self._fused[fkey]
        graph = None
        if self._captured(key, cache, mask, loop) is not None:  # the step compiles and captures alone first
            eos = self._eos_tensor(sampling.eos_token_ids)
            read = self._read_arg(key)

            def body() -> None:
                self._pick_step(self._step(loop.tok, mask, loop.pos, cache, loop.slot, read, self._groups(loop)),
                                loop, sampling, eos)

            try:
                captured = self._capture(cache, loop, body)
                graph = captured[0] if captured else None
            except Exception as exc:
                self.fused_error = error_text(exc)
                logging.getLogger(__name__).warning("fastgen: sampling could not join the CUDA graph of (%d, %d, "
                                                    "%d), sampling between replays: %s", *key, self.fused_error)
        self._fused[fkey] = graph
        return graph

    def _eos_tensor(self, ids: tuple[int, ...]) -> Any:
        """The EOS ids on the device, one tensor per set of ids (a captured graph reads the tensor it saw)."""
        if not ids:
            return None
        if ids not in self._eos:
            import torch

            self._eos[ids] = torch.tensor(ids, dtype=torch.long, device=self.device)
        return self._eos[ids]

    def _loop(self, batch: int, length: int) -> _Loop:
        """The decode loop's state for this cache shape, allocated once (a captured graph reads these tensors)."""
        key = (batch, length)
        if key not in self._loops:
            per_entry = 1
            if self.shared_prompt:
                from rlstack.payload.fastgen import split_attention

                cfg = _text_config(self.decoder.config)
                kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads  # None: one per head
                per_entry = split_attention.rows_per_entry(cfg.num_attention_heads // kv)
            self._loops[key] = _Loop.new(batch, length, self.device, per_entry)
        return self._loops[key]

    def _groups(self, loop: _Loop) -> tuple[Any, Any] | None:
        """What the triton decode attention takes for shared_prompt: the loop's entry table and prompt length
        (filled by _run before each generation's first step, read in place by the captured graph)."""
        return (loop.entries, loop.prompt) if self.shared_prompt else None

    def _pick_step(self, logits: Any, loop: _Loop, sampling: Sampling, eos: Any, generator: Any = None) -> None:
        """_pick, through inductor where compile_pick built it (not for a call with its own generator: dynamo
        does not trace one). The first compiled call raises instead of running eager in silence (Unsloth turns
        dynamo's suppress_errors on); if it fails, the loop state it may have advanced is set back, the failure
        is kept in ``pick_error`` and said once, and the eager pick serves from then on."""
        if self._pick_compiled is None or generator is not None:
            return self._pick(logits, loop, sampling, eos, generator, self._kernel_draw(sampling, logits))
        if self._pick_ok:
            return self._pick_compiled(logits, loop, sampling, eos)
        _, why = _first_compiled_call(lambda: self._pick_compiled(logits, loop, sampling, eos), loop.tensors())
        if why is None:
            self._pick_ok = True
            return None
        self.pick_error = why
        logging.getLogger(__name__).warning("fastgen: the compiled pick failed, picking eagerly: %s", why)
        self._pick_compiled = None
        return self._pick(logits, loop, sampling, eos, generator)

    def _kernel_draw(self, sampling: Sampling, logits: Any) -> Callable[[Any, _Loop, Any, int], bool] | None:
        """draw="triton"'s draw for this pick, or None where the torch draw serves (the option off, a sampling the
        kernels do not draw, their first launch failed). The first launch is tried here: where it raises, the
        failure is kept in ``draw_error``, said once, and the torch draw serves from then on."""
        if self.draw != "triton" or self.draw_error is not None:
            return None
        from rlstack.payload.fastgen import topk_draw

        why = topk_draw.applies(sampling.do_sample, sampling.top_k, sampling.top_p, sampling.min_p,
                                logits.shape[-1], logits.shape[0])
        if why != self.draw_why and why is not None and sampling.do_sample:
            # a warning where draw='triton' was asked for; chosen by "auto", the torch draw is what was asked
            logging.getLogger(__name__).log(logging.WARNING if self._draw_asked else logging.INFO,
                                            "fastgen: draw='triton' does not draw %s: drawing in torch", why)
        self.draw_why = why
        if why is not None:
            return None

        def kernel(logits: Any, loop: _Loop, eos: Any, pad: int) -> bool:
            advance = topk_draw.Advance(live=loop.unfinished, eos=eos, tokens=loop.tokens, tok=loop.tok,
                                        pos=loop.pos, pad=pad)
            topk_draw.draw(logits, int(sampling.top_k or 0), sampling.temperature, loop.seed, loop.k, loop.invalid,
                           advance=advance)
            return True

        if self._draw_ok:
            return kernel

        def first(logits: Any, loop: _Loop, eos: Any, pad: int) -> bool:
            # a launch that raises does so before it runs (Triton's compile), so the loop is as it was for torch
            try:
                kernel(logits, loop, eos, pad)
            except Exception as exc:
                self.draw_error = error_text(exc)
                logging.getLogger(__name__).warning("fastgen: the Triton top-k draw failed, drawing in torch: %s",
                                                    self.draw_error)
                return False
            self._draw_ok = True
            return True

        return first

    @staticmethod
    def _pick(logits: Any, loop: _Loop, sampling: Sampling, eos: Any, generator: Any = None,
              kernel: Callable[[Any, _Loop, Any, int], bool] | None = None) -> None:
        """Token ``loop.k`` of every row from the step's logits, then the next step's inputs, all in place on the
        device (no host sync: a CUDA graph can hold it): a finished row gets the pad token, as generate does.
        ``kernel`` (FastGenerator._kernel_draw) draws the sampling rows instead of the torch warpers and draw,
        and does the per-row bookkeeping in the same launch, where it returns True (False: it failed, torch
        draws)."""
        import torch

        logits = _mask_eos_before_min(logits, sampling, loop.k, eos)
        if sampling.do_sample and kernel is not None and kernel(logits, loop, eos, sampling.pad_token_id):
            loop.slot.add_(1)  # the kernel did the rest of the bookkeeping below, row by row
            loop.k.add_(1)
            return
        tok = _draw(_warp(logits, sampling), generator, loop.invalid) if sampling.do_sample else logits.argmax(-1)
        if eos is not None:
            tok = torch.where(loop.unfinished, tok, torch.full_like(tok, sampling.pad_token_id))
            # not torch.isin: with more EOS ids than ~10 * B^0.145 it sorts through a host sync
            loop.unfinished.logical_and_(~(tok[:, None] == eos).any(dim=-1))
        loop.tokens.index_copy_(1, loop.k, tok[:, None])
        loop.tok.copy_(tok[:, None])
        loop.pos.add_(1)
        loop.slot.add_(1)
        loop.k.add_(1)

    def _cache(self, batch: int, length: int) -> Any:
        from transformers import StaticCache

        key = (batch, length)
        entry = self._caches.get(key)
        if entry is None:
            import torch

            cache = StaticCache(config=self.decoder.config, max_cache_len=length)
            mask = torch.ones((batch, length), dtype=torch.long, device=self.device)
            entry = (cache, mask)
            self._caches[key] = entry
            self.compiles += 1
        else:
            entry[0].reset()
        return entry

    def _prefill(self, input_ids: Any, attention_mask: Any, full_mask: Any, positions: Any, cache: Any) -> Any:
        """The prompt's forward into the cache; returns the float32 logits [B, V] of each row's last position.

        With ``prefill_once`` and repeated prompts the forward runs on the first row of each distinct prompt only,
        writing into the cache's first rows (each layer's keys and values narrowed to them for the call, the same
        tensors, so the write counters transformers 5 keeps advance as for the whole batch), and then each row's
        prompt slots and logits are gathered from its prompt's row. The gather reads the source rows into new
        tensors before writing, so rows that are both source and destination are safe."""
        import torch

        batch, prompt_len = input_ids.shape
        # the prompt's cache slots (used where the forward takes cache_position: transformers 4.x, see
        # _cache_kwargs); each decode step's slot is the loop's
        slots = self._cache_kwargs(torch.arange(prompt_len, device=self.device))
        plan = distinct_rows(input_ids, attention_mask) if self.prefill_once else None
        layers = _row_views(cache, batch) if plan is not None else None
        if plan is None or layers is None:
            out = self.decoder(input_ids=input_ids, attention_mask=full_mask, position_ids=positions,
                               past_key_values=cache, use_cache=True, logits_to_keep=1, **slots)
            self.prefilled_rows = batch
            return out.logits[:, -1, :].float()
        firsts, source = plan
        rows = torch.tensor(firsts, device=self.device)
        kept = [(layer.keys, layer.values) for layer in layers]
        try:
            for layer, (keys, values) in zip(layers, kept, strict=True):
                layer.keys, layer.values = keys[:len(firsts)], values[:len(firsts)]
            out = self.decoder(input_ids=input_ids.index_select(0, rows),
                               attention_mask=full_mask.index_select(0, rows),
                               position_ids=positions.index_select(0, rows),
                               past_key_values=cache, use_cache=True, logits_to_keep=1, **slots)
        finally:
            for layer, (keys, values) in zip(layers, kept, strict=True):
                layer.keys, layer.values = keys, values
        index = torch.tensor(source, device=self.device)
        for keys, values in kept:
            # a sliding-window layer holds fewer slots than the prompt: all of them were written
            n = min(prompt_len, keys.shape[2])
            keys[:, :, :n] = keys[:len(firsts), :, :n].index_select(0, index)
            n = min(prompt_len, values.shape[2])
            values[:, :, :n] = values[:len(firsts), :, :n].index_select(0, index)
        self.prefilled_rows = len(firsts)
        return out.logits[:, -1, :].float().index_select(0, index)

    def generate(self, input_ids: Any, attention_mask: Any | None, max_new_tokens: int,
                 sampling: Sampling | None = None, generator: Any = None,
                 on_logits: Callable[[int, Any], None] | None = None) -> Any:
        """Return [B, P + T'] token ids like ``model.generate`` (prompt, then completions padded with the pad token
        after EOS; T' <= max_new_tokens, shorter only when every row finished early).

        ``on_logits(step, logits)`` sees each step's float32 logits [B, V] before sampling, unwarped: what the
        engine computes, for measuring it against the training model (bench/fastgen_fidelity.py). The tensor is
        the engine's buffer, overwritten by the next step: copy what you keep."""
        import torch

        sampling = sampling or Sampling()
        if input_ids.dim() != 2:
            raise FastgenError("fastgen expects input_ids of shape [batch, prompt_len]", "")
        input_ids = input_ids.to(self.device)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.to(self.device)
        if bool((attention_mask[:, -1] == 0).any()):
            raise FastgenError("fastgen needs left-padded prompts (a row ends with padding)",
                               "tokenize with padding_side='left', as TRL does")
        total = _round_up(input_ids.shape[1] + max_new_tokens, self.length_bucket)
        # Normal autograd-free mode whatever the caller runs under: Unsloth's GRPO trainer generates inside
        # torch.inference_mode() and autocast (fp16 unless told bf16). Tensors fastgen keeps between calls (the
        # shadow, caches, graphs) must not become inference tensors, and the shadow computes in its own dtype,
        # as transformers' generate on a model of that dtype does.
        with torch.inference_mode(False), torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            self._reserve(input_ids.shape[0], total)
            was_training = self.decoder.training
            if self._shadow is not None:
                self._shadow.refresh()
            else:
                self.decoder.eval()
            try:
                out = self._run(input_ids, attention_mask, max_new_tokens, total, sampling, generator, on_logits)
            finally:
                if was_training and self._shadow is None:
                    self.decoder.train()
        return out

    def _run(self, input_ids: Any, attention_mask: Any, max_new_tokens: int, total: int, sampling: Sampling,
             generator: Any, on_logits: Callable[[int, Any], None] | None = None) -> Any:
        import torch

        batch, prompt_len = input_ids.shape
        cache, full_mask = self._cache(batch, total)
        full_mask.fill_(1)
        full_mask[:, :prompt_len] = attention_mask
        positions = attention_mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(attention_mask == 0, 1)
        next_pos = positions[:, -1] + 1
        logits = self._prefill(input_ids, attention_mask, full_mask, positions, cache)
        loop = self._loop(batch, total)
        loop.pos.copy_(next_pos[:, None] - 1)  # _pick advances position, slot and k to the first decode step's
        loop.slot.fill_(prompt_len - 1)
        loop.k.zero_()
        loop.tokens.fill_(sampling.pad_token_id)
        loop.unfinished.fill_(True)
        loop.invalid.fill_(False)
        if self.shared_prompt:  # the sequences that share a prompt (one read of the ids, before the loop)
            from rlstack.payload.fastgen import split_attention

            per_entry = loop.entries.shape[1]
            entries = split_attention.prompt_groups(input_ids, attention_mask, per_entry)
            loop.entries.copy_(torch.tensor(split_attention.entry_table(entries, batch, per_entry),
                                            dtype=torch.int32))
            loop.prompt.fill_(prompt_len)
        eos = self._eos_tensor(sampling.eos_token_ids)
        if on_logits is not None:
            on_logits(0, logits)
        if self.draw == "triton" and self._kernel_draw(sampling, logits) is not None:
            # the generation's seed of the kernels' random numbers, from the caller's generator (or torch's
            # default one); drawn only where they draw, so that a torch draw consumes what generate would
            loop.seed.random_(generator=generator)
        self._pick_step(logits, loop, sampling, eos, generator)  # token 0, from the prefill's logits
        # captured only now: the warm-up runs decode token 0 into the slot the first real step overwrites (the
        # loop's slot before this pick was the prompt's last, which a 4.x cache would have lost)
        fused = captured = None
        read = 0
        steps_done = max_new_tokens
        for k in range(1, max_new_tokens):  # decode the token picked at k - 1, then pick token k
            # this step writes slot prompt_len + k - 1 and attends over every slot up to it
            if (new_read := self.read_length(prompt_len + k, total)) != read:
                read = new_read
                key = (batch, total, read)
                if self.graph == "manual":
                    fused = None
                    if self.sample_in_graph and generator is None and on_logits is None:
                        fused = self._captured_fused(key, cache, full_mask, loop, sampling)
                    captured = self._captured(key, cache, full_mask, loop) if fused is None else None
            if fused is not None:
                fused.replay()  # both in one replay
            else:
                if captured is not None:
                    captured[0].replay()
                    logits = captured[1]
                else:
                    logits = self._decode_step(loop.tok, full_mask, loop.pos, cache, loop.slot,
                                               self._read_arg(key), self._groups(loop))
                if on_logits is not None:
                    on_logits(k, logits)
                self._pick_step(logits, loop, sampling, eos, generator)
            if eos is not None and k % 16 == 15 and k < max_new_tokens - 1 and not bool(loop.unfinished.any()):
                steps_done = k + 1
                break
        if sampling.do_sample and bool(loop.invalid.any()):
            raise FastgenError("fastgen: the sampling probabilities were not a distribution (NaN or inf logits) "
                               f"in rows {loop.invalid.nonzero().flatten().tolist()}",
                               "transformers' generate raises the same on such logits: check the model's dtype")
        tokens = loop.tokens[:, :steps_done].clone()
        if eos is not None and steps_done > 0:
            # like generate: stop at the step where the last row finished
            is_eos = torch.isin(tokens, eos)
            first = torch.where(is_eos.any(1), is_eos.int().argmax(1),
                                torch.full_like(is_eos[:, 0], steps_done - 1, dtype=torch.long))
            tokens = tokens[:, : int(first.max()) + 1]
        return torch.cat([input_ids, tokens.to(input_ids.dtype)], dim=1)


def distinct_rows(input_ids: Any, attention_mask: Any) -> tuple[list[int], list[int]] | None:
    """(the first row of each distinct prompt, each row's index among those), or None when no two rows are equal
    (ids and mask): which rows ``prefill_once`` prefills and where each row takes its cache from. Groups as
    ``split_attention.prompt_groups`` finds them (one read of the ids to the host)."""
    from rlstack.payload.fastgen import split_attention

    batch = int(input_ids.shape[0])
    groups = split_attention.prompt_groups(input_ids, attention_mask, batch)
    if len(groups) == batch:
        return None
    source = [0] * batch
    for index, rows in enumerate(groups):
        for row in rows:
            source[row] = index
    return [rows[0] for rows in groups], source


def _row_views(cache: Any, batch: int) -> list[Any] | None:
    """The cache's layers when each holds ``keys`` and ``values`` tensors of ``batch`` rows (a StaticCache after
    its first prefill, transformers 4.57 and 5.x), else None: prefill_once then prefills every row."""
    import torch

    layers = list(getattr(cache, "layers", None) or [])
    for layer in layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)
                and keys.dim() == 4 and values.dim() == 4 and keys.shape[0] == batch == values.shape[0]):
            return None
    return layers or None


def _generation_dtype(model: Any) -> Any:
    """The dtype the shadow computes in: a quantized model's compute dtype (bitsandbytes ``compute_dtype``), else
    bf16 / fp16 when the model holds any, else its first floating dtype. Why the compute dtype first: PEFT's
    prepare_model_for_kbit_training casts every unquantized tensor of a QLoRA model to float32 (norms,
    embeddings), which would otherwise make a float32 shadow: twice the memory and bandwidth of the bf16 model."""
    import torch

    for mod in model.modules():
        compute = getattr(mod, "compute_dtype", None)
        if _is_quantized(mod) and isinstance(compute, torch.dtype):
            return compute
    dtypes = [p.dtype for p in model.parameters() if p.is_floating_point()]
    if torch.bfloat16 in dtypes:
        return torch.bfloat16
    if torch.float16 in dtypes:
        return torch.float16
    return dtypes[0] if dtypes else torch.float32


def release(model: Any) -> None:
    """Drop the model's engine (its bf16 shadow, static caches and CUDA graphs) and return the freed memory to the
    allocator, for the slower path that runs next (transformers' generate) to use. Best effort: never raises.

    Why a collection first: the engine sits in reference cycles (its compiled step and its draw's closures refer
    back to it), so dropping it freed nothing until Python's cyclic collector happened to run (hook.uninstall
    releases through here for that reason). Measured, bench/rollout_peers.py's second variant in one process
    (H100, 2026-12-05) peaked at 25.2 GiB at 8 sequences where the first had 10.6: the first's shadow and caches
    still allocated (that bench uninstalled the hook first, which dropped the engine uncollected, so its release()
    found nothing to collect); with uninstall releasing through here, 10.7 GiB against 10.6 (H100, run id
    20261205T152008-c90011)."""
    if vars(model).pop(ENGINE_ATTR, None) is not None:
        import gc

        gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # freeing cached memory is an optimisation; the fallback must still run
        pass


def get_engine(model: Any, **options: Any) -> FastGenerator:
    """The model's FastGenerator, created on first use (options only apply then).

    Looked up in the object's own attributes, never through getattr: a PeftModel forwards unknown attributes to
    the model it wraps, so getattr found the engine built on the bare base before LoRA wrapped it, and decoded
    without the adapter (caught by the eval test's LoRA case once the tiny model's weights changed)."""
    engine = vars(model).get(ENGINE_ATTR) if hasattr(model, "__dict__") else getattr(model, ENGINE_ATTR, None)
    if engine is None or engine.model is not model:
        engine = FastGenerator(model, **options)
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
             generator: Any = None, **engine_options: Any) -> Any:
    """Fast drop-in for ``model.generate(input_ids, attention_mask, ...)`` returning [B, P + T] ids.

    Pass either a transformers ``generation_config`` (resolved exactly like ``generate`` does, including its
    global defaults such as top_k=50) or the explicit sampling arguments. ``engine_options`` (compile, merge_lora,
    length_bucket, compile_mode, sample_in_graph, fuse_projections, attend_bucket, ...: FastGenerator's) configure
    the per-model engine the first time it is created.
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
    return get_engine(model, **engine_options).generate(input_ids, attention_mask, max_new_tokens, sampling,
                                                        generator)
