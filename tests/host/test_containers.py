"""`docker run` command lines for train/eval/shell, built without an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack.host import containers, stacks


def _pairs(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


def test_train_command_is_hardened_and_mounts_the_volumes(stack_tree: Path) -> None:
    st = stacks.load_stack("cpu")
    spec = containers.spec_for(st, "rlstack/cpu:abc", containers.train_argv("gsm8k-grpo", ["grpo.max_steps=2"]),
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
    assert "--gpus" not in cmd  # the cpu stack runs CPU-only
    i = cmd.index("rlstack/cpu:abc")
    assert cmd[i + 1:] == ["train", "--recipe", "gsm8k-grpo", "--set", "grpo.max_steps=2"]


def test_gpu_stack_gets_all_gpus(stack_tree: Path) -> None:
    spec = containers.spec_for(stacks.load_stack("portable"), "img", ["train"], environ={})
    assert containers.run_command(spec)[containers.run_command(spec).index("--gpus") + 1] == "all"


def test_eval_mounts_adapters_read_only(stack_tree: Path) -> None:
    spec = containers.spec_for(stacks.load_stack("cpu"), "img", containers.eval_argv("a1", ["-n", "8"]),
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
    vols = containers.Volumes(adapters="t-a", hf_cache="t-h", runs="t-r")
    spec = containers.spec_for(stacks.load_stack("cpu"), "img", ["train"], volumes=vols, environ={})
    assert {"t-a:/adapters", "t-h:/hf-cache", "t-r:/opt/rlstack/runs"} <= set(_pairs(containers.run_command(spec),
                                                                                     "-v"))


def test_cli_without_engine_exits_5_with_the_hint(stack_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from rlstack.cli import main

    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("RLSTACK_DOCKER", str(fake))
    monkeypatch.delenv("RLSTACK_CA_CERT", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    (stack_tree / "images" / "Dockerfile").write_text("FROM scratch\n")
    for argv in (["image", "build", "--stack", "cpu"], ["image", "train", "--stack", "cpu"]):
        assert main(argv) == 5
        err = capsys.readouterr().err
        assert "no Docker engine answers" in err and "docker-setup.sh" in err
