"""Training metrics history: resume truncation, summaries, the reward curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.payload.train import metrics


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_truncate_after_keeps_checkpointed_steps(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    _write(p, [{"step": i, "reward": float(i)} for i in range(1, 8)])
    assert metrics.truncate_after(p, 4) == 4
    assert [r["step"] for r in metrics.read_rows(p)] == [1, 2, 3, 4]


def test_read_missing_is_empty(tmp_path: Path) -> None:
    assert metrics.read_rows(tmp_path / "none.jsonl") == []


def test_summarize_windows() -> None:
    rows = [{"step": i, "reward": r, "format_mean": r, "step_time_s": 2.0} for i, r in
            enumerate([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0], 1)]
    s = metrics.summarize(rows, ["format"], window=3)
    assert s["steps"] == 10 and s["window"] == 3
    assert s["reward_first"] == pytest.approx(0.2) and s["reward_last"] == pytest.approx(1.0)
    assert s["format_mean_first"] == pytest.approx(0.2) and s["step_time_s_mean"] == 2.0
    assert metrics.summarize([], ["format"]) == {}


def test_no_signal_is_counted_and_said() -> None:
    """Random weights score 0 everywhere: every group ties, nothing is learned, and the run must say so."""
    flat = [{"step": i, "reward": 0.0, "frac_reward_zero_std": 1.0, "grad_norm": 0.0} for i in range(1, 11)]
    s = metrics.summarize(flat, ["correctness", "format"])
    assert s["steps_without_signal"] == 10
    said = metrics.no_signal_warning(s, ["correctness", "format"])
    assert said is not None and "10 steps" in said and "repetition" in said
    # already using it: no advice to add it
    said = metrics.no_signal_warning(s, ["correctness", "format", "repetition"])
    assert said is not None and "add the repetition" not in said
    # one step with a signal is enough to stay quiet; and a trainer that logs no frac_reward_zero_std says nothing
    mixed = [*flat[:9], {**flat[9], "frac_reward_zero_std": 0.5}]
    assert metrics.no_signal_warning(metrics.summarize(mixed, ["format"]), ["format"]) is None
    unlogged = [{"step": i, "reward": 0.0} for i in range(1, 4)]
    assert "steps_without_signal" not in metrics.summarize(unlogged, ["format"])
    assert metrics.no_signal_warning(metrics.summarize(unlogged, ["format"]), ["format"]) is None


def test_a_run_whose_completions_were_all_masked_out_says_so() -> None:
    """The fp8 grpo-step on an H200 (2026-12-04): every 16-token completion cut, and the loss (unsloth_zoo
    2026.10.6 honouring Unsloth's forced DAPO masking) dropped them all: grad norm 0 with rewards that differed.
    Each row says whether its loss masked truncated completions; counted per step and said at the end, with what
    to do. Not counted where the loss kept them, nor for rows that do not say."""
    cut = [{"step": i, "reward": 0.06, "frac_reward_zero_std": 0.5, "grad_norm": 0.0, "completion_clipped_ratio": 1.0,
            "loss_masks_truncated": True} for i in range(1, 4)]
    s = metrics.summarize(cut, ["format"])
    assert s["steps_masked_out"] == 3 and s["steps_without_signal"] == 0
    said = metrics.no_signal_warning(s, ["format"])
    assert said is not None and "mask_truncated_completions" in said and "max_completion_length" in said
    kept = metrics.summarize([{**r, "loss_masks_truncated": False} for r in cut], ["format"])
    assert kept["steps_masked_out"] == 0 and metrics.no_signal_warning(kept, ["format"]) is None
    some = metrics.summarize([*cut[:2], {**cut[2], "completion_clipped_ratio": 0.75}], ["format"])
    assert some["steps_masked_out"] == 2 and metrics.no_signal_warning(some, ["format"]) is None
    assert metrics.masked_out({"step": 1, "completion_clipped_ratio": 1.0}) is None  # does not say: no claim


def test_the_progress_line_names_a_masked_out_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    cb = metrics.make_callback(tmp_path / "m.jsonl", ["format"], 16, mask_truncated=True)
    args, state = SimpleNamespace(max_completion_length=16), SimpleNamespace(global_step=1, max_steps=1,
                                                                             is_world_process_zero=True)
    cb.on_log(args, state, None, logs={"reward": 0.06, "completions/clipped_ratio": 1.0})
    assert "every completion reached max_completion_length (16)" in capsys.readouterr().err
    cb.on_log(args, state, None, logs={"reward": 0.06, "completions/clipped_ratio": 0.5})
    assert "max_completion_length" not in capsys.readouterr().err
    rows = metrics.read_rows(tmp_path / "m.jsonl")
    assert [(r["completion_clipped_ratio"], r["loss_masks_truncated"]) for r in rows] == [(1.0, True), (0.5, True)]
    quiet = metrics.make_callback(tmp_path / "q.jsonl", ["format"], 16, mask_truncated=False)
    quiet.on_log(args, state, None, logs={"reward": 0.06, "completions/clipped_ratio": 1.0})
    assert "max_completion_length" not in capsys.readouterr().err


def test_plot_writes_png(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    _write(p, [{"step": i, "reward": i / 10, "format_mean": i / 10, "correctness_mean": 0.0} for i in range(1, 6)])
    png = metrics.plot_rewards(p, tmp_path / "curve.png", ["correctness", "format"], "t")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert metrics.plot_rewards(tmp_path / "empty.jsonl", tmp_path / "x.png", [], "t") is None


def test_reward_figure_keeps_every_line_visible() -> None:
    # correctness stays at 0, so the total equals format at every step: on one axis it would hide format.
    rows = [{"step": i, "reward": i / 10, "format_mean": i / 10, "correctness_mean": 0.0} for i in range(1, 11)]
    fig = metrics.reward_figure(rows, ["correctness", "format"], "t")
    total, parts = fig.axes
    assert [ln.get_label() for ln in total.lines] == ["total reward: 0.30 -> 0.80"]
    assert [ln.get_label() for ln in parts.lines] == ["correctness: 0.00 -> 0.00", "format: 0.30 -> 0.80"]
    styles = {(ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in [*total.lines, *parts.lines]}
    assert len(styles) == 3  # no two lines drawn alike


def test_each_row_splits_the_step_into_generate_score_and_train(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The rollout and the generate-and-score phase are timed on the trainer instance (as TRL calls them from
    _prepare_inputs); what is left of the step is the loss, backward and optimizer."""
    pytest.importorskip("transformers")
    import time
    from types import SimpleNamespace

    class Trainer:
        def _generate(self, prompts: list[str]) -> list[str]:
            time.sleep(0.05)
            return [p + "!" for p in prompts]

        def _generate_and_score_completions(self, batch: list[str]) -> list[str]:
            out = self._generate(batch)
            time.sleep(0.03)
            return out

    cb = metrics.make_callback(tmp_path / "m.jsonl", ["format"], 8)
    trainer = Trainer()
    assert cb.time_phases(trainer) == ["_generate", "_generate_and_score_completions"]
    args = SimpleNamespace(max_completion_length=16)
    state = SimpleNamespace(global_step=1, max_steps=2, is_world_process_zero=True)
    cb.on_step_begin(args, state, None)
    assert trainer._generate_and_score_completions(["a"]) == ["a!"]  # behaviour unchanged
    time.sleep(0.02)
    cb.on_step_end(args, state, None)
    cb.on_log(args, state, None, logs={"reward": 0.5})
    state.global_step = 2  # a step that reuses buffered completions: no rollout, so 0 is measured
    cb.on_step_begin(args, state, None)
    cb.on_step_end(args, state, None)
    cb.on_log(args, state, None, logs={"reward": 0.5})
    first, second = metrics.read_rows(tmp_path / "m.jsonl")
    assert first["generate_s"] >= 0.05 and first["score_s"] >= 0.03 and first["train_s"] >= 0.02
    # the two timed methods lie inside the step: their time can never exceed the step's (double counting would)
    assert first["generate_s"] + first["score_s"] <= first["step_time_s"]
    assert second["generate_s"] == 0.0 and second["score_s"] == 0.0
    import re

    line = capsys.readouterr().err.splitlines()[0]
    assert re.search(r"s/step \(generate \d+\.\d\ds, score \d+\.\d\ds, train \d+\.\d\ds\)", line), line
    assert metrics.summarize([first, second], ["format"])["generate_s_mean"] == pytest.approx(
        (first["generate_s"] + second["generate_s"]) / 2, abs=1e-4)


def test_a_rollout_that_bypasses_the_timed_method_is_not_reported_as_zero(tmp_path: Path) -> None:
    """A trainer whose generate-and-score phase does not go through self._generate (a subclass that inlines it)
    leaves generate_s and score_s out rather than claiming a zero-second rollout."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    class Inlined:
        def _generate(self, prompts: list[str]) -> list[str]:
            return prompts

        def _generate_and_score_completions(self, batch: list[str]) -> list[str]:
            return batch

    cb = metrics.make_callback(tmp_path / "m.jsonl", ["format"], 8)
    trainer = Inlined()
    cb.time_phases(trainer)
    args = SimpleNamespace(max_completion_length=16)
    state = SimpleNamespace(global_step=1, max_steps=1, is_world_process_zero=True)
    cb.on_step_begin(args, state, None)
    trainer._generate_and_score_completions(["a"])
    cb.on_step_end(args, state, None)
    cb.on_log(args, state, None, logs={"reward": 0.5})
    (row,) = metrics.read_rows(tmp_path / "m.jsonl")
    assert "generate_s" not in row and "score_s" not in row and "train_s" in row
    assert metrics.make_callback(tmp_path / "n.jsonl", ["format"], 8).time_phases(object()) == []


def test_each_row_counts_the_graphs_torch_compile_built_and_the_line_names_a_compiling_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A step that compiles (a first compile, or a recompile after a batch-width change) stalls for minutes with the
    GPU idle; its row and progress line say so, and a step that compiled nothing says nothing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    cb = metrics.make_callback(tmp_path / "m.jsonl", ["format"], 8)
    args, state = SimpleNamespace(max_completion_length=16), SimpleNamespace(global_step=1, max_steps=3,
                                                                             is_world_process_zero=True)
    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    compiled(torch.ones(3))  # one graph
    cb.on_log(args, state, None, logs={"reward": 0.5})
    first = capsys.readouterr().err
    state.global_step = 2
    compiled(torch.ones(3))  # the same shape: no graph
    cb.on_log(args, state, None, logs={"reward": 0.5})
    second = capsys.readouterr().err
    state.global_step = 3
    compiled(torch.ones(5))  # a new shape under dynamic=False: a recompile
    cb.on_log(args, state, None, logs={"reward": 0.5})
    third = capsys.readouterr().err
    rows = metrics.read_rows(tmp_path / "m.jsonl")
    counts = [r["compiled_graphs"] for r in rows]
    assert counts[1] == counts[0] and counts[2] == counts[1] + 1
    assert "torch.compile built" in first and "torch.compile built" not in second
    assert "torch.compile built 1 graph(s) this step" in third
    assert {"fxgraph_cache_hits", "fxgraph_cache_misses", "aot_cache_hits", "aot_cache_misses"} <= set(rows[0])


def test_compile_counts_are_empty_where_dynamo_never_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "torch._dynamo.utils", raising=False)
    assert metrics.compile_counts() == {}
