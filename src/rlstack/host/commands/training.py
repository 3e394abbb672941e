"""`invoke train`: GRPO in a stack's container, on one GPU or the CPU, data-parallel on several (--gpus), or
with its rollouts served by a vLLM server from another stack (--vllm-server: a docker compose project)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from rlstack.core.errors import RlstackError
from rlstack.core.options import argv_for, lent
from rlstack.core.paths import shown
from rlstack.host.commands.aliases import BaseImage, CaCert, StackName
from rlstack.host.commands.incontainer import copy_run, in_container, load_stack
from rlstack.payload import commands as payload

# Several GPUs (invoke train --gpus, --vllm-server).
VllmServer = Annotated[str | None, typer.Option(help="serve the rollouts from this stack with trl vllm-serve (its "
                                                     "lock holds trl and vllm, e.g. fp8): server and trainer run as "
                                                     "a docker compose project")]
Gpus = Annotated[int | None, typer.Option(help="GPUs to use, the host's first N: N > 1 trains N data-parallel "
                                               "processes (accelerate launch); with --vllm-server, the server's and "
                                               "the trainer's together (default 2)")]
ServerGpus = Annotated[int, typer.Option(help="GPUs of the vLLM server, the first of --gpus (tensor parallel); the "
                                              "trainer gets the rest")]
ServerStartS = Annotated[int, typer.Option(help="seconds the vLLM server may take to answer GET /health/ (the "
                                                "healthcheck's start_period: model download, CUDA graph capture)")]
DEFAULT_SERVER_GPUS = 1
DEFAULT_SERVER_START_S = 900


def _train_values(s: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The payload train call a host command makes: the stack's default recipe, a dated adapter name."""
    values = lent(payload.train, given)
    values["recipe"] = values.get("recipe") or s.default_recipe
    from rlstack.core.names import check_name, to_name

    if values.get("adapter_name") is None:
        stem = to_name(Path(values["recipe"]).stem)[:100]
        values["adapter_name"] = f"{stem}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    else:  # before any image is built: the name becomes a folder in the volumes and in ./runs
        check_name(values["adapter_name"], "--adapter-name")
    return values


def _with_server(s: Any, values: dict[str, Any], vllm_server: str, gpus: int | None, server_gpus: int,
                 server_start_s: int, base_image: str | None, ca_cert: str | None, *, run: bool) -> tuple[int, str]:
    """A server-mode run (`--vllm-server`): both services of its compose project, printed (`run=False`: image
    tags computed, nothing built or started) or written under runs/compose and run (the trainer's exit code).
    The checks that need no image or engine come first; `values` are the payload train call, to which the
    server overrides are added."""
    from rlstack import stacks as stack_files
    from rlstack.host import compose, containers, engine, images
    from rlstack.payload import recipes
    from rlstack.stacks import locks

    server = load_stack(vllm_server)
    all_stacks = [stack_files.load_stack(n) for n in stack_files.stack_names()]
    compose.check_stacks(s, server, locks.locked_versions, all_stacks)
    total = 2 if gpus is None else gpus
    compose.split_gpus(total, server_gpus, server.name)
    if values.get("fp8"):
        raise compose.ComposeError("--fp8 runs vLLM inside the trainer (Unsloth fast_inference), not on a server",
                                   "drop --fp8 with --vllm-server")
    values = {**values, "overrides": [*compose.trainer_overrides(), *(values.get("overrides") or [])]}
    recipe = recipes.load(values["recipe"], payload.train_overrides(values["overrides"], values.get("data"),
                                                                    values.get("model"), values.get("max_steps")))
    compose.server_model(recipe)
    if run:
        client = compose.compose_client()
        engine.require_nvidia_runtime(engine.engine_info())

    def image_of(st: Any) -> str:
        if run:
            return containers.ready_image(st, base_image=base_image, ca_cert=ca_cert)
        return images.plan(st, base_image=base_image or None, ca_cert=ca_cert or None).tag

    words = ["invoke train", f"--stack {s.name}", f"--vllm-server {vllm_server}"] + \
        ([f"--gpus {gpus}"] if gpus is not None else [])
    p = compose.plan(trainer_stack=s, server_stack=server, trainer_image=image_of(s), server_image=image_of(server),
                     recipe=recipe, train_argv=argv_for(payload.train, values), adapter_name=values["adapter_name"],
                     gpus=total, server_gpus=server_gpus, start_period_s=server_start_s, comment=" ".join(words))
    if not run:
        print(compose.render(p), end="")
        return 0, p.trainer.image
    from rlstack.core.fileio import write_atomic

    file = Path.cwd() / containers.HOST_RUNS / "compose" / f"{p.project}.yaml"
    file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(file, compose.render(p))
    print(f"rlstack: compose file {shown(file)}\n{compose.describe(p)}", file=sys.stderr)
    return compose.up(p, file, client), p.trainer.image


