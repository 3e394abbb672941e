"""invoke tasks: rlstack's host command line. Each task is one typed library function (rlstack.host.commands
TASKS): its flags, help texts, defaults and positional arguments are the click parameters typer reads from
that function's signature (rlstack.core.options), so an option is declared once, and what invoke parsed goes
through the same click command that `rlstack` runs inside a stack, which converts and checks it. User tasks
sit at the root of `invoke --list`; what the workflows run under `ci.`, the project's own development under
`dev.`. `invoke --help TASK` shows a task's options with their defaults; every external command is printed
before it runs.

Machine settings (base image, CA bundle, docker client) live in invoke.yaml: `invoke settings`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from invoke import Argument, Collection, Context, Exit, Task

sys.path.insert(0, "src")  # so `invoke` works from a checkout before `pip install -e .`

from rlstack.core import options
from rlstack.core.errors import RlstackError, as_disk_full
from rlstack.host.commands import TASKS, task_name


def argument(p: Any) -> Argument:
    """invoke's argument for one click parameter: its flags and its help with the real default. Values stay
    text (or a switch, or a list) for click to convert. A value arrives under the parameter's name where invoke's
    own convention gives it one (--adapter-name as adapter_name), else under its flag's (--set as `set`): invoke's
    help finds an argument by the flag its attr_name would make."""
    kind = bool if getattr(p, "is_flag", False) else list if getattr(p, "multiple", False) else str
    names = [p.name] if p.param_type_name == "argument" else [o.lstrip("-") for o in p.opts]
    return Argument(names=tuple(names), kind=kind, default=p.default if kind is bool else None,
                    help=options.help_text(p), positional=p.param_type_name == "argument",
                    attr_name=p.name if names[0] == p.name.replace("_", "-") != p.name else None)


class CommandTask(Task):
    """An invoke task over a typed command. Its arguments are the command's click parameters (`get_arguments`);
    the body renders what invoke parsed back into the command's argv (`argv_for`) and runs the click command on
    it, so both command lines convert and check a value in one place."""

    def __init__(self, fn: Callable[..., Any], name: str, namespace: str = "") -> None:
        self.command = fn
        prog = "invoke " + ".".join(filter(None, [namespace, name]))  # as the user typed it, in messages

        def body(c: Context, **given: Any) -> None:
            ps = options.params(fn)
            by_arg = {argument(p).name: p.name for p in ps if not options.is_remainder(p)}
            values = {by_arg[k]: v for k, v in given.items()}
            values.update({p.name: [c.remainder] if c.remainder else None for p in ps if options.is_remainder(p)})
            try:
                rc = options.run(options.command(fn), options.argv_for(fn, values)[1:], prog)
            except RlstackError as exc:
                raise Exit(f"rlstack: error: {exc}", code=exc.exit_code) from None
            except Exception as exc:  # a full disk no nearer code named (a matrix, a page): exit 28, as rlstack's
                full = as_disk_full(exc)
                if full is None:
                    raise
                options.quiet_stdout()
                raise Exit(f"rlstack: error: {full}", code=full.exit_code) from None
            if rc:
                raise Exit(code=rc)

        body.__doc__ = "\n\n".join([options.summary(fn), *(inspect.getdoc(fn) or "").split("\n\n")[1:]])
        # (the first paragraph on one line: `invoke --list` shows a docstring's first line)
        super().__init__(body, name=name, positional=[], auto_shortflags=False)

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        """The command's parameters, positional ones first; the words after `--` are invoke's remainder."""
        args = [argument(p) for p in options.params(self.command) if not options.is_remainder(p)]
        return sorted(args, key=lambda a: not a.positional)


def collection() -> Collection:
    """User tasks at the root, each other namespace (ci, dev) a collection of its own."""
    root = Collection()
    for namespace, fns in TASKS.items():
        target = Collection(namespace) if namespace else root
        for fn in fns:
            target.add_task(CommandTask(fn, task_name(fn, namespace), namespace))
        if namespace:
            root.add_collection(target)
    return root


ns = collection()
