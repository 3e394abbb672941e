"""GRPO on several GPUs with rollouts from TRL's vLLM server: a docker compose file generated from stack data,
and the run of it (`invoke train --vllm-server STACK`, with --print-compose: the file alone).

Two services. `vllm-server` runs trl's `vllm-serve` (trl 0.24.0's trl/scripts/vllm_serve.py: a FastAPI app
on --port whose GET /health/ answers once vLLM has loaded the model) on the first GPUs, from a stack whose lock
holds trl and vllm, through `python -m rlstack.payload.serve` (the same script, patched for the vLLM the fp8
stack locks: see that module). `trainer` runs `accelerate launch -m rlstack.cli train` on the remaining GPUs with the
recipe set to grpo.vllm_mode=server, and starts only when the server's healthcheck passes. Rank 0 of the
trainer then opens TRL's weight-sync group with the server: a TCPStore on the server's WEIGHT_SYNC_PORT and
an NCCL communicator (vLLM's PyNcclCommunicator) across the two containers, through which the policy's
weights go to vLLM after every optimizer step.

Nothing here is typed by hand: image tags are the project's content tags (images.plan), the server's model
and context length come from the recipe, volumes, hardening and pass-through secrets from the same RunSpec
that `docker run` uses (containers.py). Every check that can fail before a GPU is touched runs first and
names what to do instead: a server stack without vllm or trl, a trainer stack without vllm (trl 0.24's
GRPOTrainer imports vllm and syncs weights through it even in server mode), trl or vllm versions that differ
between the two locks (the HTTP and NCCL protocol between them is trl's and vLLM's own, unversioned), and a
GPU split that leaves either side without a GPU.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlstack.core.errors import DockerError, RlstackError
from rlstack.host import containers
from rlstack.stacks.model import Stack

SERVER = "vllm-server"
TRAINER = "trainer"
SERVER_PORT = 8000  # trl vllm-serve's own default port
WEIGHT_SYNC_PORT = 51216  # trl's VLLMClient(group_port=51216): the TCPStore of the weight-sync group, on the server
HEALTH_PATH = "/health/"
SERVE_MODULE = "rlstack.payload.serve"  # trl's vllm-serve, patched for the locked vLLM
HEALTH_INTERVAL_S = 10
HEALTH_RETRIES = 3
SERVER_GPU_MEMORY = 0.9  # trl vllm-serve's default: the server's GPUs hold nothing else
# trl 0.24 refuses a trainer on the server's own GPU: WeightSyncWorkerExtension.init_communicator compares the
# device UUIDs and raises "Attempting to use the same CUDA device ...". One GPU means colocate mode instead.
COLOCATE_HINT = ("on one GPU, run vLLM inside the trainer instead (TRL's colocate mode), in a stack whose lock "
                 "holds vllm: invoke train --stack {stack} --set grpo.vllm_mode=colocate --set "
                 "grpo.vllm_gpu_memory_utilization=0.3 (vLLM's share of the GPU; training gets the rest)")


class ComposeError(RlstackError):
    """A multi-GPU setup that cannot work, found before anything starts."""


@dataclass(frozen=True)
class GpuSplit:
    server: tuple[int, ...]
    trainer: tuple[int, ...]


def split_gpus(gpus: int, server_gpus: int, colocate_stack: str) -> GpuSplit:
    """The server takes the first `server_gpus` host GPUs, the trainer the rest. Sharing one GPU is refused:
    trl's server checks that the trainer's device is not one of its own."""
    if server_gpus < 1:
        raise ComposeError(f"--server-gpus {server_gpus}: the vLLM server needs at least one GPU")
    if gpus <= server_gpus:
        raise ComposeError(
            f"--gpus {gpus} leaves the trainer no GPU after the server's {server_gpus}: trl's vLLM server refuses "
            "a trainer on its own GPU (it compares device UUIDs when the trainer joins its weight-sync group)",
            f"give it more: --gpus {server_gpus + 1} or more with --server-gpus {server_gpus}; "
            + COLOCATE_HINT.format(stack=colocate_stack))
    return GpuSplit(tuple(range(server_gpus)), tuple(range(server_gpus, gpus)))


def with_both(versions_of: Callable[[Stack], Mapping[str, str]], stacks: Sequence[Stack]) -> list[str]:
    """Stacks whose lock holds trl and vllm (what a server, and a trainer talking to it, need)."""
    return [s.name for s in stacks if {"trl", "vllm"} <= set(versions_of(s))]


def check_stacks(trainer: Stack, server: Stack, versions_of: Callable[[Stack], Mapping[str, str]],
                 all_stacks: Sequence[Stack]) -> dict[str, str]:
    """The server's and trainer's locks can talk to each other; returns the shared {trl, vllm} versions."""
    sv, tv = versions_of(server), versions_of(trainer)
    able = ", ".join(with_both(versions_of, all_stacks)) or "none yet"
    missing = [p for p in ("trl", "vllm") if p not in sv]
    if missing:
        raise ComposeError(f"the server stack {server.name} has no {' and no '.join(missing)} in its lock: it cannot "
                           "run trl vllm-serve",
                           f"serve from a stack whose lock holds both trl and vllm: --vllm-server one of {able}")
    if "vllm" not in tv:
        raise ComposeError(
            f"the trainer stack {trainer.name} has no vllm in its lock: trl {tv.get('trl', '?')}'s GRPOTrainer "
            "refuses use_vllm without vllm installed, and syncs weights to the server through vLLM's NCCL "
            "communicator, in server mode too",
            f"train in a stack whose lock holds vllm at the server's version ({sv['vllm']}): --stack one of {able}; "
            f"without a server, {trainer.name} trains on several GPUs with --gpus N alone")
    for pkg, why in (("trl", "the server's HTTP endpoints and the weight-sync handshake are trl's own"),
                     ("vllm", "both ends of the weight-sync group are vLLM's PyNcclCommunicator")):
        if tv.get(pkg) != sv.get(pkg):
            raise ComposeError(
                f"{pkg} differs between the trainer stack {trainer.name} ({tv.get(pkg)}) and the server stack "
                f"{server.name} ({sv.get(pkg)}): {why}, with no version check between them",
                f"pin the same {pkg} in both stacks' requirements.in and run invoke lock, or serve from "
                f"the trainer's own stack: --vllm-server {trainer.name}")
    return {"trl": sv["trl"], "vllm": sv["vllm"]}


def server_model(recipe: Any) -> str:
    """The model the server loads: the recipe's, as a hub id. Models rlstack makes itself ('tiny', built from the
    recipe; 'embedded:<key>', unpacked from a wheel) exist only inside the trainer's container."""
    from rlstack.payload.embedded import is_embedded

    name = str(recipe.model.name)
    if name == "tiny" or is_embedded(name):
        raise ComposeError(f"the recipe's model is '{name}', which the trainer makes in its own container: the "
                           "vLLM server cannot load it",
                           "give a hub model both containers can download: --model ORG/NAME "
                           "(e.g. Qwen/Qwen3-0.6B), or --set model.name=ORG/NAME")
    if recipe.model.load_in_fp8 or recipe.model.load_in_4bit:
        raise ComposeError("a quantized policy (model.load_in_4bit / load_in_fp8) cannot feed TRL's vLLM server, "
                           "which receives full-precision weights after every step",
                           "train the LoRA on the unquantized model: --set model.load_in_4bit=false (and no --fp8)")
    return name


