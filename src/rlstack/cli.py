"""The `rlstack` command. It runs on the host and inside every image; each feature module adds its own
subcommands (see COMMAND_MODULES), so this file only dispatches and turns RlstackError into a clean
message and exit code."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rlstack import __version__
from rlstack.core.errors import RlstackError

# Each module defines `register(subparsers)`; a parser's `func(args) -> int` does the work.
COMMAND_MODULES = [
    "rlstack.commands.stack_cmds",
    "rlstack.commands.image_cmds",
    "rlstack.commands.payload_cmds",
    "rlstack.commands.probe_cmds",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlstack", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"rlstack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except RlstackError as exc:
        print(f"rlstack: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rlstack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
