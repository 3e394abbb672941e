"""The `rlstack` command, in a stack and on the host.

Inside a stack (its image, or natively where its libraries are installed): train, eval, rescore, compare,
adapters, probe, diagnose. On the host: `rlstack host TASK`, the same tasks invoke runs (tasks.py: stacks,
locks, images, containers, the matrix; `rlstack host ci ...` and `rlstack host dev ...` as `invoke ci.…` and
`invoke dev.…`), for a host that has rlstack but not invoke. Each command is a typed function whose signature
declares its options (typer's `Annotated` options); typer builds the command line from those signatures, and this file
only adds --version and turns an RlstackError or a refused command line into one clean `rlstack: error: ...`
message and exit code, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from rlstack import __version__
from rlstack.core import options
from rlstack.core.errors import RlstackError, as_disk_full

PROG = "rlstack"


def commands() -> list[Callable[..., Any]]:
    from rlstack.payload.commands import COMMANDS
    from rlstack.probes.commands import IN_STACK

    return [*COMMANDS, *IN_STACK]


def _print_version(value: bool) -> None:
    if value:
        print(f"rlstack {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="print rlstack's version and exit")] = False,
) -> None:
    """The options of `rlstack` itself, before a command."""


def host_app() -> typer.Typer:
    """`rlstack host`: the host's tasks (rlstack.host.commands.TASKS) under the names invoke gives them, each
    namespace of invoke's (ci, dev) a group of its own."""
    from rlstack.host.commands import TASKS, task_name

    groups: dict[str, typer.Typer] = {}
    for namespace, fns in TASKS.items():
        group = options.app([], help="the host's tasks, as invoke runs them" if not namespace else
                            f"the host's {namespace} tasks (invoke {namespace}.TASK)")
        for fn in fns:
            group.command(name=task_name(fn, namespace))(fn)
        groups[namespace] = group
    for namespace, group in groups.items():
        if namespace:
            groups[""].add_typer(group, name=namespace)
    return groups[""]


def build() -> Any:
    """The `rlstack` click group: every in-stack command, and the host's tasks under `host`, built by typer from
    their signatures."""
    import typer.main

    app = options.app(commands(), help=(__doc__ or "").split("\n")[0])
    app.callback()(_root)
    app.add_typer(host_app(), name="host")
    return typer.main.get_command(app)


def main(argv: Sequence[str] | None = None) -> int:
    from rlstack.payload import kernelcache

    kernelcache.apply()  # before any command imports torch, vllm or unsloth: they read their cache folders then
    try:
        return options.run(build(), sys.argv[1:] if argv is None else argv, PROG)
    except RlstackError as exc:
        print(f"rlstack: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rlstack: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a full disk wherever no nearer code named it (output, a report): exit 28
        full = as_disk_full(exc)
        if full is None:
            raise
        options.quiet_stdout()
        print(f"rlstack: error: {full}", file=sys.stderr)
        return full.exit_code


if __name__ == "__main__":
    sys.exit(main())
