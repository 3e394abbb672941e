"""Why grpo.unsloth_logit_chunk_multiplier defaults to 1: Dynamo's graph count over batch widths, on the CPU.

The two functions below copy the chunking of Unsloth's compiled GRPO log-softmax, chunked_hidden_states_selective_
log_softmax (unsloth_zoo 2026.6.1 rl_replacements.py:73-115: torch.chunk; 2026.10.6 rl_replacements.py:83-190:
fixed row ranges), compiled as Unsloth compiles them (dynamic=True, fullgraph=True, `chunks` a Python int of
rows x multiplier), with a backend that only counts the graphs Dynamo hands it. The width is what TRL and Unsloth
make it each step: the longest completion plus the batch's prompt-length spread."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROWS = 64  # the GPU recipe's completions a step (8 prompts x 8)


def zoo_2026_6_1(hidden: Any, lm_head: Any, index: Any, chunks: int = 4) -> Any:
    import torch

    flat, flat_index = hidden.reshape(-1, hidden.shape[-1]), index.reshape(-1)
    out = []
    for h, i in zip(torch.chunk(flat, chunks=chunks, dim=0), torch.chunk(flat_index, chunks=chunks, dim=0)):  # noqa: B905
        logits = (h @ lm_head.t()).float()
        out.append(torch.gather(logits, -1, i.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1))
    return torch.concat(out).reshape(hidden.shape[0], hidden.shape[1])


def zoo_2026_10_6(hidden: Any, lm_head: Any, index: Any, chunks: int = 4) -> Any:
    import torch

    flat, flat_index = hidden.reshape(-1, hidden.shape[-1]), index.reshape(-1)
    n = flat.shape[0]
    chunks = max(1, min(chunks, n))
    bounds = [(i * n) // chunks for i in range(chunks + 1)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):  # noqa: B905, RUF007 (unsloth_zoo's own loop)
        logits = (flat[a:b] @ lm_head.t()).float()
        out.append(torch.gather(logits, -1, flat_index[a:b].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1))
    return torch.concat(out).reshape(hidden.shape[0], hidden.shape[1])


def graphs_over_widths(fn: Any, multiplier: int, widths: list[int]) -> int:
    torch = pytest.importorskip("torch")
    import torch._dynamo as dynamo

    graphs: list[int] = []

    def counting(gm: Any, example_inputs: Any) -> Any:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    dynamo.reset()
    compiled = torch.compile(fn, dynamic=True, fullgraph=True, backend=counting)
    lm_head = torch.randn(16, 8)
    with torch.no_grad():
        for width in widths:
            hidden, index = torch.randn(ROWS, width, 8), torch.randint(0, 16, (ROWS, width))
            torch.testing.assert_close(
                compiled(hidden, lm_head, index, chunks=ROWS * multiplier),
                fn(hidden, lm_head, index, chunks=ROWS * multiplier),
            )
    return len(graphs)


def test_unsloths_default_multiplier_compiles_again_when_the_width_changes_its_remainder() -> None:
    """4 pieces a sequence: torch.chunk gives 256 pieces at width 128 and 251 at 129, a new graph each."""
    assert graphs_over_widths(zoo_2026_6_1, 4, [128, 129]) == 2


@pytest.mark.parametrize("fn", [zoo_2026_6_1, zoo_2026_10_6])
def test_one_piece_a_sequence_is_one_graph_at_every_width(fn: Any) -> None:
    assert graphs_over_widths(fn, 1, [128, 129, 130, 131, 133, 141]) == 1
