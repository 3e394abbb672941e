"""Options declared once (rlstack.core.options): the argparse CLI, the invoke tasks and the argv the host
forwards into a container all come from one signature, and agree."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pytest

from rlstack.core import options
from rlstack.core.options import Opt, UsageError


def sample(
    target: Annotated[Path, Opt("a positional path", positional=True)],
    name: Annotated[str, Opt("a required option")],
    count: Annotated[int | None, Opt("a number", flag="-n")] = None,
    mode: Annotated[Literal["a", "b"], Opt("one of two")] = "a",
    overrides: Annotated[list[str] | None, Opt("repeatable", flag="--set")] = None,
    quiet: Annotated[bool, Opt("a switch")] = False,
    inside: Annotated[str | None, Opt("only in a container", in_container=True)] = None,
) -> dict[str, Any]:
    """A sample command.

    More words."""
    return {"target": target, "name": name, "count": count, "mode": mode, "overrides": overrides, "quiet": quiet,
            "inside": inside}


def test_params_read_the_declarations() -> None:
    ps = {p.name: p for p in options.params(sample)}
    assert ps["target"].opt.positional and ps["target"].kind is Path and ps["target"].required
    assert ps["count"].flag == "-n" and ps["count"].kind is int
    assert ps["mode"].choices == ("a", "b")
    assert ps["overrides"].flag == "--set" and ps["overrides"].kind is list
    assert options.command_name(sample) == "sample" and options.summary(sample) == "A sample command."


def test_an_undeclared_parameter_is_a_programming_error() -> None:
    def bad(x: int = 1) -> None: ...

    with pytest.raises(TypeError, match="no Opt"):
        options.params(bad)


def test_argparse_round_trip_through_argv_for() -> None:
    parser = options.build_parser("t", "test", [sample])
    values = {"target": Path("f.json"), "name": "x", "count": 3, "mode": "b", "overrides": ["a=1", "b=2"],
              "quiet": True, "inside": "/in"}
    argv = options.argv_for(sample, values)
    assert argv == ["sample", "f.json", "--name", "x", "-n", "3", "--mode", "b", "--set", "a=1", "--set", "b=2",
                    "--quiet", "--inside", "/in"]
    assert options.call_parsed(parser.parse_args(argv)) == values
    # defaults are not spelled out, so the in-stack default applies
    assert options.argv_for(sample, {"target": "f", "name": "x", "mode": "a", "quiet": False}) == \
        ["sample", "f", "--name", "x"]


def test_bad_values_name_the_flag() -> None:
    with pytest.raises(UsageError, match="-n: 'many' is not a number"):
        options.call(sample, {"target": "f", "name": "x", "count": "many"})
    with pytest.raises(UsageError, match="--mode: 'c' is not one of a, b"):
        options.call(sample, {"target": "f", "name": "x", "mode": "c"})
    with pytest.raises(UsageError, match="sample needs --name"):
        options.call(sample, {"target": "f"})


def test_runs_in_stack_lends_the_payload_options_except_container_ones() -> None:
    @options.runs_in_stack(sample)
    def host(stack: Annotated[str, Opt("stack")] = "cpu", **rest: Any) -> dict[str, Any]:
        return options.payload_values(host, rest)

    names = [p.name for p in options.params(host)]
    assert names == ["stack", "target", "name", "count", "mode", "overrides", "quiet"]
    assert "inside" not in names
    assert options.call(host, {"stack": "gpu", "target": "f", "name": "x", "quiet": True}) == \
        {"target": Path("f"), "name": "x", "quiet": True}
