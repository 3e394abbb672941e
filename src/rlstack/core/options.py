"""Options declared once. A command is a typed function; each parameter carries its help in
`Annotated[T, Opt("...")]`. Both command lines are generated from those signatures: the `rlstack` CLI that
runs inside a stack (argparse, `build_parser`) and the host's invoke tasks (`tasks.py`, through `params`).
When the host runs a payload command in a container, `argv_for` renders the call back into `rlstack` argv
from the same declaration, and `runs_in_stack` lends a host function the payload command's options, so an
option typed by a user means the same thing, under the same flag, wherever they typed it.

argparse and invoke are used as they are; this module only reads signatures (standard library only).
"""

from __future__ import annotations

import argparse
import inspect
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from rlstack.core.errors import RlstackError

EMPTY = inspect.Parameter.empty


class UsageError(RlstackError):
    """A value a flag cannot take (not a number, not one of the choices)."""


@dataclass(frozen=True)
class Opt:
    """How one parameter appears on a command line."""

    help: str
    short: str | None = None  # e.g. "-n"
    flag: str | None = None  # the long flag when it is not the parameter's name (--set for `overrides`)
    positional: bool = False
    in_container: bool = False  # a path or setting inside the stack: not offered where the host runs it in an image
    remainder: bool = False  # everything after `--` (a command to run)
    metavar: str | None = None


@dataclass(frozen=True)
class Param:
    """A parameter as both command lines see it."""

    name: str
    opt: Opt
    kind: type  # str, int, float, bool, Path or list (of str)
    choices: tuple[str, ...] | None
    default: Any  # EMPTY when the option is required

    @property
    def flag(self) -> str:
        return self.opt.flag or "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is EMPTY

    @property
    def flags(self) -> list[str]:
        return [self.flag, *([self.opt.short] if self.opt.short else [])]


def signature(fn: Callable[..., Any]) -> inspect.Signature:
    """The signature with annotations evaluated (modules use `from __future__ import annotations`)."""
    return inspect.signature(fn, eval_str=True)


def _kind(tp: Any) -> tuple[type, tuple[str, ...] | None]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"an option is one type or None, not {tp}")
        return _kind(inner[0])
    if origin is Literal:
        return str, tuple(str(a) for a in get_args(tp))
    if origin in (list, Sequence, tuple) or tp in (list, tuple):
        return list, None
    if tp in (str, int, float, bool, Path):
        return tp, None
    raise TypeError(f"unsupported option type {tp!r}")


def params(fn: Callable[..., Any]) -> list[Param]:
    """Every option of a command, in declaration order. A parameter without `Opt` is a programming error:
    every option a user can pass says what it does."""
    out = []
    for p in signature(fn).parameters.values():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        ann = p.annotation
        if get_origin(ann) is not Annotated:
            raise TypeError(f"{fn.__qualname__}: parameter {p.name!r} has no Opt(...) declaration")
        tp, *meta = get_args(ann)
        opts = [m for m in meta if isinstance(m, Opt)]
        if not opts:
            raise TypeError(f"{fn.__qualname__}: parameter {p.name!r} has no Opt(...) declaration")
        kind, choices = _kind(tp)
        out.append(Param(p.name, opts[0], kind, choices, p.default))
    return out


def command_name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "command_name", fn.__name__.rstrip("_").replace("_", "-")))


def summary(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def coerce(p: Param, value: Any) -> Any:
    """A value from either command line, as the function's annotation wants it. invoke hands over strings for
    options without a typed default; the error names the flag and what it takes."""
    if value is None or (value is EMPTY):
        return None if value is None else value
    if p.kind is list:
        items = list(value) if isinstance(value, list | tuple) else [value]
        return [str(v) for v in items]
    if p.kind is bool:
        if isinstance(value, str):
            return value.lower() in ("1", "true", "yes", "on")
        return bool(value)
    try:
        out = p.kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"{p.flag}: {value!r} is not {'a number' if p.kind in (int, float) else p.kind.__name__}",
                         f"{p.flag} {p.opt.metavar or p.kind.__name__.upper()}: {p.opt.help}") from None
    if p.choices and str(out) not in p.choices:
        raise UsageError(f"{p.flag}: {value!r} is not one of {', '.join(p.choices)}", p.opt.help)
    return out


