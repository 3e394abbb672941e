"""`rlstack stacks` and `rlstack lock`: the foundation commands, host side."""

from __future__ import annotations

import argparse
import json
import sys

from rlstack.core.errors import StaleLockError
from rlstack.core.tables import text_table
from rlstack.host import locks, stacks
from rlstack.host.stack_table import HEADERS, stack_row


def cmd_stacks(args: argparse.Namespace) -> int:
    chosen = [stacks.load_stack(n) for n in stacks.resolve_names(args.stack)]
    if args.json:
        print(json.dumps([dict(zip(HEADERS, stack_row(s), strict=True)) for s in chosen], indent=2))
    else:
        print(text_table(HEADERS, [stack_row(s) for s in chosen]))
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    names = stacks.resolve_names(args.stack)
    if args.check:
        stale = []
        for name in names:
            try:
                locks.check(stacks.load_stack(name))
                print(f"lock ok: {name}")
            except StaleLockError as exc:
                print(f"lock STALE: {exc}", file=sys.stderr)
                stale.append(name)
        if stale:
            print(f"{len(stale)} stale lock(s): {', '.join(stale)}", file=sys.stderr)
            return StaleLockError.exit_code
        return 0
    for name in names:
        path = locks.write_lock(stacks.load_stack(name))
        print(f"wrote {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stacks", help="list the stacks and their key versions")
    p.add_argument("--stack", help="one stack or a comma-separated list (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_stacks)

    p = sub.add_parser("lock", help="resolve stacks into hash-locked requirements.lock files")
    p.add_argument("--stack", help="one stack or a comma-separated list (default: all)")
    p.add_argument("--check", action="store_true", help="fail when a lock is stale; resolve nothing")
    p.set_defaults(func=cmd_lock)
    register_ci(sub)


def cmd_ci_matrix(args: argparse.Namespace) -> int:
    from rlstack.host import ci_matrix

    names = stacks.resolve_names(args.stack) if args.stack else None
    text = ci_matrix.matrix_json(args.kind, names)
    print(text)
    if args.github_output:
        with open(args.github_output, "a") as fh:
            fh.write(f"{args.output_name}={text}\n")
    return 0


def register_ci(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ci-matrix", help="print the CI matrix JSON that the workflows consume")
    p.add_argument("--kind", default="all", help="images | gpu-probes | canary | all")
    p.add_argument("--stack", help="restrict to these stacks (comma-separated)")
    p.add_argument("--github-output", help="also append NAME=JSON to this file (GitHub's $GITHUB_OUTPUT)")
    p.add_argument("--output-name", default="matrix", help="the NAME written with --github-output")
    p.set_defaults(func=cmd_ci_matrix)
