"""`docker run` for the payload: the command lines are built by pure functions (unit-tested without an
engine) and executed by `run`, the one place a container starts.

Every container gets the same hardening: no capabilities, no privilege escalation, a read-only root
filesystem with tmpfs for /tmp and the home folder, and an init process so SIGTERM reaches the trainer
(checkpoints are written before it exits). What must persist lives in named volumes: adapters
(read-only for eval), the Hugging Face cache, and run folders (metrics, checkpoints for --resume).
Secrets such as HF_TOKEN pass by name only (`-e HF_TOKEN`): the value never appears on a command line,
in an image layer or in `docker inspect`'s Cmd.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rlstack.host import engine, runner
from rlstack.host.stacks import Stack

ADAPTERS_VOLUME = "rlstack-adapters"
HF_CACHE_VOLUME = "rlstack-hf-cache"
RUNS_VOLUME = "rlstack-runs"
ADAPTERS_MOUNT = "/adapters"
HF_CACHE_MOUNT = "/hf-cache"
RUNS_MOUNT = "/opt/rlstack/runs"
INPUTS_MOUNT = "/mnt/inputs"
USER_HOME = "/home/rlstack"
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
PASS_ENV = (*SECRET_ENV, "HF_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
            "CUDA_VISIBLE_DEVICES")
# Flags of `rlstack train/eval` whose value may be a file on the host: mounted read-only, path rewritten.
FILE_FLAGS = ("--recipe", "--data")


@dataclass(frozen=True)
class Volumes:
    adapters: str = ADAPTERS_VOLUME
    hf_cache: str = HF_CACHE_VOLUME
    runs: str = RUNS_VOLUME


@dataclass(frozen=True)
class RunSpec:
    image: str
    argv: tuple[str, ...]  # arguments to the image's entrypoint (`rlstack`)
    gpus: bool = False
    adapters_read_only: bool = False
    volumes: Volumes = field(default_factory=Volumes)
    env_names: tuple[str, ...] = ()  # passed by name: docker reads the values from our environment
    binds: tuple[tuple[str, str], ...] = ()  # (host path, container path), always read-only
    interactive: bool = False
    entrypoint: str | None = None
    name: str | None = None
    read_only_root: bool = True
    shm_size: str = "2g"


def passthrough_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    env = os.environ if environ is None else environ
    return tuple(n for n in PASS_ENV if env.get(n))


Binds = tuple[tuple[str, str], ...]


def map_host_inputs(argv: Sequence[str], cwd: Path | None = None) -> tuple[tuple[str, ...], Binds]:
    """Rewrite `--recipe FILE` / `--data FILE` that name host files to read-only mounts under /mnt/inputs.
    Values that are not host files (a recipe name, 'gsm8k', 'generated:64') pass unchanged."""
    base = cwd or Path.cwd()
    out: list[str] = []
    binds: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, value = (arg.split("=", 1) if arg.startswith("--") and "=" in arg else (arg, None))
        if flag in FILE_FLAGS:
            if value is None and i + 1 < len(argv):
                value = argv[i + 1]
                i += 1
            if value is not None:
                host = (base / value).resolve()
                if host.is_file():
                    target = str(PurePosixPath(INPUTS_MOUNT) / f"{len(binds)}-{host.name}")
                    binds.append((str(host), target))
                    value = target
                out += [flag, value]
            else:
                out.append(flag)
        else:
            out.append(arg)
        i += 1
    return tuple(out), tuple(binds)


def run_command(spec: RunSpec, exe: str = "docker") -> list[str]:
    cmd = [exe, "run", "--rm", "--init"]
    if spec.interactive:
        cmd += ["-it"]
    if spec.name:
        cmd += ["--name", spec.name]
    cmd += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--shm-size", spec.shm_size]
    if spec.read_only_root:
        cmd += ["--read-only", "--tmpfs", "/tmp:rw,exec,nosuid,nodev,mode=1777",
                "--tmpfs", f"{USER_HOME}:rw,exec,nosuid,nodev,uid=1000,gid=1000,mode=0700"]
    if spec.gpus:
        cmd += ["--gpus", "all"]
    adapters_opt = ":ro" if spec.adapters_read_only else ""
    cmd += ["-v", f"{spec.volumes.adapters}:{ADAPTERS_MOUNT}{adapters_opt}",
            "-v", f"{spec.volumes.hf_cache}:{HF_CACHE_MOUNT}",
            "-v", f"{spec.volumes.runs}:{RUNS_MOUNT}"]
    for host, target in spec.binds:
        cmd += ["-v", f"{host}:{target}:ro"]
    for name in spec.env_names:
        if "=" in name:
            raise ValueError(f"env_names takes names only, got {name!r}: a value would show on the command line")
        cmd += ["-e", name]
    if spec.entrypoint:
        cmd += ["--entrypoint", spec.entrypoint]
    cmd.append(spec.image)
    cmd += list(spec.argv)
    return cmd


def train_argv(recipe: str | None, overrides: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    argv = ["train"]
    if recipe:
        argv += ["--recipe", recipe]
    for o in overrides:
        argv += ["--set", o]
    return argv + list(extra)


def eval_argv(adapter: str | None, extra: Sequence[str] = ()) -> list[str]:
    argv = ["eval"]
    if adapter:
        argv += ["--adapter", adapter]
    return argv + list(extra)


def spec_for(stack: Stack, image: str, argv: Sequence[str], *, adapters_read_only: bool = False,
             interactive: bool = False, entrypoint: str | None = None, volumes: Volumes | None = None,
             environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> RunSpec:
    """The RunSpec for running `rlstack <argv>` of a stack: GPUs exactly when the stack needs them."""
    mapped, binds = map_host_inputs(argv, cwd)
    return RunSpec(image=image, argv=mapped, gpus=stack.gpu_required, adapters_read_only=adapters_read_only,
                   volumes=volumes or Volumes(), env_names=passthrough_env(environ), binds=binds,
                   interactive=interactive, entrypoint=entrypoint)


def run(spec: RunSpec, *, capture: bool = False) -> int:
    """Start the container (checking the engine and, for GPU stacks, the NVIDIA runtime first)."""
    info = engine.engine_info()
    if spec.gpus:
        engine.require_nvidia_runtime(info)
    return runner.run(run_command(spec, engine.client()), check=False, capture=capture).returncode
