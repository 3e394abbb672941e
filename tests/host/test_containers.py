"""`docker run` command lines for train/eval/shell, built without an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack import stacks
from rlstack.core.errors import DockerError
from rlstack.core.options import argv_for
from rlstack.host import containers, engine, images
from rlstack.payload import commands as payload


def _pairs(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


def test_train_command_is_hardened_and_mounts_the_volumes(stack_tree: Path) -> None:
    st = stacks.load_stack("cpu")
    spec = containers.spec_for(st, "rlstack/cpu:abc", argv_for(payload.train, {"recipe": "gsm8k-grpo",
                                                                                "overrides": ["grpo.max_steps=2"]}),
                               environ={})
    cmd = containers.run_command(spec, "/usr/bin/docker")
    assert cmd[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert "--init" in cmd and "--read-only" in cmd
    assert _pairs(cmd, "--cap-drop") == ["ALL"]
    assert _pairs(cmd, "--security-opt") == ["no-new-privileges"]
    assert any(t.startswith("/tmp:") for t in _pairs(cmd, "--tmpfs"))
    vols = _pairs(cmd, "-v")
    assert "rlstack-adapters:/adapters" in vols
    assert "rlstack-hf-cache:/hf-cache" in vols
    assert "rlstack-kernel-cache:/kernel-cache" in vols  # compiled kernels outlive the --rm container
    assert "--gpus" not in cmd  # the cpu stack runs CPU-only
    i = cmd.index("rlstack/cpu:abc")
    assert cmd[i + 1:] == ["train", "--recipe", "gsm8k-grpo", "--set", "grpo.max_steps=2"]


def test_gpu_stack_gets_all_gpus(stack_tree: Path) -> None:
    spec = containers.spec_for(stacks.load_stack("portable"), "img", ["train"], environ={})
    assert containers.run_command(spec)[containers.run_command(spec).index("--gpus") + 1] == "all"


def test_eval_mounts_adapters_read_only(stack_tree: Path) -> None:
    spec = containers.spec_for(stacks.load_stack("cpu"), "img", argv_for(payload.eval_, {"adapter": "a1", "n": 8}),
                               adapters_read_only=True, environ={})
    cmd = containers.run_command(spec)
    assert "rlstack-adapters:/adapters:ro" in _pairs(cmd, "-v")
    assert cmd[-5:] == ["eval", "--adapter", "a1", "-n", "8"]


def test_secrets_pass_by_name_only(stack_tree: Path) -> None:
    env = {"HF_TOKEN": "hf_secret_value_123", "UNRELATED": "x"}
    spec = containers.spec_for(stacks.load_stack("cpu"), "img", ["train"], environ=env)
    cmd = containers.run_command(spec)
    assert "HF_TOKEN" in _pairs(cmd, "-e")
    assert not any("hf_secret_value_123" in a for a in cmd)
    assert "UNRELATED" not in cmd
    with pytest.raises(ValueError, match="names only"):
        containers.run_command(containers.RunSpec(image="i", argv=(), env_names=("HF_TOKEN=leak",)))


def test_host_files_are_mounted_read_only_and_rewritten(tmp_path: Path) -> None:
    recipe = tmp_path / "my.toml"
    recipe.write_text("name='x'\n")
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    argv, binds = containers.map_host_inputs(
        ["train", "--recipe", "my.toml", f"--data={data}", "--set", "a=1"], cwd=tmp_path)
    assert argv == ("train", "--recipe", "/mnt/inputs/0-my.toml", "--data", "/mnt/inputs/1-d.jsonl", "--set", "a=1")
    assert binds == ((str(recipe), "/mnt/inputs/0-my.toml"), (str(data), "/mnt/inputs/1-d.jsonl"))
    cmd = containers.run_command(containers.RunSpec(image="i", argv=argv, binds=binds))
    assert f"{recipe}:/mnt/inputs/0-my.toml:ro" in _pairs(cmd, "-v")


def test_non_file_values_pass_unchanged(tmp_path: Path) -> None:
    argv, binds = containers.map_host_inputs(["train", "--recipe", "gsm8k-grpo", "--data", "generated:64"],
                                             cwd=tmp_path)
    assert argv == ("train", "--recipe", "gsm8k-grpo", "--data", "generated:64")
    assert binds == ()


def test_shell_overrides_the_entrypoint(stack_tree: Path) -> None:
    spec = containers.spec_for(stacks.load_stack("cpu"), "img", [], interactive=True, entrypoint="bash", environ={})
    cmd = containers.run_command(spec)
    assert "-it" in cmd and _pairs(cmd, "--entrypoint") == ["bash"] and cmd[-1] == "img"


def test_custom_volume_names(stack_tree: Path) -> None:
    vols = containers.Volumes(adapters="t-a", hf_cache="t-h", runs="t-r", kernel_cache="t-k")
    spec = containers.spec_for(stacks.load_stack("cpu"), "img", ["train"], volumes=vols, environ={})
    assert {"t-a:/adapters", "t-h:/hf-cache", "t-r:/opt/rlstack/runs", "t-k:/kernel-cache"} <= set(
        _pairs(containers.run_command(spec), "-v"))


def test_invoke_without_engine_exits_5_with_the_hint_once(stack_tree: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    (stack_tree / "images" / "Dockerfile").write_text("FROM scratch\n")
    env = {**os.environ, "RLSTACK_DOCKER": str(fake)}
    root = Path(__file__).resolve().parents[2]
    for task in (["build", "--stack", "cpu"], ["train", "--stack", "cpu"], ["adapters"]):
        proc = subprocess.run([sys.executable, "-m", "invoke", *task], cwd=root, env=env, capture_output=True,
                              text=True)
        assert proc.returncode == 5, proc.stderr
        assert proc.stderr.count("no Docker engine answers") == 1 and "docker-setup.sh" in proc.stderr


def test_values_that_are_not_secrets_pass_with_their_value(stack_tree: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "mine.toml"
    recipe.write_text("name = 'x'\n")
    spec = containers.spec_for(stacks.load_stack("cpu"), "img", ["train", "--recipe", str(recipe)], environ={},
                               cwd=tmp_path)
    cmd = containers.run_command(spec)
    shown = dict(p.split("=", 1) for p in _pairs(cmd, "-e"))["RLSTACK_PATH_MAP"]
    import json

    assert json.loads(shown) == {"/mnt/inputs/0-mine.toml": str(recipe),
                                 containers.RUNS_MOUNT: str(tmp_path / containers.HOST_RUNS)}
    with pytest.raises(ValueError, match="secret"):
        containers.run_command(containers.RunSpec(image="i", argv=(), env=(("HF_TOKEN", "x"),)))


def test_check_image_runs_hardened_with_a_tmp_and_no_volumes(stack_tree: Path) -> None:
    plan = images.plan(stacks.load_stack("cpu"), base_image="b", git_rev="r", created="c")
    cmd = containers.check_image_command(plan)
    assert "--read-only" in cmd and any(t.startswith("/tmp:") for t in _pairs(cmd, "--tmpfs"))
    assert _pairs(cmd, "-v") == [] and _pairs(cmd, "--entrypoint") == ["python"]
    assert cmd[cmd.index(plan.tag) + 1:][:2] == ["-m", "rlstack.scripts.image_checks"]


def test_gpu_stack_checks_the_nvidia_runtime_before_any_build(stack_tree: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "engine_info", lambda: {"ServerVersion": "27.0", "Runtimes": {"runc": {}}})
    monkeypatch.setattr(engine.shutil, "which", lambda tool: None)

    def no_build(*a: object, **k: object) -> str:
        raise AssertionError("built before checking the NVIDIA runtime")

    monkeypatch.setattr(images, "ensure_built", no_build)
    with pytest.raises(DockerError, match="NVIDIA runtime") as exc:
        containers.ready_image(stacks.load_stack("portable"))
    assert "nvidia-container-toolkit" in str(exc.value)


def test_shell_without_a_terminal_needs_a_command(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    st = stacks.load_stack("cpu")
    with pytest.raises(DockerError, match="not a terminal") as exc:
        containers.shell_spec(st, "img", "")
    assert "invoke shell --stack cpu -- CMD" in str(exc.value)
    spec = containers.shell_spec(st, "img", "ls /adapters")
    cmd = containers.run_command(spec)
    assert "-it" not in cmd and cmd[-3:] == ["img", "-c", "ls /adapters"]
    assert "rlstack-adapters:/adapters:ro" in _pairs(cmd, "-v")
    assert "rlstack-adapters:/adapters" in _pairs(containers.run_command(
        containers.shell_spec(st, "img", "true", write_adapters=True)), "-v")


def test_copy_out_replaces_the_host_copy_only_when_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlstack.core import runner

    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: object) -> object:
        import subprocess

        calls.append(list(cmd))
        if cmd[1] == "cp":
            staging = Path(cmd[3])
            staging.mkdir(parents=True)
            (staging / "metrics.jsonl").write_text("new\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(engine, "client", lambda: "docker")
    old = tmp_path / "runs" / "train" / "r1"
    old.mkdir(parents=True)
    (old / "metrics.jsonl").write_text("old\n")
    dest = containers.copy_out("img", "train/r1", dest_root=tmp_path / "runs")
    assert dest == old and (dest / "metrics.jsonl").read_text() == "new\n"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["r1"]  # no staging or old copy left
    assert [c[1] for c in calls] == ["create", "cp", "rm"]
    assert calls[0][-1] == "img" and f"rlstack-runs:{containers.RUNS_MOUNT}:ro" in calls[0]
