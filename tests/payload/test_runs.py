"""Run-folder semantics, decided before a model loads: the folder lock, resume of a finished run, a resume with a
changed recipe, a crash before the first sealed checkpoint, names and prompt pools refused up front.

The model loader is replaced by one that fails the test: every case here must be settled without loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlstack.cli import main
from rlstack.core.errors import RlstackError
from rlstack.core.locking import FolderInUseError
from rlstack.core.names import InvalidNameError
from rlstack.payload import adapters, recipes
from rlstack.payload.train import checkpoints, grpo, loading, runs


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLSTACK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path / "adapters"))
    monkeypatch.setenv("RLSTACK_LOCK_HASH", "test-lock")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)

    def no_load(*a: object, **k: object) -> None:
        raise AssertionError("the model was loaded: this call should have been settled before any work")

    monkeypatch.setattr(loading, "load_for_training", no_load)
    return tmp_path


def _recipe(*overrides: str) -> recipes.Recipe:
    return recipes.load("smoke-cpu", ["grpo.max_steps=2", "grpo.save_steps=2", *overrides])


def _run(env: Path, name: str = "r", *, steps: int = 2, done: bool = True, adapter: bool = True,
         checkpoint: bool = True, recipe: recipes.Recipe | None = None) -> Path:
    """A run folder as a finished (or interrupted) training leaves it, and its adapter in the store."""
    recipe = recipe or _recipe()
    run_dir = env / "runs" / "train" / name
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(recipe.model_dump_json(indent=2) + "\n")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.1 * s}) + "\n"
                                                   for s in range(1, steps + 1)))
    if checkpoint:
        ckpt = run_dir / "checkpoints" / f"checkpoint-{steps}"
        ckpt.mkdir(parents=True)
        (ckpt / "adapter_model.safetensors").write_bytes(os.urandom(64))
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": steps}))
        checkpoints.seal(ckpt)
    if adapter:
        adapters.write_adapter(env / "adapters", name, lambda d: (d / "adapter_model.safetensors").write_bytes(b"w"),
                               base_model="tiny-x", metrics={"steps": steps}, stack="cpu", lock_hash="l")
    if done:
        (run_dir / "DONE").write_text(str(env / "adapters" / name) + "\n")
    return run_dir


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".rlstack-lock"}


def test_resume_of_a_finished_run_says_so_and_changes_nothing(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(env)
    before = _snapshot(env)
    res = grpo.run(_recipe(), adapter_name="r", resume=True)
    assert res.manifest is not None and res.manifest.name == "r" and res.manifest.metrics["steps"] == 2
    assert "finished at step 2" in capsys.readouterr().err
    assert _snapshot(env) == before  # no step, no adapter replaced, no checkpoint rotated
    res = grpo.run(_recipe(), adapter_name="r", resume=True)  # and again: still nothing
    assert _snapshot(env) == before


def test_resume_with_fewer_steps_refuses_and_changes_nothing(env: Path) -> None:
    _run(env)
    before = _snapshot(env)
    with pytest.raises(runs.RunStateError, match="trained 2 steps already") as exc:
        grpo.run(_recipe("grpo.max_steps=1"), adapter_name="r", resume=True)
    assert "--max-steps 2" in str(exc.value.hint)
    assert _snapshot(env) == before


def test_resume_after_a_kill_during_the_adapter_write_writes_only_the_adapter(env: Path) -> None:
    """The final checkpoint is sealed, the adapter and DONE are not there: no step is trained again."""
    run_dir = _run(env, done=False, adapter=False)
    plan = runs.plan(run_dir, _recipe(), env / "adapters" / "r", resume=True, overwrite=False)
    assert (plan.action, plan.step) == ("adapter-only", 2)
    # a torn adapter (a file changed after the write) is not 'finished' either
    _run(env, "t", done=True, adapter=True)
    (env / "adapters" / "t" / "adapter_model.safetensors").write_bytes(b"torn")
    plan = runs.plan(env / "runs" / "train" / "t", _recipe(), env / "adapters" / "t", resume=True, overwrite=False)
    assert plan.action == "adapter-only"


def test_a_resume_with_a_changed_recipe_refuses_and_keeps_recipe_json(env: Path) -> None:
    run_dir = _run(env, done=False, adapter=False, steps=2, recipe=_recipe("grpo.max_steps=4"))
    before = (run_dir / "recipe.json").read_bytes()
    with pytest.raises(runs.RunStateError) as exc:
        grpo.run(_recipe("grpo.max_steps=4", "lora.r=8"), adapter_name="r", resume=True)
    assert "lora.r: 16 -> 8" in exc.value.message and "left unchanged" in exc.value.message
    assert (run_dir / "recipe.json").read_bytes() == before
    # what a resume may change (here: more steps) is no reason to refuse
    assert runs.recipe_changes(run_dir, _recipe("grpo.max_steps=9", "grpo.save_steps=3")) == []


def test_a_crash_before_the_first_checkpoint_names_one_command(env: Path) -> None:
    """--resume and a plain rerun used to point at each other; both now name --overwrite."""
    run_dir = _run(env, done=False, adapter=False, checkpoint=False)
    hints = []
    for resume in (False, True):
        with pytest.raises(runs.RunStateError, match="before its first sealed checkpoint") as exc:
            grpo.run(_recipe(), adapter_name="r", resume=resume)
        assert "metrics up to step 2" in exc.value.message
        hints.append(str(exc.value.hint))
    assert "--overwrite" in hints[0] and "--resume" not in hints[0]
    assert "without --resume, with --overwrite" in hints[1]
    assert runs.plan(run_dir, _recipe(), env / "adapters" / "r", resume=False, overwrite=True).action == "new"


def test_clear_removes_the_run_files_only(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (tmp_path / "scratch" / "grpo_trainer_lora_model").mkdir(parents=True)
    for name in ("metrics.jsonl", "recipe.json", "DONE", "reward_curve.png", "notes.txt", ".rlstack-lock"):
        (tmp_path / name).write_text("x")
    runs.clear(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rlstack-lock", "notes.txt"]


def test_the_training_loop_writes_relative_paths_into_the_run_folder(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """What unsloth_zoo's load_lora does on every vLLM rollout (a relative save) lands in the run's scratch folder,
    not in the working folder (read-only in an image); the working folder comes back, after an error too."""
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run_dir = tmp_path / "runs" / "r"
    with runs.in_scratch(run_dir) as scratch:
        Path("grpo_trainer_lora_model").mkdir()
        (Path("grpo_trainer_lora_model") / "adapter_config.json").write_text("{}")
    assert (run_dir / runs.SCRATCH / "grpo_trainer_lora_model" / "adapter_config.json").is_file()
    assert scratch == run_dir / runs.SCRATCH and Path.cwd() == elsewhere and not list(elsewhere.iterdir())
    with pytest.raises(RuntimeError), runs.in_scratch(run_dir):
        raise RuntimeError("a failing step")
    assert Path.cwd() == elsewhere


def test_a_second_training_of_one_name_stops_at_once_and_names_the_holder(env: Path) -> None:
    run_dir = env / "runs" / "train" / "r"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom rlstack.core.locking import "
         "exclusive\nwith exclusive(Path(sys.argv[1]), 'x', 'y'):\n    print('held', flush=True)\n"
         "    time.sleep(60)\n", str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        t = time.perf_counter()
        with pytest.raises(FolderInUseError) as exc:
            grpo.run(_recipe(), adapter_name="r")
        assert time.perf_counter() - t < 10  # fails fast, does not wait for the holder
        assert f"pid {holder.pid}" in exc.value.message and exc.value.exit_code == 75
        assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "recipe.json").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("name", ["../escape", "a/b", "has space", "ünïcode", "x" * 300, "", ".hidden", "-x"])
def test_a_bad_name_is_refused_before_any_work(env: Path, name: str) -> None:
    with pytest.raises(InvalidNameError) as exc:
        grpo.run(_recipe(), adapter_name=name)
    assert "--adapter-name" in exc.value.message and "ASCII letters" in str(exc.value.hint)
    assert not (env / "runs").exists() and not (env / "escape").exists()


def test_cli_empty_adapter_name_is_not_the_default(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--recipe", "smoke-cpu", "--adapter-name", ""]) == InvalidNameError.exit_code
    assert "is empty" in capsys.readouterr().err
    assert not (env / "runs").exists()


@pytest.mark.parametrize(("args", "flag"), [(["--max-steps", "-1"], "--max-steps"), (["--max-steps", "0"],
                                                                                     "--max-steps")])
def test_cli_counts_are_blamed_on_their_flag(env: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                             flag: str) -> None:
    assert main(["train", "--recipe", "smoke-cpu", *args]) == 2
    err = capsys.readouterr().err
    assert flag in err and "smoke-cpu.toml" not in err


def test_fewer_prompts_than_one_step_is_refused(env: Path) -> None:
    # smoke-cpu: 16 completions a step / 8 generations = 2 prompts a step
    with pytest.raises(RlstackError, match=r"--data generated-easy:1 gives 1 prompt\(s\); one GRPO step takes 2"):
        grpo.run(_recipe(), data="generated-easy:1", adapter_name="r")
    with pytest.raises(RlstackError, match=r"data.n = 1"):
        grpo.run(_recipe("data.n=1"), adapter_name="r")
    assert not (env / "runs").exists()
