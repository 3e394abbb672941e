"""The `rlstack` command, which runs inside a stack (its image, or natively where its libraries are installed):
train, eval, rescore, compare, adapters, probe, diagnose. The host's work (stacks, locks, images,
containers, the matrix, CI) is invoke's (tasks.py). Each command is a typed function whose signature declares
its options (typer's `Annotated` options); typer builds the command line from those signatures, and this file
only adds --version and turns an RlstackError or a refused command line into one clean `rlstack: error: ...`
message and exit code, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from rlstack import __version__
from rlstack.core import options
from rlstack.core.errors import RlstackError

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


def build() -> Any:
    """The `rlstack` click group: every in-stack command, built by typer from its signature."""
    import typer.main

    app = options.app(commands(), help=(__doc__ or "").split("\n")[0])
    app.callback()(_root)
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


if __name__ == "__main__":
    sys.exit(main())
