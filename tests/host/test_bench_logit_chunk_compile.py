"""Why grpo.unsloth_logit_chunk_multiplier defaults to 1, and what bench/logit_chunk_compile.py measures: Dynamo's
graph count over batch widths for the bench's copies of Unsloth's compiled GRPO log-softmax, on the CPU (slow),
and the bench's own handling of configurations and stalls (fast).

The width is what TRL and Unsloth make it each step: the longest completion plus the batch's prompt-length spread."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

ROWS = 64  # the GPU recipe's completions a step before it was sliced (8 prompts x 8)


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("logit_chunk_compile")


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


@pytest.mark.slow
def test_unsloths_default_multiplier_compiles_again_when_the_width_changes_its_remainder(bench: ModuleType) -> None:
    """4 pieces a sequence: torch.chunk gives 256 pieces at width 128 and 251 at 129, a new graph each."""
    assert graphs_over_widths(bench.zoo_2026_6_1, 4, [128, 129]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("release", ["6.1", "10.6"])
def test_one_piece_a_sequence_is_one_graph_at_every_width(bench: ModuleType, release: str) -> None:
    assert graphs_over_widths(bench.RELEASES[release], 1, [128, 129, 130, 131, 133, 141]) == 1


def test_a_configuration_names_a_copied_release(bench: ModuleType) -> None:
    assert bench.parse_config("10.6:16:1") == ("10.6", 16, 1)
    with pytest.raises(SystemExit, match="not one of"):
        bench.parse_config("9.9:16:1")


def test_a_configuration_past_its_time_is_a_row_that_says_so(bench: ModuleType) -> None:
    """A stalled compile is the measurement: the row keeps the configuration and says it did not finish."""
    import argparse

    args = argparse.Namespace(hidden=8, vocab=16, widths=[9], timeout=0.01)
    row = bench.run_isolated("6.1:4:1", args)
    assert (row["release"], row["rows"], row["pieces"]) == ("6.1", 4, 4)
    assert row["status"] == "not done in 0.01 s"
