"""invoke tasks: rlstack's host CLI. Each task is generated from one typed library function
(rlstack.host.commands.tasks()): its flags, help, kinds and positional arguments are that function's own
declarations (rlstack.core.options), so an option is declared once and a task calls its function with typed
values, never through another parser. `invoke --list` shows them all, `invoke --help TASK` a task's options;
every external command is printed before it runs.

Machine settings (base image, CA bundle, docker client) live in invoke.yaml: `invoke settings`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from invoke import Collection, Context, Exit, Task

sys.path.insert(0, "src")  # so `invoke` works from a checkout before `pip install -e .`

from rlstack.core import options
from rlstack.core.errors import RlstackError
from rlstack.host.commands import tasks as host_commands


class CommandTask(Task):  # type: ignore[misc]
    """An invoke task for a typed command. invoke reads the body's signature; the body's is the command's
    (plus invoke's Context), and each argument takes the command's flag name, short flag and help."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.command = fn
        self.params = {p.name: p for p in options.params(fn)}
        remainder = [p.name for p in self.params.values() if p.opt.remainder]

        by_flag = {p.flag.lstrip("-"): p.name for p in self.params.values()}

        def body(c: Context, **given: Any) -> None:
            values = {by_flag.get(k, k): v for k, v in given.items()}
            for name in remainder:
                values[name] = c.remainder
            try:
                rc = options.call(fn, values)
            except RlstackError as exc:
                raise Exit(f"rlstack: error: {exc}", code=exc.exit_code) from None
            if isinstance(rc, int) and rc:
                raise Exit(code=rc)

        shown = [p for p in self.params.values() if not p.opt.remainder]
        body.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
            + [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY,
                                 default=None if p.required or p.default is None else p.default) for p in shown])
        body.__name__ = fn.__name__
        body.__doc__ = fn.__doc__
        super().__init__(body, name=options.command_name(fn), help={p.name: p.opt.help for p in shown},
                         iterable=[p.name for p in shown if p.kind is list],
                         positional=[p.name for p in shown if p.opt.positional], auto_shortflags=False)

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        p = self.params[name]
        opts["names"] = list(dict.fromkeys(f.lstrip("-") for f in p.flags))
        opts.pop("attr_name", None)
        if opts["names"][0] == name.replace("_", "-") != name:
            opts["attr_name"] = name  # invoke's own convention: --adapter-name arrives as adapter_name
        # otherwise (--set for `overrides`, --json for `json_`) the value arrives under the flag's name and
        # the body maps it back: invoke's help looks an argument up by the flag its attr_name would make
        if p.kind in (int, float) and "kind" not in opts:
            opts["kind"] = p.kind
        return opts


ns = Collection()
for command in host_commands():
    ns.add_task(CommandTask(command))
