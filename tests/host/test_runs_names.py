"""Run names on the host, with the engine replaced: the copy-out of a run folder never reaches outside ./runs, and
a bad name is refused before an image is built or a container started."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from rlstack.core.names import InvalidNameError
from rlstack.host import commands, containers, engine


@pytest.fixture
def docker_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The docker client replaced: `docker cp` fills the staging folder as a real copy would."""
    from rlstack.core import runner

    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: object) -> object:
        calls.append(list(cmd))
        if cmd[1] == "cp":
            Path(cmd[3]).mkdir(parents=True)
            (Path(cmd[3]) / "metrics.jsonl").write_text("copied\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(engine, "client", lambda: "docker")
    return calls


@pytest.mark.parametrize("rel", ["../precious", "train/../../precious", "train/..", "eval/../../precious",
                                 "train/a/b", "precious", "train/", "train/has space"])
def test_copy_out_never_touches_a_folder_outside_runs(tmp_path: Path, docker_calls: list[list[str]],
                                                      rel: str) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine\n")
    runs = tmp_path / "runs"
    (runs / "train").mkdir(parents=True)
    with pytest.raises(InvalidNameError):
        containers.copy_out("img", rel, dest_root=runs)
    assert (precious / "keep.txt").read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "precious", "runs"]
    assert docker_calls == []  # refused before a container was created


def test_copy_out_of_a_good_name_still_works(tmp_path: Path, docker_calls: list[list[str]]) -> None:
    dest = containers.copy_out("img", "train/run-1", dest_root=tmp_path / "runs")
    assert dest == tmp_path / "runs" / "train" / "run-1" and (dest / "metrics.jsonl").read_text() == "copied\n"


@pytest.fixture
def no_engine(stack_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("work started (an image or a container) before the name was checked")

    for name in ("ready_image", "run", "copy_out"):
        monkeypatch.setattr(containers, name, refuse)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "x" * 300, "ünï", "two words"])
def test_host_train_refuses_a_bad_name_before_any_work(no_engine: None, name: str) -> None:
    with pytest.raises(InvalidNameError, match="--adapter-name"):
        commands.train(stack="cpu", adapter_name=name)


def test_host_runs_copy_checks_every_name_first(no_engine: None) -> None:
    with pytest.raises(InvalidNameError):
        commands.runs(stack="cpu", copy=["train/ok", "train/../x"])


def test_host_eval_names_its_run_folder_safely(stack_tree: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedded model's id holds ':' and a hub id '/': the eval run folder is still one safe name."""
    seen: list[str] = []
    monkeypatch.setattr(containers, "ready_image", lambda stack, **kw: "img")
    monkeypatch.setattr(containers, "run", lambda spec, **kw: 0)
    monkeypatch.setattr(containers, "copy_out", lambda image, rel, **kw: seen.append(containers.run_rel(rel)))
    monkeypatch.chdir(tmp_path)
    commands.eval_(stack="cpu", model="embedded:smollm2-135m")
    assert seen and seen[0].startswith("eval/embedded-smollm2-135m-")


@pytest.mark.parametrize("name", ["", "x" * 300, "two words", "-rf"])
def test_host_eval_refuses_a_bad_adapter_name_before_any_work(no_engine: None, name: str) -> None:
    """They reached Docker (an image build, a container) before the stack refused them."""
    with pytest.raises(InvalidNameError, match="--adapter"):
        commands.eval_(stack="cpu", adapter=name)
