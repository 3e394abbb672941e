"""What `invoke train/eval/adapters` hand to the stack's container, with the engine replaced: the payload's own
flags, the stack's default recipe, the run folder copied out and named by its host path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlstack.host import commands, containers


@pytest.fixture
def engine_free(stack_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """containers.* replaced: records each RunSpec; copy_out makes the host folder it would copy."""
    runs: list[Any] = []
    monkeypatch.setattr(containers, "ready_image", lambda stack, **kw: f"rlstack/{stack.name}:test")

    def run(spec: containers.RunSpec, **kw: Any) -> int:
        runs.append(spec)
        return 0

    def copy_out(image: str, rel: str, **kw: Any) -> Path:
        dest = tmp_path / "runs" / rel
        dest.mkdir(parents=True)
        return dest

    monkeypatch.setattr(containers, "run", run)
    monkeypatch.setattr(containers, "copy_out", copy_out)
    monkeypatch.chdir(tmp_path)
    return runs


def test_train_on_the_cpu_stack_defaults_to_its_own_recipe(engine_free: list[Any],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.train(stack="cpu", max_steps=3, overrides=["grpo.learning_rate=0.1"]) == 0
    argv = list(engine_free[0].argv)
    assert argv[:3] == ["train", "--recipe", "smoke-cpu"] and "--max-steps" in argv
    assert argv[argv.index("--set") + 1] == "grpo.learning_rate=0.1"
    name = argv[argv.index("--adapter-name") + 1]
    assert name.startswith("smoke-cpu-")
    out = capsys.readouterr().out
    assert f"runs/train/{name}/metrics.jsonl" in out and f"invoke eval --stack cpu --adapter {name}" in out


def test_gpu_stacks_default_to_the_report_recipe(engine_free: list[Any]) -> None:
    commands.train(stack="portable", adapter_name="a")
    assert list(engine_free[0].argv)[:3] == ["train", "--recipe", "gsm8k-grpo"] and engine_free[0].gpus


def test_eval_writes_into_the_runs_volume_and_reads_adapters_read_only(engine_free: list[Any],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.eval_(stack="cpu", adapter="demo", n=8, backend="hf") == 0
    spec = engine_free[0]
    argv = list(spec.argv)
    assert spec.adapters_read_only and argv[:3] == ["eval", "--adapter", "demo"]
    assert argv[argv.index("--output") + 1].startswith(f"{containers.RUNS_MOUNT}/eval/demo-")
    assert argv[argv.index("-n"):argv.index("-n") + 2] == ["-n", "8"]
    assert "runs/eval/demo-" in capsys.readouterr().out


def test_adapters_local_runs_natively_and_the_volume_through_a_container(engine_free: list[Any],
                                                                         tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    assert commands.adapters(local=str(tmp_path / "store"), verify=True) == 0
    assert engine_free == []
    assert commands.adapters(stack="portable", verify=True, json_=True) == 0
    spec = engine_free[0]
    assert list(spec.argv) == ["adapters", "--verify", "--json"] and spec.adapters_read_only and not spec.gpus


def test_invoke_train_runs_through_the_click_command_with_converted_values(engine_free: list[Any]) -> None:
    """What invoke parsed reaches the command converted by click: an int, a repeated --set, a switch."""
    import sys

    from rlstack.core import options

    argv = ["--stack", "cpu", "--max-steps", "2", "--set", "a.b=1", "--set", "c.d=2", "--resume"]
    assert options.run(options.command(commands.train), argv, "invoke train") == 0
    got = list(engine_free[0].argv)
    assert got[got.index("--max-steps") + 1] == "2" and "--resume" in got
    assert [got[i + 1] for i, a in enumerate(got) if a == "--set"] == ["a.b=1", "c.d=2"]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import tasks

    assert [a.name for a in tasks.ns["train"].get_arguments()][:3] == ["stack", "recipe", "set"]
