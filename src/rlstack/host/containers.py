"""`docker run` for the payload: the command lines are built by pure functions (unit-tested without an
engine) and executed by `run`, the one place a container starts.

Every container gets the same hardening: no capabilities, no privilege escalation, a read-only root
filesystem with tmpfs for /tmp and the home folder, and an init process so SIGTERM reaches the trainer
(checkpoints are written before it exits). What must persist lives in named volumes: adapters
(read-only for eval), the Hugging Face cache, run folders (metrics, checkpoints for --resume), and the
compiled kernels (rlstack.payload.kernelcache: FlashInfer, Triton, torch.compile and Unsloth compile minutes
of kernels on a GPU stack's first run, which the read-only root and tmpfs home would otherwise throw away).
Secrets such as HF_TOKEN pass by name only (`-e HF_TOKEN`): the value never appears on a command line,
in an image layer or in `docker inspect`'s Cmd.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rlstack.core import runner
from rlstack.core.errors import DockerError
from rlstack.core.fileio import swap_in
from rlstack.core.paths import PATH_MAP_ENV
from rlstack.host import engine, images
from rlstack.stacks.model import Stack

ADAPTERS_VOLUME = "rlstack-adapters"
HF_CACHE_VOLUME = "rlstack-hf-cache"
RUNS_VOLUME = "rlstack-runs"
KERNEL_CACHE_VOLUME = "rlstack-kernel-cache"
ADAPTERS_MOUNT = "/adapters"
HF_CACHE_MOUNT = "/hf-cache"
RUNS_MOUNT = "/opt/rlstack/runs"
KERNEL_CACHE_MOUNT = "/kernel-cache"  # the images' RLSTACK_KERNEL_CACHE
INPUTS_MOUNT = "/mnt/inputs"
HOST_RUNS = "runs"  # where run folders are copied out to on the host, relative to the current folder
USER_HOME = "/home/rlstack"
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
PASS_ENV = (*SECRET_ENV, "HF_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
            "CUDA_VISIBLE_DEVICES")
# Flags of `rlstack train/eval` whose value may be a file on the host: mounted read-only, path rewritten.
FILE_FLAGS = ("--recipe", "--data")
# NCCL between processes of one host: warnings (not the INFO flood) in the log, and no InfiniBand probe, since
# no hop leaves the machine. NCCL picks P2P/NVLink and shared memory inside a container, sockets between two.
NCCL_ONE_HOST = (("NCCL_DEBUG", "WARN"), ("NCCL_IB_DISABLE", "1"))
# NCCL's shared-memory transport and vLLM's workers live in /dev/shm; Docker's 64 MB default stalls them.
MULTI_GPU_SHM = "16g"


@dataclass(frozen=True)
class Volumes:
    adapters: str = ADAPTERS_VOLUME
    hf_cache: str = HF_CACHE_VOLUME
    runs: str = RUNS_VOLUME
    kernel_cache: str = KERNEL_CACHE_VOLUME


@dataclass(frozen=True)
class RunSpec:
    image: str
    argv: tuple[str, ...]  # arguments to the image's entrypoint (`rlstack`)
    gpus: bool = False  # every GPU of the host (`--gpus all`), unless gpu_ids names some
    gpu_ids: tuple[int, ...] = ()  # these host GPUs only, in this order (cuda:0 inside is the first)
    adapters_read_only: bool = False
    volumes: Volumes | None = field(default_factory=Volumes)  # None: no volume at all (checking an image)
    env_names: tuple[str, ...] = ()  # passed by name: docker reads the values from our environment
    env: tuple[tuple[str, str], ...] = ()  # values that are not secrets (they show on the command line)
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
    if spec.gpu_ids:  # the value is CSV to docker: a list of devices has to be quoted inside it
        cmd += ["--gpus", '"device=' + ",".join(str(i) for i in spec.gpu_ids) + '"']
    elif spec.gpus:
        cmd += ["--gpus", "all"]
    if spec.volumes is not None:
        adapters_opt = ":ro" if spec.adapters_read_only else ""
        cmd += ["-v", f"{spec.volumes.adapters}:{ADAPTERS_MOUNT}{adapters_opt}",
                "-v", f"{spec.volumes.hf_cache}:{HF_CACHE_MOUNT}",
                "-v", f"{spec.volumes.runs}:{RUNS_MOUNT}",
                "-v", f"{spec.volumes.kernel_cache}:{KERNEL_CACHE_MOUNT}"]
    for host, target in spec.binds:
        cmd += ["-v", f"{host}:{target}:ro"]
    for name in spec.env_names:
        if "=" in name:
            raise ValueError(f"env_names takes names only, got {name!r}: a value would show on the command line")
        cmd += ["-e", name]
    for name, value in spec.env:
        if name in SECRET_ENV:
            raise ValueError(f"{name} is a secret: pass it by name (env_names)")
        cmd += ["-e", f"{name}={value}"]
    if spec.entrypoint:
        cmd += ["--entrypoint", spec.entrypoint]
    cmd.append(spec.image)
    cmd += list(spec.argv)
    return cmd


def spec_for(stack: Stack, image: str, argv: Sequence[str], *, adapters_read_only: bool = False,
             interactive: bool = False, entrypoint: str | None = None, volumes: Volumes | None = None,
             environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> RunSpec:
    """The RunSpec for running `rlstack <argv>` of a stack: GPUs exactly when the stack needs them."""
    mapped, binds = map_host_inputs(argv, cwd)
    shown = {target: host for host, target in binds}
    shown[RUNS_MOUNT] = str((cwd or Path.cwd()) / HOST_RUNS)
    return RunSpec(image=image, argv=mapped, gpus=stack.gpu_required, adapters_read_only=adapters_read_only,
                   volumes=volumes or Volumes(), env_names=passthrough_env(environ), binds=binds,
                   interactive=interactive, entrypoint=entrypoint,
                   env=((PATH_MAP_ENV, json.dumps(shown, sort_keys=True)),))


def accelerate_launch(processes: int) -> list[str]:
    """`accelerate launch` arguments for `processes` training processes on this container's GPUs, running
    `rlstack train` as a module (the image's entrypoint is `rlstack`; the launcher needs a module or script).
    Every setting is on the command line, so no accelerate config file is read or needed."""
    multi = ["--multi_gpu"] if processes > 1 else []
    return ["launch", "--num_processes", str(processes), "--num_machines", "1", *multi,
            "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "rlstack.cli"]


def ddp_spec(stack: Stack, image: str, argv: Sequence[str], gpus: int, *,
             environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> RunSpec:
    """`rlstack <argv>` (train) as `gpus` processes, one per GPU (data parallel: each takes its share of every
    batch; rank 0 alone writes the run files and the adapter), on the host's first `gpus` GPUs."""
    from dataclasses import replace

    spec = spec_for(stack, image, [*accelerate_launch(gpus), *argv], entrypoint="accelerate", environ=environ,
                    cwd=cwd)
    return replace(spec, gpu_ids=tuple(range(gpus)), shm_size=MULTI_GPU_SHM, env=(*spec.env, *NCCL_ONE_HOST))


def run(spec: RunSpec, *, capture: bool = False) -> int:
    """Start the container (checking the engine and, for GPU stacks, the NVIDIA runtime first)."""
    info = engine.engine_info()
    if spec.gpus or spec.gpu_ids:
        engine.require_nvidia_runtime(info)
    return runner.run(run_command(spec, engine.client()), check=False, capture=capture).returncode


def ready_image(stack: Stack, *, base_image: str | None = None, ca_cert: str | None = None) -> str:
    """The stack's image, ready to run here: the engine answers, a GPU stack finds the NVIDIA runtime (checked
    before a build that would take minutes and gigabytes), and the image is built when its tag is missing."""
    info = engine.engine_info()
    if stack.gpu_required:
        engine.require_nvidia_runtime(info)
    return images.ensure_built(images.plan(stack, base_image=base_image or None, ca_cert=ca_cert or None))


RUN_KINDS = ("train", "eval")


def run_rel(rel: str) -> str:
    """`rel` when it names one run folder of the runs volume, KIND/NAME (KIND train or eval, NAME one safe name:
    core.names), else an InvalidNameError; checked before anything is copied, moved aside or deleted, so no
    name can reach a folder outside ./runs (a `..` would have swapped a folder beside ./runs away)."""
    from rlstack.core.names import InvalidNameError, check_name

    kind, sep, name = rel.partition("/")
    if not sep or kind not in RUN_KINDS:
        raise InvalidNameError(f"run folder {rel!r} is not {' or '.join(k + '/NAME' for k in RUN_KINDS)}",
                               "invoke runs lists the run folders of the volume")
    check_name(name, f"run name in {rel!r}:")
    return f"{kind}/{name}"


def copy_out(image: str, rel: str, *, volumes: Volumes | None = None, dest_root: Path | None = None) -> Path:
    """Copy `rel` (e.g. train/NAME) from the runs volume to ./runs/rel on the host, so a run's metrics, curve
    and results are files the user has. The copy lands beside the old one and replaces it only when whole."""
    vols = volumes or Volumes()
    root = dest_root or Path.cwd() / HOST_RUNS
    dest = root / run_rel(rel)
    dest.parent.mkdir(parents=True, exist_ok=True)
    exe = engine.client()
    name = f"rlstack-copy-{secrets.token_hex(4)}"
    staging = dest.parent / f".{dest.name}.copy-{secrets.token_hex(4)}"
    runner.run([exe, "create", "--name", name, "-v", f"{vols.runs}:{RUNS_MOUNT}:ro", image], capture=True, quiet=True)
    try:
        proc = runner.run([exe, "cp", f"{name}:{RUNS_MOUNT}/{rel}", str(staging)], capture=True, check=False)
        if proc.returncode != 0:
            raise DockerError(f"nothing to copy at {rel} in the volume {vols.runs}",
                              (proc.stderr.strip().splitlines() or [""])[-1] or None)
        swap_in(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        runner.run([exe, "rm", "-f", name], capture=True, check=False, quiet=True)
    return dest


def list_runs(image: str, *, volumes: Volumes | None = None) -> list[str]:
    """train/NAME and eval/NAME folders in the runs volume."""
    spec = RunSpec(image=image, argv=("-c", f"cd {RUNS_MOUNT} && ls -1d train/* eval/* 2>/dev/null || true"),
                   volumes=volumes or Volumes(), entrypoint="sh", adapters_read_only=True)
    proc = runner.run(run_command(spec, engine.client()), capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        raise DockerError(f"listing the runs volume failed (exit {proc.returncode})",
                          proc.stderr.strip()[-500:] or None)
    return [line.strip() for line in proc.stdout.splitlines() if line.strip() and "*" not in line]


def check_image_command(p: images.BuildPlan, exe: str = "docker") -> list[str]:
    """Re-run the build-time checks in the finished image (now with rlstack installed), as its user, with the
    same hardening as every run (a read-only root with a tmpfs /tmp: Python needs a temporary folder)."""
    a = p.args
    spec = RunSpec(image=p.tag, argv=("-m", "rlstack.scripts.image_checks", "--torch-version", a["TORCH_VERSION"],
                                      "--torch-cuda", a["TORCH_CUDA"], "--gpu-archs", a["GPU_ARCHS"], "--lock",
                                      f"/opt/rlstack/images/{p.stack.name}/requirements.lock", "--stack",
                                      p.stack.name),
                   entrypoint="python", volumes=None)
    return run_command(spec, exe)


def check_image(p: images.BuildPlan) -> None:
    """`rlstack --version` and the build-time checks, in the built image."""
    exe = engine.client()
    runner.run(run_command(RunSpec(image=p.tag, argv=("--version",), volumes=None), exe))
    if runner.run(check_image_command(p, exe), check=False).returncode != 0:
        raise DockerError(f"{p.tag}: the image's environment fails its checks (see above)")


def shell_spec(stack: Stack, image: str, command: str, *, write_adapters: bool = False) -> RunSpec:
    """A bash in the stack's container: interactive when stdin is a terminal and no command is given."""
    if not command and not sys.stdin.isatty():
        raise DockerError("stdin is not a terminal, so there is no interactive shell to open",
                          f"give the command to run after --: invoke shell --stack {stack.name} -- CMD")
    argv = ["-c", command] if command else []
    return spec_for(stack, image, argv, adapters_read_only=not write_adapters, interactive=not command,
                    entrypoint="bash")