def trainer_overrides(port: int = SERVER_PORT) -> list[str]:
    """What makes rlstack's GRPOConfig talk to the server service (use_vllm, vllm_mode=server, host, port).
    TRL's own GRPOTrainer drives the server, so the trainer loads through transformers (Unsloth's patched
    trainer runs vLLM in-process instead), and fastgen stays off (vLLM generates the rollouts)."""
    return ['grpo.vllm_mode="server"', f'grpo.vllm_server_host="{SERVER}"', f"grpo.vllm_server_port={port}",
            'model.loader="transformers"', "grpo.fast_generation=false"]


@dataclass(frozen=True)
class ComposePlan:
    project: str
    server: containers.RunSpec
    trainer: containers.RunSpec
    split: GpuSplit
    start_period_s: int
    port: int = SERVER_PORT
    comment: str = ""


def project_name(adapter_name: str) -> str:
    """A compose project name (lowercase letters, digits, '-', '_') for a run."""
    return "rlstack-" + (re.sub(r"[^a-z0-9_-]+", "-", adapter_name.lower()).strip("-") or "run")


def plan(*, trainer_stack: Stack, server_stack: Stack, trainer_image: str, server_image: str, recipe: Any,
         train_argv: Sequence[str], adapter_name: str, gpus: int, server_gpus: int, start_period_s: int,
         environ: Mapping[str, str] | None = None, cwd: Path | None = None, comment: str = "") -> ComposePlan:
    """The two services for one run. `train_argv` is `rlstack train ...` as argv_for renders it, with
    trainer_overrides() among its --set items; `recipe` is the recipe it loads (for the server's model)."""
    split = split_gpus(gpus, server_gpus, server_stack.name)
    model = server_model(recipe)
    if start_period_s < 1:
        raise ComposeError(f"--server-start-s {start_period_s}: the server needs time to load the model")
    passed = tuple(n for n in containers.passthrough_env(environ) if n != "CUDA_VISIBLE_DEVICES")  # gpu_ids decide
    trainer = containers.ddp_spec(trainer_stack, trainer_image, train_argv, len(split.trainer), environ=environ,
                                  cwd=cwd)
    trainer = replace(trainer, gpu_ids=split.trainer, env_names=passed)
    max_len = recipe.grpo.max_prompt_length + recipe.grpo.max_completion_length
    serve = ("-m", SERVE_MODULE, "--model", model, "--host", "0.0.0.0", "--port", str(SERVER_PORT),
             "--tensor_parallel_size", str(len(split.server)), "--max_model_len", str(max_len),
             "--gpu_memory_utilization", str(SERVER_GPU_MEMORY))
    server = containers.RunSpec(image=server_image, argv=serve, entrypoint="python", volumes=None, env_names=passed,
                                env=containers.NCCL_ONE_HOST, gpu_ids=split.server,
                                shm_size=containers.MULTI_GPU_SHM)
    return ComposePlan(project_name(adapter_name), server, trainer, split, start_period_s, comment=comment)


