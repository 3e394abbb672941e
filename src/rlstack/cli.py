"""The `rlstack` command, which runs inside a stack (its image, or natively where its libraries are installed):
train, eval, rescore, compare, adapters, probe, diagnose. The host's work (stacks, locks, images,
containers, the matrix, CI) is invoke's (tasks.py). Each command is a typed function whose parameters
declare their flags (rlstack.core.options); this file only builds the parser and turns RlstackError into a
clean message and exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlstack import __version__
from rlstack.core.errors import RlstackError
from rlstack.core.options import build_parser as build_from
from rlstack.core.options import call_parsed


def commands() -> list[object]:
    from rlstack.payload.commands import COMMANDS
    from rlstack.probes.commands import IN_STACK

    return [*COMMANDS, *IN_STACK]


def build_parser() -> argparse.ArgumentParser:
    return build_from("rlstack", (__doc__ or "").split("\n")[0], commands(),  # type: ignore[arg-type]
                      version=f"rlstack {__version__}")


def main(argv: Sequence[str] | None = None) -> int:
    from rlstack.payload import kernelcache

    kernelcache.apply()  # before any command imports torch, vllm or unsloth: they read their cache folders then
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_command", None):
        parser.print_help()
        return 2
    try:
        return int(call_parsed(args) or 0)
    except RlstackError as exc:
        print(f"rlstack: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rlstack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
