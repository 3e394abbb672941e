"""The Docker engine as rlstack sees it: which client to call, whether an engine answers, whether it can
build with BuildKit, whether it can hand GPUs to a container. Every check turns into a DockerError whose
hint says what to install or start, instead of a Docker error message three layers down.

The parsers (`buildkit_problem`, `nvidia_runtime_problem`) are pure so the unit tests pin them without
an engine.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from rlstack.core import runner
from rlstack.core.errors import DockerError

START_HINT = (
    "start the engine (sudo systemctl start docker, or: sudo nohup dockerd >/tmp/dockerd.log 2>&1 &), "
    "or install it: bash .ci/docker-setup.sh"
)
NVIDIA_HINT = (
    "install nvidia-container-toolkit and configure it (sudo nvidia-ctk runtime configure --runtime=docker && "
    "sudo systemctl restart docker); see "
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
)
NVIDIA_HOOKS = ("nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli", "nvidia-ctk")


def client() -> str:
    """The docker client to call (rlstack.stacks.settings: RLSTACK_DOCKER, invoke.yaml, /usr/bin/docker)."""
    from rlstack.stacks import settings

    return settings.docker_client()


def build_env() -> dict[str, str]:
    return {"DOCKER_BUILDKIT": "1"}


def engine_info() -> dict[str, Any]:
    """`docker info` as a dict; DockerError when no client is installed or no engine answers."""
    exe = client()
    if shutil.which(exe) is None and not os.path.exists(exe):
        raise DockerError(f"no Docker client found ('{exe}')", "install Docker (Debian: apt-get install docker.io)")
    proc = runner.run([exe, "info", "--format", "{{json .}}"], capture=True, check=False, quiet=True, timeout=60)
    info: dict[str, Any] = {}
    if proc.stdout.strip():
        try:
            info = json.loads(proc.stdout)
        except json.JSONDecodeError:
            info = {}
    errors = info.get("ServerErrors") or []
    if proc.returncode != 0 or errors or not info.get("ServerVersion"):
        lines = proc.stderr.strip().splitlines()
        detail = "; ".join(errors) or (lines[-1] if lines else "docker info failed")
        raise DockerError(f"no Docker engine answers ({detail})", START_HINT)
    return info


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("+")[0].split("-")[0].split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def buildkit_problem(info: Mapping[str, Any], build_help: str) -> str | None:
    """Why this engine + client cannot do a BuildKit build (secret and cache mounts), or None."""
    version = str(info.get("ServerVersion", "0"))
    if _version_tuple(version) < (18, 9):
        return f"the Docker engine is {version}; BuildKit needs 18.09 or newer"
    if str(info.get("OSType", "linux")) != "linux":
        return f"the engine builds {info.get('OSType')} images; rlstack images are linux"
    if "buildx component is missing" in build_help:
        return "this docker client needs the buildx plugin for BuildKit builds"
    if "--secret" not in build_help:
        return "this docker client's build has no --secret option (no BuildKit)"
    return None


def require_buildkit(info: Mapping[str, Any]) -> None:
    exe = client()
    proc = runner.run([exe, "build", "--help"], capture=True, check=False, quiet=True, env=build_env())
    problem = buildkit_problem(info, proc.stdout + proc.stderr)
    if problem:
        raise DockerError(
            f"BuildKit is unavailable: {problem}",
            "install Debian's docker.io (its 20.10 client has BuildKit built in) or the docker-buildx plugin; "
            "RLSTACK_DOCKER=/path/to/docker picks the client",
        )


def require_buildx() -> None:
    proc = runner.run([client(), "buildx", "version"], capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        raise DockerError("--buildx was asked for, but 'docker buildx' is not installed",
                          "install the docker-buildx plugin, or build without --buildx (built-in BuildKit)")


def nvidia_runtime_problem(info: Mapping[str, Any], which: Callable[[str], str | None] = shutil.which) -> str | None:
    """None when `docker run --gpus all` can work: an 'nvidia' runtime is registered, or the toolkit's
    hook (used by --gpus) is installed."""
    runtimes = info.get("Runtimes") or {}
    if "nvidia" in runtimes:
        return None
    if any(which(tool) for tool in NVIDIA_HOOKS):
        return None
    names = ", ".join(sorted(runtimes)) or "none"
    return f"the Docker engine has no NVIDIA runtime (runtimes: {names}) and nvidia-container-toolkit is not installed"


def require_nvidia_runtime(info: Mapping[str, Any]) -> None:
    problem = nvidia_runtime_problem(info)
    if problem:
        raise DockerError(f"this stack needs a GPU, but {problem}", NVIDIA_HINT)


def image_exists(ref: str) -> bool:
    proc = runner.run([client(), "image", "inspect", "--format", "{{.Id}}", ref], capture=True, check=False,
                      quiet=True)
    return proc.returncode == 0


def inspect(ref: str) -> dict[str, Any]:
    proc = runner.run([client(), "image", "inspect", ref], capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        raise DockerError(f"no image {ref}", "build it: invoke build --stack NAME")
    data = json.loads(proc.stdout)
    return dict(data[0])


def pull(ref: str) -> bool:
    return runner.run([client(), "pull", ref], check=False).returncode == 0
