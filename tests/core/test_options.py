"""Options declared once, read through typer (rlstack.core.options): the click parameters typer makes of a
signature are what the `rlstack` command parses, what the invoke tasks offer, and what `argv_for` renders a
host-side call back into; they agree, and each shows its real default."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import typer

from rlstack.core import options
from rlstack.core.options import UsageError

SEEN: dict[str, Any] = {}


def sample(
    target: Annotated[Path, typer.Argument(help="a positional path")],
    name: Annotated[str, typer.Option(help="a required option")],
    count: Annotated[int | None, typer.Option("-n", help="a number")] = None,
    mode: Annotated[Literal["a", "b"], typer.Option(help="one of two")] = "a",
    overrides: Annotated[list[str] | None, typer.Option("--set", help="repeatable")] = None,
    quiet: Annotated[bool, typer.Option(help="a switch")] = False,
    json_: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    command: Annotated[list[str] | None, typer.Argument(help="the rest, after --")] = None,
) -> int:
    """A sample command.

    More words."""
    SEEN.clear()
    SEEN.update(target=target, name=name, count=count, mode=mode, overrides=overrides, quiet=quiet, json_=json_,
                command=command)
    return 0


def test_params_read_the_declarations() -> None:
    ps = {p.name: p for p in options.params(sample)}
    assert list(ps) == ["target", "name", "count", "mode", "overrides", "quiet", "json_", "command"]
    assert ps["target"].param_type_name == "argument" and ps["target"].required
    assert ps["count"].opts == ["-n"] and ps["json_"].opts == ["--json"] and ps["name"].required
    assert ps["overrides"].opts == ["--set"] and ps["overrides"].multiple
    assert ps["quiet"].is_flag and ps["mode"].default == "a"
    assert options.is_remainder(ps["command"]) and not options.is_remainder(ps["target"])
    assert options.command_name(sample) == "sample" and options.summary(sample) == "A sample command."


def test_help_shows_the_real_default_and_never_none() -> None:
    ps = {p.name: p for p in options.params(sample)}
    assert options.help_text(ps["mode"]) == "one of two (default: a)"
    for name in ("count", "overrides", "quiet", "name"):
        assert options.help_text(ps[name]) == ps[name].help, name  # nothing to show: no "(default: None)"


def test_round_trip_through_argv_for() -> None:
    values = {"target": Path("f.json"), "name": "x", "count": 3, "mode": "b", "overrides": ["a=1", "b=2"],
              "quiet": True, "json_": True, "command": ["echo", "-x"]}
    argv = options.argv_for(sample, values)
    assert argv == ["sample", "f.json", "--name", "x", "-n", "3", "--mode", "b", "--set", "a=1", "--set", "b=2",
                    "--quiet", "--json", "--", "echo", "-x"]
    assert options.run(options.command(sample), argv[1:], "t") == 0
    assert values == SEEN
    # defaults are not spelled out, so the in-stack default applies
    assert options.argv_for(sample, {"target": "f", "name": "x", "mode": "a", "quiet": False}) == \
        ["sample", "f", "--name", "x"]


def test_bad_command_lines_are_usage_errors_naming_the_flag() -> None:
    cmd = options.command(sample)
    with pytest.raises(UsageError, match="'-n'") as exc:
        options.run(cmd, ["f", "--name", "x", "-n", "many"], "t")
    assert exc.value.exit_code == 2 and "t --help" in str(exc.value)
    with pytest.raises(UsageError, match="'--mode'.*'c'"):
        options.run(cmd, ["f", "--name", "x", "--mode", "c"], "t")
    with pytest.raises(UsageError, match="--name"):
        options.run(cmd, ["f"], "t")
    with pytest.raises(UsageError, match="No such option: --nope"):
        options.run(cmd, ["f", "--name", "x", "--nope"], "t")


def test_help_is_printed_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert options.run(options.command(sample), ["--help"], "t") == 0
    out = capsys.readouterr().out
    assert "A sample command." in out and "--set" in out and "one of two" in out


def test_lent_keeps_only_what_the_payload_command_takes() -> None:
    assert options.lent(sample, {"stack": "gpu", "target": "f", "name": "x", "base_image": None}) == \
        {"target": "f", "name": "x"}
