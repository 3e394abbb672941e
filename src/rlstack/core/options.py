"""The one reading of a command's options, over typer. A command is a typed function whose parameters declare
their flag and help in `Annotated[T, typer.Option(...)]` (or `typer.Argument`) and their real default in the
signature. typer turns that signature into click parameters once (`command`); everything else reads those:
the in-stack `rlstack` command (rlstack.cli), the host's invoke tasks (tasks.py), the README's task table, and
`argv_for`, which renders a host-side call back into `rlstack` argv for a container. So a flag means the same
thing, with the same default, wherever a user types it, and nothing here re-declares or rewrites a signature.

typer is imported inside the functions: a module that only imports core pays nothing for it.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlstack.core.errors import RlstackError

Command = Callable[..., Any]


class UsageError(RlstackError):
    """A command line a command refuses (unknown flag, bad value, missing argument): exit 2, as click's own."""

    exit_code = 2


def command_name(fn: Command) -> str:
    """`eval_` is `eval`, `probe_fp8` is `probe-fp8`: the name a user types."""
    return fn.__name__.rstrip("_").replace("_", "-")


def summary(fn: Command) -> str:
    """The first paragraph of the docstring, on one line (`invoke --list`, the README's task table)."""
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def app(commands: Sequence[Command], *, help: str | None = None) -> Any:
    """A typer app of typed functions, with plain help text (a `[` in a help text is text, not rich markup)."""
    import typer

    application = typer.Typer(help=help, add_completion=False, rich_markup_mode=None, no_args_is_help=True,
                              pretty_exceptions_enable=False)
    for fn in commands:
        application.command(name=command_name(fn))(fn)
    return application


@functools.cache
def command(fn: Command) -> Any:
    """The click command typer makes of `fn`'s signature (cached: it is the same every time)."""
    import typer.main

    return typer.main.get_command(app([fn]))


def params(fn: Command) -> list[Any]:
    """`fn`'s click parameters in declaration order (typer's own `--help` option left out)."""
    return [p for p in command(fn).params if p.name != "help"]


def is_remainder(p: Any) -> bool:
    """A variadic positional argument (`typer.Argument` over a list): the words after `--` on the host."""
    return bool(p.param_type_name == "argument" and p.nargs == -1)


def shown_default(p: Any) -> str | None:
    """The default a help text shows, or None where there is nothing to show: no default (None, or an empty
    string or list), or an off switch (a flag is off unless given)."""
    d = p.default
    if d is None or d is False or d == "" or d == [] or d == ():
        return None
    if isinstance(d, list | tuple):
        return ",".join(map(str, d))
    return str(d)


def help_text(p: Any) -> str:
    """A parameter's help with its real default, as `invoke --help TASK` shows it."""
    default = shown_default(p)
    return f"{p.help} (default: {default})" if default is not None else str(p.help)


def quiet_stdout() -> None:
    """Point stdout at /dev/null after a write to it failed (a full disk, a closed pipe), so the interpreter's
    own flush at exit does not fail a second time with an 'Exception ignored' trace after the clean message."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing to quiet
        pass


def run(cmd: Any, argv: Sequence[str], prog: str) -> int:
    """Run a click command (`command(fn)`, or a group of them) on a command line, which click parses and
    converts: the command's exit code. `--help` prints the help and returns 0; a refused command line is a
    UsageError that names the command and where its options are listed."""
    import typer

    try:
        rv = cmd.main(args=list(argv), prog_name=prog, standalone_mode=False)
    except typer.TyperException as exc:  # typer's click exceptions: a usage error, a bad or missing value
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else prog
        if type(exc).__name__ == "NoArgsIsHelpError":  # `rlstack` alone: the help, and the usage error's code
            print(exc.format_message())
            return UsageError.exit_code
        raise UsageError(exc.format_message(), f"{where} --help lists every option") from None
    except typer.Abort:  # click's answer to Ctrl-C
        raise KeyboardInterrupt from None
    return int(rv or 0)


def argv_for(fn: Command, values: Mapping[str, Any]) -> list[str]:
    """`rlstack <command> ...` for a call of `fn`: every value that differs from its default, under the flag
    the in-stack command declares for it (both read the same click parameters)."""
    argv = [command_name(fn)]
    positional: list[str] = []
    rest: list[str] = []
    for p in params(fn):
        if p.name not in values:
            continue
        v = values[p.name]
        if v is None or (not p.required and v == p.default) or (isinstance(v, list | tuple) and not v):
            continue
        if is_remainder(p):
            rest = ["--", *map(str, v)]
        elif p.param_type_name == "argument":
            positional.append(str(v))
        elif p.is_flag:
            argv.append(p.opts[0] if v else p.secondary_opts[0])
        elif p.multiple:
            for item in v:
                argv += [p.opts[0], str(item)]
        else:
            argv += [p.opts[0], str(v)]
    return argv[:1] + positional + argv[1:] + rest


def lent(fn: Command, values: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a host command's arguments that `fn` (the payload command it runs in a stack) takes."""
    names = set(inspect.signature(fn).parameters)
    return {k: v for k, v in values.items() if k in names}