def _service(spec: containers.RunSpec) -> dict[str, Any]:
    """A RunSpec as a compose service: the same hardening, mounts and environment `docker run` gets."""
    svc: dict[str, Any] = {"image": spec.image, "init": True, "cap_drop": ["ALL"],
                           "security_opt": ["no-new-privileges"], "read_only": spec.read_only_root}
    if spec.read_only_root:
        svc["tmpfs"] = ["/tmp:rw,exec,nosuid,nodev,mode=1777",
                        f"{containers.USER_HOME}:rw,exec,nosuid,nodev,uid=1000,gid=1000,mode=0700"]
    svc["shm_size"] = spec.shm_size
    if spec.entrypoint:
        svc["entrypoint"] = [spec.entrypoint]
    svc["command"] = list(spec.argv)
    svc["environment"] = [f"{k}={v}" for k, v in spec.env] + list(spec.env_names)  # bare names: values from here
    vols = []
    if spec.volumes is not None:
        vols += [f"adapters:{containers.ADAPTERS_MOUNT}{':ro' if spec.adapters_read_only else ''}",
                 f"hf-cache:{containers.HF_CACHE_MOUNT}", f"runs:{containers.RUNS_MOUNT}",
                 f"kernel-cache:{containers.KERNEL_CACHE_MOUNT}"]
    vols += [f"{host}:{target}:ro" for host, target in spec.binds]
    if vols:
        svc["volumes"] = vols
    if spec.gpu_ids:
        svc["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": [str(i) for i in spec.gpu_ids], "capabilities": ["gpu"]}]}}}
    return svc


