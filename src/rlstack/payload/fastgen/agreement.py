"""Where two greedy decodes of the same prompts part, and whether that was a near-tie.

fastgen's fused, compiled kernels round bf16 differently from transformers' eager ones, so on a real model greedy
tokens flip where two candidates' logits are within rounding of each other, and the rows differ from there on (so do
transformers' own compiled static-cache path's: docs/performance.md). Counting equal positions
therefore says little about whether the engine computes the same function; the logit gap at each row's first
divergence does: both decodes saw the same prefix there, and a gap of a rounding's size is a tie, a large one a real
difference. The fidelity bench and the GPU tests use this one definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple


class Divergence(NamedTuple):
    row: int
    position: int  # index into the new tokens: the first one where the decodes differ
    gap: float  # the reference's logit of its own token minus its logit of the other decode's token


def divergences(ref: Any, got: Any, scores: Sequence[Any]) -> list[Divergence]:
    """Each row's first divergence between two greedy decodes of the new tokens ([B, T] each) and the
    reference's logit gap there. ``scores``: the reference's logits per step (T tensors of [B, V], what
    ``generate(output_scores=True, return_dict_in_generate=True)`` returns as ``scores``); with greedy decoding
    and no logits processor those are the raw logits, so the gap is >= 0. Rows that never part are left out."""
    if tuple(ref.shape) != tuple(got.shape):
        raise ValueError(f"the decodes differ in shape: {tuple(ref.shape)} and {tuple(got.shape)}")
    if len(scores) < ref.shape[1]:
        raise ValueError(f"{len(scores)} steps of scores for {ref.shape[1]} new tokens: pass generate's "
                         "scores of the same call (output_scores=True, return_dict_in_generate=True)")
    same = (ref == got).int().cumprod(1).sum(1)  # the common prefix length of each row
    out = []
    for row, first in enumerate(int(n) for n in same):
        if first < ref.shape[1]:
            logits = scores[first][row].float()
            out.append(Divergence(row, first, float(logits[ref[row, first]] - logits[got[row, first]])))
    return out
