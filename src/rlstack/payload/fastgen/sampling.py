"""What fastgen samples and how: the subset of a GenerationConfig it implements (``Sampling``, resolved by the
model's own rules), transformers' logits warpers in torch, the draw, and the decode loop's on-device state with the
pick that advances it (no host sync, so a CUDA graph can hold it). torch is imported inside functions."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from rlstack.payload.fastgen.errors import FastgenError


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
    Why: the pick's GPU work held a softmax and a sum over the whole vocabulary besides the top-k and the draw
    (bench/fastgen_profile.py pick_parts measures the parts). What it leaves out are
    multinomial's input checks, host syncs that a CUDA graph cannot hold: rows that are not a distribution (a
    NaN or +inf logit, or none finite) are marked in ``invalid`` instead, which the caller checks once per
    generate."""
    import torch

    invalid.logical_or_(~torch.isfinite(warped.amax(dim=-1)))
    q = torch.empty_like(warped).exponential_(1, generator=generator)
    return (warped - q.log()).argmax(dim=-1)


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


def pick(logits: Any, loop: _Loop, sampling: Sampling, eos: Any, generator: Any = None,
         kernel: Callable[[Any, _Loop, Any, int], bool] | None = None) -> None:
    """Token ``loop.k`` of every row from the step's logits, then the next step's inputs, all in place on the
    device (no host sync: a CUDA graph can hold it): a finished row gets the pad token, as generate does.
    ``kernel`` (the engine's Triton draw, fastgen.topk_draw) draws the sampling rows instead of the torch
    warpers and draw, and does the per-row bookkeeping in the same launch, where it returns True (False: it
    failed, torch draws)."""
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