def call(fn: Callable[..., Any], values: Mapping[str, Any]) -> Any:
    """Call a command with values from a command line: coerced, missing required options named."""
    kwargs: dict[str, Any] = {}
    for p in params(fn):
        if p.name not in values or (values[p.name] is None and p.required):
            if p.required:
                raise UsageError(f"{command_name(fn)} needs {p.flag if not p.opt.positional else p.name.upper()}",
                                 p.opt.help)
            continue
        kwargs[p.name] = coerce(p, values[p.name])
    return fn(**kwargs)


# --- argparse: the `rlstack` command inside a stack -----------------------------------------------------


def add_command(sub: argparse._SubParsersAction, fn: Callable[..., Any]) -> argparse.ArgumentParser:
    parser = sub.add_parser(command_name(fn), help=summary(fn), description=inspect.getdoc(fn))
    for p in params(fn):
        kw: dict[str, Any] = {"help": p.opt.help}
        if p.opt.metavar:
            kw["metavar"] = p.opt.metavar
        if p.opt.remainder:
            parser.add_argument(p.name, nargs=argparse.REMAINDER, **kw)
            continue
        if p.opt.positional:
            parser.add_argument(p.name, nargs=None if p.required else "?",
                                default=None if p.required else p.default, **kw)
            continue
        if p.kind is bool:
            parser.add_argument(*p.flags, dest=p.name, action="store_true", **kw)
        elif p.kind is list:
            parser.add_argument(*p.flags, dest=p.name, action="append", default=None, **kw)
        else:
            parser.add_argument(*p.flags, dest=p.name, required=p.required, choices=p.choices,
                                default=None if p.required else p.default, **kw)
    parser.set_defaults(_command=fn)
    return parser


def build_parser(prog: str, description: str, commands: Iterable[Callable[..., Any]],
                 version: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    if version:
        parser.add_argument("--version", action="version", version=version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for fn in commands:
        add_command(sub, fn)
    return parser


def call_parsed(ns: argparse.Namespace) -> Any:
    fn = ns._command
    values = {p.name: getattr(ns, p.name) for p in params(fn)}
    for p in params(fn):
        if p.opt.remainder and values[p.name][:1] == ["--"]:
            values[p.name] = values[p.name][1:]
        if p.kind is list and values[p.name] is None:
            values[p.name] = []
    return call(fn, values)


# --- the host running a payload command in a container ---------------------------------------------------


def argv_for(fn: Callable[..., Any], values: Mapping[str, Any]) -> list[str]:
    """`rlstack <command> ...` for a call of `fn`: every value that differs from its default, under the flag
    the in-stack parser declares for it (both come from the same signature)."""
    argv = [command_name(fn)]
    positional: list[str] = []
    for p in params(fn):
        if p.name not in values:
            continue
        v = values[p.name]
        if v is None or (not p.required and v == p.default) or (p.kind is list and not v):
            continue
        if p.opt.positional:
            positional.append(str(v))
        elif p.kind is bool:
            if v:
                argv.append(p.flag)
        elif p.kind is list:
            for item in v:
                argv += [p.flag, str(item)]
        else:
            argv += [p.flag, str(v)]
    return argv[:1] + positional + argv[1:]


def runs_in_stack(payload_fn: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """For a host function that runs `payload_fn` in a stack's container: its signature becomes its own
    options followed by every option of `payload_fn` that makes sense from the host (not `in_container`),
    all keyword-only. The host function takes them as `**payload` and forwards them with `argv_for`."""

    def deco(host_fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in signature(host_fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in own}
        lent = [p for p in signature(payload_fn).parameters.values()
                if p.name not in names and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        keep = {p.name for p in params(payload_fn) if not p.opt.in_container}
        merged = [p.replace(kind=p.KEYWORD_ONLY) for p in own] + \
                 [p.replace(kind=p.KEYWORD_ONLY) for p in lent if p.name in keep]
        host_fn.__signature__ = signature(host_fn).replace(parameters=merged)  # type: ignore[attr-defined]
        host_fn.payload_command = payload_fn  # type: ignore[attr-defined]
        return host_fn

    return deco


def payload_values(host_fn: Callable[..., Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a `runs_in_stack` call that belongs to the payload command."""
    theirs = {p.name for p in params(host_fn.payload_command)}  # type: ignore[attr-defined]
    return {k: v for k, v in values.items() if k in theirs}
