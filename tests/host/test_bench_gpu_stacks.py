"""bench/gpu_stacks.py's table: a step that could not learn is not counted as one with a learning signal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rlstack.core import results


@pytest.fixture(scope="module")
def gpu_stacks(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("gpu_stacks")


def _record(manifest: dict[str, Any], rows: list[dict[str, Any]], zoo: str) -> dict[str, Any]:
    return {"stack": "fp8", "lock_hash": "2ea309534e2f" * 2, "metrics": rows, "manifest": manifest,
            "environment": {"versions": {"unsloth-zoo": zoo}}, "run": {"rc": 0, "wall_s": 1.0, "gpu_peak_gib": 1.0}}


def test_masked_out_steps_have_no_signal(gpu_stacks: ModuleType) -> None:
    """The 2026-12-03 runs' rows predate loss_masks_truncated and their recipes the option: under Unsloth with
    dapo the mask was asked for (Unsloth forced it), and the loss honoured it at zoo 2026.10.6 (fp8), not at
    2026.6.1 (portable, whose loss rebuilt the mask). Rows that say it are taken as they are."""
    cut = {"step": 1, "grad_norm": 0.0, "frac_reward_zero_std": 0.5, "completion_clipped_ratio": 1.0}
    old = {"recipe": {"grpo": {"loss_type": "dapo"}}, "metrics": {"loader": "unsloth-fp8"}}
    row = gpu_stacks.train_row(_record(old, [cut, {**cut, "step": 2, "completion_clipped_ratio": 0.5}], "2026.10.6"))
    assert row["steps_masked_out"] == 1 and row["steps_with_signal"] == 1
    portable = {"recipe": {"grpo": {"loss_type": "dapo"}}, "metrics": {"loader": "unsloth"}}
    assert gpu_stacks.train_row(_record(portable, [cut], "2026.6.1"))["steps_masked_out"] == 0
    old_transformers = {"recipe": {"grpo": {"loss_type": "dapo"}}, "metrics": {"loader": "transformers"}}
    assert gpu_stacks.train_row(_record(old_transformers, [cut], "2026.10.6"))["steps_masked_out"] == 0
    said = gpu_stacks.train_row(_record(portable, [{**cut, "loss_masks_truncated": True}], "2026.6.1"))
    assert said["steps_masked_out"] == 1 and said["steps_with_signal"] == 0


def test_an_eval_older_than_the_train_is_not_the_rows(gpu_stacks: ModuleType, tmp_path: Path) -> None:
    """An adapter name is reused run after run: the 2026-12-03 eval of gpu-fp8 evaluated the adapter that the
    2026-12-04 train overwrote. The row takes the newer eval, here one that only rlstack's results.json
    brought back (the bench's record was cut off), and never the older one."""
    import json

    old = {"step": "eval", "tag": "fp8-gpu-fp8-vllm", "date": "2026-12-03T12:00:00Z", "backend": "vllm",
           "run": {"rc": 0}, "results": {"n": 32, "accuracy": 0.5}}
    (tmp_path / "fp8-gpu-fp8-vllm-eval.json").write_text(json.dumps(old))
    (tmp_path / "fp8-gpu-fp8-vllm-results.json").write_text(json.dumps({"n": 32}))
    new = {"n": 300, "accuracy": 0.25, "created": "2026-12-04T14:18:55+00:00", "per_question": {"q": False},
           "config": {"adapter_name": "gpu-fp8", "backend": "vllm"}}
    (tmp_path / "fp8-gpu-fp8-vllm-n300-results.json").write_text(json.dumps(new))
    rebuilt = gpu_stacks.results_only_evals([str(tmp_path)], {"fp8-gpu-fp8-vllm": "2026-12-03T11:59:00Z"})
    assert [e["tag"] for e in rebuilt] == ["fp8-gpu-fp8-vllm-n300"]
    assert rebuilt[0]["run"]["rc"] is None and "per_question" not in rebuilt[0]["results"]
    evals = [old, *rebuilt]
    assert gpu_stacks.row_eval("fp8", "2026-12-03T11:00:00Z", evals) is old  # the default size first
    chosen = gpu_stacks.row_eval("fp8", "2026-12-04T14:14:50Z", evals)
    assert chosen is not None and chosen["results"]["accuracy"] == 0.25
    assert gpu_stacks.row_eval("fp8", "2026-12-05T00:00:00Z", evals) is None
    fastgen = {**old, "tag": "fp8-gpu-fp8-vllm-fastgen", "date": "2026-12-06T00:00:00Z"}
    assert gpu_stacks.row_eval("fp8", "2026-12-05T00:00:00Z", [fastgen]) is None
    undated = {**old, "date": None}
    assert gpu_stacks.row_eval("fp8", "2026-12-03T11:00:00Z", [undated]) is None  # cannot be shown newer
    naive = {**old, "date": "2026-12-03T12:00:00"}  # no zone: UTC, compared without a TypeError
    assert gpu_stacks.row_eval("fp8", "2026-12-03T11:00:00Z", [naive]) is naive


def test_a_newer_results_file_replaces_the_older_record_of_its_tag(gpu_stacks: ModuleType, tmp_path: Path) -> None:
    """The bench's record of a tag came back from an earlier run, rlstack's results.json of a later run of the same
    tag did (the later bench record was cut off): the later results are rebuilt; an equal or older file is not."""
    import json

    (tmp_path / "fp8-gpu-fp8-vllm-results.json").write_text(json.dumps(
        {"n": 32, "accuracy": 0.5, "created": "2026-12-04T10:00:00+00:00", "config": {"backend": "vllm"}}))
    newer = gpu_stacks.results_only_evals([str(tmp_path)], {"fp8-gpu-fp8-vllm": "2026-12-03T10:00:00+00:00"})
    assert [e["results"]["accuracy"] for e in newer] == [0.5]
    assert gpu_stacks.results_only_evals([str(tmp_path)], {"fp8-gpu-fp8-vllm": "2026-12-04T10:00:00Z"}) == []


def test_the_step_speedup_over_the_stacks_own_generation(gpu_stacks: ModuleType, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14's step target: the table's run (adapter gpu-portable) against a run of the same stack with
    `--set grpo.fast_generation=false`, medians over steps 2..N; that run stays out of the table."""
    import argparse
    import json

    def train(adapter: str, times: list[float], argv: list[str]) -> dict[str, Any]:
        rows = [{"step": i + 1, "step_time_s": t, "generate_s": t - 0.5} for i, t in enumerate(times)]
        return {**_record({"metrics": {"loader": "unsloth"}}, rows, "2026.6.1"), "stack": "portable",
                "step": "train", "adapter": adapter, "date": "2026-12-04T17:00:00Z", "argv": argv}

    (tmp_path / "portable-train.json").write_text(json.dumps(
        train("gpu-portable", [90.0, 3.0, 3.2, 2.8], ["train", "--stack", "portable"])))
    (tmp_path / "portable-gpu-portable-unsloth-gen-train.json").write_text(json.dumps(
        train("gpu-portable-unsloth-gen", [42.0, 32.0, 33.0],
              ["train", "--stack", "portable", "--set", "grpo.fast_generation=false"])))
    monkeypatch.setattr(gpu_stacks.common, "RESULTS", tmp_path / "results")
    monkeypatch.delenv("OUT", raising=False)
    assert gpu_stacks.cmd_summarize(argparse.Namespace(dirs=[str(tmp_path)], note=None)) == 0
    out = results.read(tmp_path / "results" / "gpu_stacks.json")
    data = out.extra
    assert [r["steps"] for r in out.rows] == [4]  # the table's run only
    f = data["fastgen_step_speedup"]["portable"]
    assert f["default"]["s_per_step_median"] == 3.0 and f["own_generation"]["s_per_step_median"] == 32.5
    assert f["speedup"] == 10.83
    assert "10.83x" in out.notes

    # the two runs on different cards (an H200 lease, then an H100 one): no ratio, and the table says why
    own = json.loads((tmp_path / "portable-gpu-portable-unsloth-gen-train.json").read_text())
    own["gpu"] = {"name": "NVIDIA H200"}
    (tmp_path / "portable-gpu-portable-unsloth-gen-train.json").write_text(json.dumps(own))
    assert gpu_stacks.cmd_summarize(argparse.Namespace(dirs=[str(tmp_path)], note=None)) == 0
    out = results.read(tmp_path / "results" / "gpu_stacks.json")
    data = out.extra
    assert "fastgen_step_speedup" not in data
    assert "not one card" in data["fastgen_step_speedup_not_shown"]["portable"]
    assert "not shown (own generation on NVIDIA H200" in out.notes
