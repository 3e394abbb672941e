"""The compiled-kernel caches go under one folder when RLSTACK_KERNEL_CACHE names it, and only then."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlstack.payload import kernelcache


def test_every_library_variable_lands_under_the_root(tmp_path: Path) -> None:
    env = {kernelcache.ROOT_ENV: str(tmp_path / "kc")}
    done = kernelcache.apply(env)
    assert set(done) == set(kernelcache.VARIABLES)
    for name, sub in kernelcache.VARIABLES.items():
        assert env[name] == str(tmp_path / "kc" / "native" / sub) and Path(env[name]).is_dir()


def test_each_stack_and_lock_has_its_own_folder(tmp_path: Path) -> None:
    """One volume serves every image; a stack never reads what another lock's libraries generated."""
    a = {kernelcache.ROOT_ENV: str(tmp_path), "RLSTACK_STACK": "fp8", "RLSTACK_LOCK_HASH": "2ea309534e2f2a60df99"}
    b = {**a, "RLSTACK_STACK": "portable", "RLSTACK_LOCK_HASH": "02776cf15f3e0000"}
    kernelcache.apply(a)
    kernelcache.apply(b)
    assert a["UNSLOTH_COMPILE_LOCATION"] == str(tmp_path / "fp8-2ea309534e2f" / "unsloth_compiled_cache")
    assert b["UNSLOTH_COMPILE_LOCATION"] == str(tmp_path / "portable-02776cf15f3e" / "unsloth_compiled_cache")


def test_the_users_own_setting_stays(tmp_path: Path) -> None:
    env = {kernelcache.ROOT_ENV: str(tmp_path), "TRITON_CACHE_DIR": "/mine"}
    done = kernelcache.apply(env)
    assert env["TRITON_CACHE_DIR"] == "/mine" and "TRITON_CACHE_DIR" not in done


def test_nothing_without_the_root() -> None:
    env = {"HOME": "/h"}
    assert kernelcache.apply(env) == {} and env == {"HOME": "/h"}


def test_an_unwritable_root_does_not_stop_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = {kernelcache.ROOT_ENV: str(blocker / "kc")}
    assert kernelcache.apply(env) == {}
    assert not set(kernelcache.VARIABLES) & set(env)


def test_the_cli_sets_them_before_a_command_runs(tmp_path: Path) -> None:
    """rlstack's CLI applies it first, so the libraries a command imports later read the folders."""
    code = ("import os, sys; from rlstack import cli; rc = cli.main(['adapters', '--root', sys.argv[1]]); "
            "print(os.environ.get('FLASHINFER_WORKSPACE_BASE'))")
    env = {k: v for k, v in os.environ.items()
           if k not in kernelcache.VARIABLES and k not in ("RLSTACK_STACK", "RLSTACK_LOCK_HASH")}
    env[kernelcache.ROOT_ENV] = str(tmp_path / "kc")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "adapters")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == str(tmp_path / "kc" / "native" / "flashinfer"), out.stderr


def test_the_vllm_server_applies_it_before_vllm_is_imported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """compose runs the server as `python -m rlstack.payload.serve`, past rlstack's CLI: it applies it itself."""
    from rlstack.payload import serve

    for name in (*kernelcache.VARIABLES, "RLSTACK_STACK", "RLSTACK_LOCK_HASH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(kernelcache.ROOT_ENV, str(tmp_path))
    seen: dict[str, str | None] = {}

    def prepare() -> None:  # the first step that imports trl and vllm
        seen["flashinfer"] = os.environ.get("FLASHINFER_WORKSPACE_BASE")
        raise SystemExit(0)

    monkeypatch.setattr(serve, "prepare", prepare)
    with pytest.raises(SystemExit):
        serve.main([])
    assert seen["flashinfer"] == str(tmp_path / "native" / "flashinfer")


def test_inductors_folder_is_taken_back_from_torchs_default_after_unsloth_popped_it(tmp_path: Path) -> None:
    """`import unsloth` pops TORCHINDUCTOR_CACHE_DIR and torch then writes its /tmp default into the environment;
    apply() alone would keep that default as if a user had chosen it."""
    root = tmp_path / "kc"
    ours = str(root / "native" / "inductor")
    env = {kernelcache.ROOT_ENV: str(root), kernelcache.INDUCTOR: "/tmp/torchinductor_someone"}
    kernelcache.apply(env)
    assert env[kernelcache.INDUCTOR] == "/tmp/torchinductor_someone"  # what apply leaves
    assert kernelcache.reclaim_inductor(env, torch_default="/tmp/torchinductor_someone") == ours
    assert env[kernelcache.INDUCTOR] == ours and Path(ours).is_dir()
    popped = {kernelcache.ROOT_ENV: str(root)}
    assert kernelcache.reclaim_inductor(popped, torch_default="/tmp/torchinductor_someone") == ours
    assert popped[kernelcache.INDUCTOR] == ours


def test_reclaiming_keeps_a_users_own_inductor_folder_and_needs_the_root(tmp_path: Path) -> None:
    mine = {kernelcache.ROOT_ENV: str(tmp_path), kernelcache.INDUCTOR: "/mine"}
    assert kernelcache.reclaim_inductor(mine, torch_default="/tmp/torchinductor_someone") is None
    assert mine[kernelcache.INDUCTOR] == "/mine"
    bare = {kernelcache.INDUCTOR: "/tmp/torchinductor_someone"}
    assert kernelcache.reclaim_inductor(bare, torch_default="/tmp/torchinductor_someone") is None
    assert bare == {kernelcache.INDUCTOR: "/tmp/torchinductor_someone"}


def test_torchs_default_is_what_importing_dynamo_writes() -> None:
    """The default reclaim_inductor compares against is the one torch really writes (torch 2.10 here)."""
    pytest.importorskip("torch")
    code = "import os, torch._dynamo; print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'))"
    env = {k: v for k, v in os.environ.items() if k != kernelcache.INDUCTOR}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == kernelcache.torch_default_inductor_dir(), out.stderr
