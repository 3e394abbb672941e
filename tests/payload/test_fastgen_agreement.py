"""rlstack.payload.fastgen.divergences: each row's first divergence and the reference's logit gap there."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlstack.payload import fastgen  # noqa: E402


def test_first_divergence_of_each_row_and_the_gap_there() -> None:
    ref = torch.tensor([[1, 2, 3], [1, 2, 3], [4, 4, 4]])
    got = torch.tensor([[1, 2, 3], [1, 0, 2], [0, 4, 4]])
    scores = [torch.zeros(3, 5) for _ in range(3)]
    scores[1][1, 2], scores[1][1, 0] = 10.0, 9.75  # row 1 parts at position 1: a near-tie
    scores[0][2, 4], scores[0][2, 0] = 8.0, 2.0  # row 2 parts at position 0: a real difference
    scores[2][1, 3], scores[2][1, 2] = 0.0, 50.0  # after the divergence nothing counts
    parted = fastgen.divergences(ref, got, scores)
    assert parted == [fastgen.Divergence(1, 1, 0.25), fastgen.Divergence(2, 0, 6.0)]


def test_identical_decodes_have_no_divergence_and_mismatched_inputs_are_refused() -> None:
    ids = torch.tensor([[1, 2], [3, 4]])
    assert fastgen.divergences(ids, ids.clone(), [torch.zeros(2, 5)] * 2) == []
    with pytest.raises(ValueError, match="differ in shape"):
        fastgen.divergences(ids, ids[:, :1], [torch.zeros(2, 5)] * 2)
    with pytest.raises(ValueError, match="output_scores=True"):
        fastgen.divergences(ids, ids, [torch.zeros(2, 5)])
