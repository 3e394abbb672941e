"""The payload in a stack's container: `invoke eval`, `invoke adapters`, `invoke shell`, `invoke runs`, and the
helpers `invoke train` shares with them (the stack by name, one payload command in its container, a run folder
copied out of the runs volume). Each names the payload command's own option aliases (rlstack.payload.commands)
and forwards them with `argv_for`."""

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
from rlstack.payload import commands as payload


def load_stack(name: str) -> Any:
    from rlstack import stacks as stack_files

    return stack_files.load_stack(name)


def in_container(stack: Any, image: str, argv: list[str], **kw: Any) -> int:
    from rlstack.host import containers

    return containers.run(containers.spec_for(stack, image, argv, **kw))


def copy_run(image: str, rel: str) -> Path | None:
    """Bring a run folder out of the runs volume; say so when it is not there (the run failed early)."""
    from rlstack.host import containers

    try:
        dest = containers.copy_out(image, rel)
    except RlstackError as exc:
        print(f"rlstack: {exc.message}", file=sys.stderr)
        return None
    print(f"rlstack: copied {rel} out of the volume {containers.RUNS_VOLUME} to {shown(dest)}", file=sys.stderr)
    return dest


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
    from rlstack.core.names import check_name, to_name
    from rlstack.host import containers

    values = lent(payload.eval_, locals())
    if adapter is not None and "/" not in adapter:  # a name in the volume, checked before an image is built
        check_name(adapter, "--adapter")
    s = load_stack(stack)

    label = to_name(Path(values.get("adapter") or values.get("model") or "eval").name, "eval")[:100]
    rel = f"eval/{label}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    values["output"] = f"{containers.RUNS_MOUNT}/{rel}"
    image = containers.ready_image(s, base_image=base_image, ca_cert=ca_cert)
    rc = in_container(s, image, argv_for(payload.eval_, values), adapters_read_only=True)
    run = copy_run(image, rel)
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
    s = load_stack(stack)
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

    s = load_stack(stack)
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

    for rel in copy or []:  # every name checked before an image is built or a folder touched
        containers.run_rel(rel)
    image = containers.ready_image(load_stack(stack), base_image=base_image, ca_cert=ca_cert)
    if not copy:
        found = containers.list_runs(image)
        print("\n".join(found) if found else f"no runs in the volume {containers.RUNS_VOLUME}")
        return 0
    rc = 0
    for rel in copy:
        if copy_run(image, rel) is None:
            rc = 1
    return rc