def _escape(value: Any) -> Any:
    """compose interpolates $VAR in every string; a literal $ (in a path, a recipe value) is written $$."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, list):
        return [_escape(v) for v in value]
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    return value


def to_dict(p: ComposePlan) -> dict[str, Any]:
    server = _service(p.server)
    # the model download and the compiled kernels (vLLM's start compiles minutes of them); nothing else
    server["volumes"] = [f"hf-cache:{containers.HF_CACHE_MOUNT}", f"kernel-cache:{containers.KERNEL_CACHE_MOUNT}"]
    probe = (f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{p.port}{HEALTH_PATH}', "
             "timeout=5)")
    server["healthcheck"] = {"test": ["CMD", "python", "-c", probe], "interval": f"{HEALTH_INTERVAL_S}s",
                             "timeout": "10s", "retries": HEALTH_RETRIES, "start_period": f"{p.start_period_s}s"}
    trainer = _service(p.trainer)
    trainer["depends_on"] = {SERVER: {"condition": "service_healthy"}}
    vols = containers.Volumes()
    return _escape({
        "services": {SERVER: server, TRAINER: trainer},
        "volumes": {"adapters": {"name": vols.adapters}, "hf-cache": {"name": vols.hf_cache},
                    "runs": {"name": vols.runs}, "kernel-cache": {"name": vols.kernel_cache}},
    })


def render(p: ComposePlan) -> str:
    import yaml

    head = [
        f"# Generated by rlstack{': ' + p.comment if p.comment else ''}. Regenerate rather than edit.",
        f"# {SERVER}: trl's vllm-serve ({SERVE_MODULE}) on host GPU(s) {','.join(map(str, p.split.server))}; "
        f"healthy once GET {HEALTH_PATH} answers (start_period {p.start_period_s}s, then {HEALTH_RETRIES} tries "
        f"{HEALTH_INTERVAL_S}s apart).",
        f"# {TRAINER}: accelerate launch, {len(p.split.trainer)} process(es) on host GPU(s) "
        f"{','.join(map(str, p.split.trainer))}; rank 0 syncs weights to the server over NCCL (TCPStore on "
        f"{SERVER}:{WEIGHT_SYNC_PORT}).",
        f"# Run: docker compose -p {p.project} -f FILE up --abort-on-container-exit --exit-code-from {TRAINER}",
    ]
    body = yaml.safe_dump(to_dict(p), sort_keys=False, default_flow_style=False, width=1000)
    return "\n".join(head) + "\n" + body


# --- running it ----------------------------------------------------------------------------------------------


def compose_client(probe: Callable[[list[str]], bool] | None = None) -> list[str]:
    """`docker compose` (the v2 plugin) where the docker client has it, else a standalone `docker-compose`."""
    import shutil
    import subprocess

    from rlstack.host import engine

    def answers(cmd: list[str]) -> bool:
        try:
            return subprocess.run(cmd, capture_output=True, check=False, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    check = probe or answers
    exe = engine.client()
    if check([exe, "compose", "version"]):
        return [exe, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone and check([standalone, "version"]):
        return [standalone]
    raise DockerError(f"neither '{exe} compose' nor docker-compose is installed",
                      "install the compose plugin (docker-compose-plugin) or Debian's docker-compose")


# Known ways a server-mode run dies, read from the tail of `compose up`'s output: (pattern, what, what to do).
FAILURES: tuple[tuple[str, str, str], ...] = (
    (r"is unhealthy|dependency failed to start",
     "the vLLM server did not pass its healthcheck (GET {health} on port {port}) within the healthcheck's "
     "start_period of {start}s plus {retries} tries {interval}s apart",
     "a first start downloads the model and captures CUDA graphs: give it longer with --server-start-s; its own "
     "log says why it stalled: docker compose -p {project} logs {server}"),
    (r"vLLM server can't be reached",
     "the trainer could not reach the vLLM server at {server}:{port} within grpo.vllm_server_timeout",
     "check the server's log (docker compose -p {project} logs {server}), or raise grpo.vllm_server_timeout"),
    (r"same CUDA device",
     "the trainer and the vLLM server share a GPU, which trl refuses",
     "give each its own GPU (--gpus and --server-gpus), or on one GPU: colocate mode"),
    (r"TCPStore|DistNetworkError|Connection (?:refused|reset).*(?:51216|store)|store.*[Tt]imed? ?out|"
     r"client socket has timed out",
     "the trainer's rank 0 could not join the vLLM server's weight-sync group: the TCPStore on "
     "{server}:{sync_port} did not answer in time",
     "both containers must be on the compose network (no network_mode: host on one side only) and the port free "
     "on the server; run again with NCCL_DEBUG=INFO in both services' environment to see which side stalled"),
    (r"NCCL error|ncclSystemError|ncclRemoteError|ncclInternalError|ncclUnhandledCudaError|Watchdog caught "
     r"collective operation timeout|NCCL communicator was aborted",
     "NCCL failed or timed out between the trainer and the vLLM server (or between the trainer's processes)",
     "the two containers talk over sockets on the compose network: set NCCL_SOCKET_IFNAME=eth0 if a host has "
     "several interfaces, NCCL_P2P_DISABLE=1 if a P2P/NVLink path hangs inside the trainer, and read the NCCL "
     "WARN lines above; NCCL_DEBUG=INFO shows the transport each side chose"),
    (r"vLLM is not available and `use_vllm` is set",
     "the trainer's stack has no vllm, which trl's GRPOTrainer needs in server mode too",
     "train in a stack whose lock holds vllm (invoke stacks)"),
)


EXCEPTION_LINE = re.compile(r"\b(\w+(?:Error|Exception|Timeout)): (.+)$")


def explain_failure(output: str, p: ComposePlan, rc: int) -> RlstackError | None:
    """The first known failure in a failed run's output, as an error with its fix; None when none matches. The
    last exception line the output holds is quoted too, so a guess never hides what was actually raised."""
    fill = {"health": HEALTH_PATH, "port": p.port, "start": p.start_period_s, "retries": HEALTH_RETRIES,
            "interval": HEALTH_INTERVAL_S, "project": p.project, "server": SERVER, "sync_port": WEIGHT_SYNC_PORT}
    raised = [m.group(0) for line in output.splitlines() if (m := EXCEPTION_LINE.search(line))]
    last = f"; last exception: {raised[-1][:300]}" if raised else ""
    for pattern, what, todo in FAILURES:
        if re.search(pattern, output):
            return RlstackError(f"{what.format(**fill)} (exit {rc}{last})", todo.format(**fill))
    return None


def up(p: ComposePlan, file: Path, client: Sequence[str]) -> int:
    """Start both services, follow them, stop both when the trainer exits; the trainer's exit code. A known
    failure becomes an RlstackError naming its fix. The containers and network are removed afterwards; the
    named volumes (adapters, runs, HF cache) stay."""
    from rlstack.core import runner

    base = [*client, "-p", p.project, "-f", str(file)]
    try:
        rc, tail = runner.run_tee([*base, "up", "--abort-on-container-exit", "--exit-code-from", TRAINER])
    finally:
        runner.run([*base, "down", "--remove-orphans"], check=False, capture=True)
    if rc != 0:
        known = explain_failure("\n".join(tail), p, rc)
        if known is not None:
            raise known
    return rc


def describe(p: ComposePlan) -> str:
    """One line for the log: who runs where."""
    return (f"rlstack: {SERVER} ({p.server.image}) on GPU {','.join(map(str, p.split.server))}, {TRAINER} "
            f"({p.trainer.image}, {len(p.split.trainer)} process(es)) on GPU {','.join(map(str, p.split.trainer))}; "
            f"project {p.project}: {shlex.join(['docker', 'compose', '-p', p.project, 'logs', SERVER])} shows the "
            "server")
