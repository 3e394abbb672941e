"""invoke is the host CLI and `rlstack` the in-stack CLI; each option is declared once, in the typed function a
task or command calls, every task's help shows the real defaults, the tasks sit in namespaces (user tasks at the
root, ci.* and dev.*), and every flag a hint names exists where the user typed the command."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from rlstack import cli
from rlstack.core import options
from rlstack.host import commands as host
from rlstack.payload import commands as payload

ROOT = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke"]


@pytest.fixture(scope="module")
def collection() -> Any:
    sys.path.insert(0, str(ROOT))
    import tasks

    return tasks.ns


def _tasks() -> list[tuple[str, Any]]:
    """(the name a user types, the function) of every task."""
    return [(".".join(filter(None, [ns, host.task_name(fn, ns)])), fn) for ns, fns in host.TASKS.items() for fn in fns]


def test_every_task_is_its_functions_signature(collection: Any) -> None:
    assert sorted(collection.task_names) == sorted(name for name, _ in _tasks())
    for name, fn in _tasks():
        task = collection[name]
        assert task.command is fn
        params = [p for p in options.params(fn) if not options.is_remainder(p)]
        arguments = task.get_arguments()
        assert [a.names for a in arguments if not a.positional] == \
            [tuple(o.lstrip("-") for o in p.opts) for p in params if p.param_type_name == "option"], name
        assert [a.names[0] for a in arguments if a.positional] == \
            [p.name for p in params if p.param_type_name == "argument"], name
        for a, p in zip(arguments, sorted(params, key=lambda p: p.param_type_name == "option"), strict=True):
            assert a.help == options.help_text(p), f"invoke {name} --{a.names[0]}"
            kind = bool if getattr(p, "is_flag", False) else list if getattr(p, "multiple", False) else str
            assert a.kind is kind, f"invoke {name} --{a.names[0]}"


def test_no_task_help_shows_none_and_defaults_are_shown(collection: Any) -> None:
    for name, _ in _tasks():
        for a in collection[name].get_arguments():
            assert "None" not in (a.help or ""), f"invoke {name} --{a.names[0]}: {a.help}"
    helps = {a.names[0]: a.help for a in collection["train"].get_arguments()}
    assert helps["stack"].endswith("(default: cpu)") and helps["server-start-s"].endswith("(default: 900)")
    assert collection["ci.jobs"].get_arguments()[0].help == "which job matrix (default: all)"
    proc = subprocess.run([*INVOKE, "--help", "train"], cwd=ROOT, capture_output=True, text=True, check=True)
    text = " ".join(proc.stdout.split())  # invoke wraps help texts
    assert "--stack=STRING stack name (images/<stack>/stack.toml) (default: cpu)" in text and "None" not in text


def test_invoke_list_groups_user_tasks_apart_from_ci_and_dev() -> None:
    proc = subprocess.run([*INVOKE, "--list"], cwd=ROOT, capture_output=True, text=True, check=True)
    listed = [line.split()[0] for line in proc.stdout.splitlines() if re.match(r"  \S", line)]  # not wrapped lines
    root = [t for t in listed if "." not in t]
    assert {"train", "eval", "build", "smoke", "test", "matrix", "probe-fp8", "stacks", "shell"} <= set(root)
    assert not {"lint", "typecheck", "ci-jobs", "probe-job", "ci-free-disk", "push"} & set(root)
    assert {"ci.jobs", "ci.probe-job", "ci.merge-probes", "ci.free-disk", "ci.check-image", "ci.image-size",
            "ci.push", "dev.lint", "dev.typecheck", "bench"} <= set(listed)
    assert {t.split(".")[0] for t in listed if "." in t} == {"ci", "dev"}


def test_tasks_py_builds_no_parser_and_nothing_rewrites_a_signature() -> None:
    text = (ROOT / "tasks.py").read_text()
    assert "rlstack.cli" not in text and "argparse" not in text
    assert not re.search(r'"--[a-z]', text), "tasks.py spells out a flag: it should come from a signature"
    for path in [ROOT / "tasks.py", *sorted((ROOT / "src" / "rlstack").rglob("*.py"))]:
        assert "__signature__" not in path.read_text(), f"{path.relative_to(ROOT)} rewrites a signature"


def test_every_option_has_help_and_the_in_stack_cli_is_typer() -> None:
    for fn in [*(fn for _, fn in _tasks()), *cli.commands()]:
        for p in options.params(fn):
            assert p.help and len(p.help) > 8, f"{fn.__qualname__}: {p.name} needs a help text"
    assert sorted(cli.build().commands) == ["adapters", "compare", "diagnose", "eval", "host", "probe", "rescore",
                                            "train"]


def test_rlstack_host_runs_every_task_invoke_runs(collection: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """One `rlstack` command for the host too: `rlstack host [ci|dev] TASK` is the task `invoke [ci.|dev.]TASK`
    runs, under the same name and with the same options, and it runs the same function."""
    group = cli.build().commands["host"]
    for name, fn in _tasks():
        *namespace, task = name.split(".")
        cmd = group.commands[namespace[0]].commands[task] if namespace else group.commands[task]
        assert inspect.unwrap(cmd.callback) is fn, name
        assert [p.name for p in cmd.params if p.name != "help"] == [p.name for p in options.params(fn)], name
    assert set(group.commands) == {n.split(".")[0] for n, _ in _tasks()}
    assert cli.main(["host", "ci", "jobs", "--stack", "portable"]) == 0
    via_rlstack = capsys.readouterr().out
    proc = subprocess.run([*INVOKE, "ci.jobs", "--stack", "portable"], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    assert via_rlstack == proc.stdout and '"portable"' in via_rlstack
    assert cli.main(["host", "ci", "jobs", "--stack", "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("rlstack: error: unknown stack 'nosuch'")


def test_rlstack_help_and_errors_are_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("train", "eval", "probe", "diagnose"))
    for fn in cli.commands():
        assert cli.main([options.command_name(fn), "--help"]) == 0, options.command_name(fn)
        assert options.summary(fn).split()[0] in capsys.readouterr().out
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.startswith("rlstack ")
    assert cli.main(["train", "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlstack: error: No such option: --no-such-flag") and "rlstack train --help" in err
    assert cli.main(["eval", "-n", "many"]) == 2 and "rlstack: error: Invalid value for '-n'" in capsys.readouterr().err
    assert cli.main(["rescore"]) == 2 and "Missing argument" in capsys.readouterr().err
    assert cli.main([]) == 2 and "Usage: rlstack" in capsys.readouterr().out


def test_invoke_errors_are_clean_messages_with_the_exit_code() -> None:
    proc = subprocess.run([*INVOKE, "train", "--gpus", "many"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("rlstack: error: Invalid value for '--gpus'") and "invoke train --help" in proc.stderr
    proc = subprocess.run([*INVOKE, "ci.jobs", "--stack", "nosuch"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("rlstack: error: unknown stack 'nosuch'")


def test_host_commands_name_the_payload_options_declared_once() -> None:
    """invoke train/eval/adapters take every payload option a host user can use, through the very alias the payload
    command declares (the same typer.Option object), with the same default; paths inside the container are the
    payload's alone."""
    inside = {"output", "adapters_root", "root"}
    for host_fn, payload_fn in ((host.train, payload.train), (host.eval_, payload.eval_),
                                (host.adapters, payload.adapters)):
        theirs = typing.get_type_hints(payload_fn, include_extras=True)
        ours = typing.get_type_hints(host_fn, include_extras=True)
        lent = set(theirs) - inside - {"return"}
        assert lent <= set(ours), f"{host_fn.__name__} misses {lent - set(ours)}"
        for name in lent:
            assert ours[name].__metadata__[0] is theirs[name].__metadata__[0], f"{host_fn.__name__}: {name}"
        defaults = {p.name: p.default for p in options.params(payload_fn)}
        assert all(p.default == defaults[p.name] for p in options.params(host_fn) if p.name in lent)
        assert not inside & set(ours)


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
    invoke_flags = {"--help"} | {"--" + n for t in collection.task_names for a in collection[t].get_arguments()
                                 for n in a.names}
    stack_flags = {f for fn in cli.commands() for p in options.params(fn) for f in [*p.opts, *p.secondary_opts]}
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
