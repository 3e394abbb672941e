"""fastgen's decode attention for the shadow decoder, registered with transformers under ``keywords.ATTN_NAME``.
torch and transformers are imported inside functions."""

from __future__ import annotations

from typing import Any

from rlstack.payload.fastgen.keywords import ATTN_NAME, GROUPS_KWARG, READ_KWARG, SLOT_KWARG, TUNING_KWARG


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
    slots up to that one only. torch's flex_attention in their place was measured and retired
    (docs/decisions/0005-fastgen-defaults.md)."""
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


def register_attention() -> str:
    """Register fastgen's decode attention with transformers; the name to put in the config."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, gqa_decode_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    return ATTN_NAME
