"""The prompt's forward into the static cache, once per distinct prompt where rows repeat it (GRPO's G generations
of each prompt: ``prefill_once``), the rows that repeat it taking its keys, values and last logits. Why: the
prefill is compute-bound, and at GRPO's batch it is most of a generation's fixed cost. torch is imported inside
functions."""

from __future__ import annotations

from typing import Any


def prefill(decoder: Any, input_ids: Any, attention_mask: Any, full_mask: Any, positions: Any, cache: Any,
            slots: dict[str, Any], once: bool) -> tuple[Any, int]:
    """The prompt's forward into the cache: (the float32 logits [B, V] of each row's last position, the rows the
    forward ran). ``slots``: the forward's cache_position keywords for the prompt's slots (transformers 4.x).

    With ``once`` (the engine's ``prefill_once``) and repeated prompts the forward runs on the first row of each
    distinct prompt only, writing into the cache's first rows (each layer's keys and values narrowed to them for
    the call, the same tensors, so the write counters transformers 5 keeps advance as for the whole batch), and
    then each row's prompt slots and logits are gathered from its prompt's row. The gather reads the source rows
    into new tensors before writing, so rows that are both source and destination are safe."""
    import torch

    batch, prompt_len = input_ids.shape
    plan = distinct_rows(input_ids, attention_mask) if once else None
    layers = _row_views(cache, batch) if plan is not None else None
    if plan is None or layers is None:
        out = decoder(input_ids=input_ids, attention_mask=full_mask, position_ids=positions,
                      past_key_values=cache, use_cache=True, logits_to_keep=1, **slots)
        return out.logits[:, -1, :].float(), batch
    firsts, source = plan
    rows = torch.tensor(firsts, device=input_ids.device)
    kept = [(layer.keys, layer.values) for layer in layers]
    try:
        for layer, (keys, values) in zip(layers, kept, strict=True):
            layer.keys, layer.values = keys[:len(firsts)], values[:len(firsts)]
        out = decoder(input_ids=input_ids.index_select(0, rows),
                      attention_mask=full_mask.index_select(0, rows),
                      position_ids=positions.index_select(0, rows),
                      past_key_values=cache, use_cache=True, logits_to_keep=1, **slots)
    finally:
        for layer, (keys, values) in zip(layers, kept, strict=True):
            layer.keys, layer.values = keys, values
    index = torch.tensor(source, device=input_ids.device)
    for keys, values in kept:
        # a sliding-window layer holds fewer slots than the prompt: all of them were written
        n = min(prompt_len, keys.shape[2])
        keys[:, :, :n] = keys[:len(firsts), :, :n].index_select(0, index)
        n = min(prompt_len, values.shape[2])
        values[:, :, :n] = values[:len(firsts), :, :n].index_select(0, index)
    return out.logits[:, -1, :].float().index_select(0, index), len(firsts)


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