def train(
    stack: StackName = "cpu",
    recipe: payload.Recipe = None,
    overrides: payload.Overrides = None,
    data: payload.Data = None,
    model: payload.Model = None,
    max_steps: payload.MaxSteps = None,
    adapter_name: payload.AdapterName = None,
    resume: payload.Resume = False,
    fp8: payload.Fp8 = False,
    overwrite: payload.Overwrite = False,
    json_: payload.TrainJson = False,
    gpus: Gpus = None,
    vllm_server: VllmServer = None,
    server_gpus: ServerGpus = DEFAULT_SERVER_GPUS,
    server_start_s: ServerStartS = DEFAULT_SERVER_START_S,
    print_compose: Annotated[bool, typer.Option(help="with --vllm-server: print the docker compose file of the run "
                                                     "and start nothing (no image is built: the tags are "
                                                     "computed)")] = False,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
) -> int:
    """GRPO training in the stack's container (GPU stacks: --gpus all). The adapter lands in the
    rlstack-adapters volume; metrics, checkpoints and the reward curve are copied out to ./runs/train/NAME.

    --gpus N (N > 1) trains N data-parallel processes with accelerate launch in that one container;
    --vllm-server STACK runs a docker compose project (rollouts from TRL's vLLM server, a vllm-server service
    and a trainer, generated from the stacks, their locks and the recipe; --print-compose shows it) and exits
    with the trainer's exit code."""
    from rlstack.host import containers

    s = load_stack(stack)
    values = _train_values(s, locals())
    if print_compose and not vllm_server:
        raise RlstackError("--print-compose prints a server-mode run's compose file: it needs --vllm-server STACK",
                           "e.g. invoke train --stack fp8 --vllm-server fp8 --gpus 2 --print-compose")
    if vllm_server:
        rc, image = _with_server(s, values, vllm_server, gpus, server_gpus, server_start_s, base_image, ca_cert,
                                 run=not print_compose)
        if print_compose:
            return rc
    elif gpus is not None and gpus > 1:
        if not s.gpu_required:
            raise RlstackError(f"the {s.name} stack trains on the CPU: --gpus {gpus} needs a GPU stack",
                               "pick one with --stack (invoke stacks lists them); on the CPU one process it is")
        image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
        rc = containers.run(containers.ddp_spec(s, image, argv_for(payload.train, values), gpus))
    elif gpus is not None and gpus < 1:
        raise RlstackError(f"--gpus {gpus}: give at least 1")
    else:
        image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
        rc = in_container(s, image, argv_for(payload.train, values))
    run = copy_run(image, f"train/{values['adapter_name']}")
    if run is not None:
        print(f"metrics:  {shown(run / 'metrics.jsonl')}\ncurve:    {shown(run / 'reward_curve.png')}\n"
              f"adapter:  {values['adapter_name']} in the volume {containers.ADAPTERS_VOLUME} "
              f"(invoke adapters --stack {stack}; invoke eval --stack {stack} --adapter {values['adapter_name']})")
    return rc
