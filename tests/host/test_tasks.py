"""invoke is the host CLI and `rlstack` the in-stack CLI; each option is declared once, in the typed function a
task or command calls, and every flag a hint names exists where the user typed the command."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from rlstack.cli import build_parser
from rlstack.cli import commands as in_stack_commands
from rlstack.core import options
from rlstack.host import commands as host

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def collection() -> Any:
    sys.path.insert(0, str(ROOT))
    import tasks

    return tasks.ns


def test_every_task_is_its_functions_signature(collection: Any) -> None:
    assert sorted(collection.task_names) == sorted(options.command_name(f) for f in host.tasks())
    for name in collection.task_names:
        task = collection[name]
        params = [p for p in options.params(task.command) if not p.opt.remainder]
        arguments = task.get_arguments()  # invoke hands each help text out once
        flag_of = {p.name: p.flag.lstrip("-") for p in params}
        got = {a.names[0] for a in arguments}
        assert got == set(flag_of.values()), f"invoke {name}: flags differ from {task.command.__qualname__}"
        for a in arguments:
            p = next(p for p in params if p.flag.lstrip("-") == a.names[0])
            assert a.help == p.opt.help and a.positional == p.opt.positional, f"invoke {name} --{a.names[0]}"
            assert a.kind == (list if p.kind is list else a.kind)


def test_tasks_py_builds_no_argv_for_a_parser() -> None:
    text = (ROOT / "tasks.py").read_text()
    assert "rlstack.cli" not in text and "argparse" not in text
    assert not re.search(r'"--[a-z]', text), "tasks.py spells out a flag: it should come from a signature"


def test_every_option_has_help_and_the_in_stack_cli_is_generated_too() -> None:
    for fn in [*host.tasks(), *in_stack_commands()]:
        for p in options.params(fn):
            assert len(p.opt.help) > 8, f"{fn.__qualname__}: {p.name} needs a help text"
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == ["adapters", "compare", "diagnose", "eval", "probe", "rescore", "train"]


def test_train_and_eval_lend_every_payload_option_a_host_user_can_use() -> None:
    from rlstack.payload import commands as payload

    for host_fn, payload_fn in ((host.train, payload.train), (host.eval_, payload.eval_)):
        lent = {p.name for p in options.params(host_fn)}
        for p in options.params(payload_fn):
            assert (p.name in lent) != p.opt.in_container, f"{host_fn.__name__}: {p.name}"


# Flags of other tools that messages name on purpose (docker, pip, uv, pytest): not ours to declare.
FOREIGN_FLAGS = {"--gpus", "--require-hashes", "--no-deps", "--runtime", "--python-platform", "--index-url",
                 "--extra-index-url", "--platform", "--no-cache", "--only-binary",
                 "--format", "--target"}  # pip list, pip install


def _hint_flags(path: Path) -> list[tuple[int, str]]:
    """`--flag` words inside the string arguments of every `...Error(...)` raised in a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")).endswith("Error"):
            for arg in node.args:
                for s in ast.walk(arg):
                    if isinstance(s, ast.Constant) and isinstance(s.value, str):
                        out += [(node.lineno, f) for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", s.value)]
    return out


def test_hints_name_flags_that_exist_where_the_user_typed(collection: Any) -> None:
    invoke_flags = {"--" + n for t in collection.task_names for a in collection[t].get_arguments() for n in a.names}
    stack_flags = {f for fn in in_stack_commands() for p in options.params(fn) for f in p.flags}
    problems = []
    for path in sorted((ROOT / "src" / "rlstack").rglob("*.py")):
        side = path.relative_to(ROOT / "src" / "rlstack").parts[0]
        for line, flag in _hint_flags(path):
            if flag in FOREIGN_FLAGS:
                continue
            # a payload error reaches users of `rlstack` inside a stack and of the invoke task that ran it there
            need = [stack_flags, invoke_flags] if side == "payload" else [invoke_flags | stack_flags]
            if not all(flag in flags for flags in need):
                problems.append(f"{path.relative_to(ROOT)}:{line}: {flag}")
    assert not problems, "hints name flags that do not exist (everywhere the user can type them):\n" + \
        "\n".join(problems)
