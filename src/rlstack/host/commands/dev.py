"""The project's own development: `invoke test` and `invoke bench NAME` and, under `invoke dev.`, lint and
typecheck (rlstack.host.devtools)."""

from __future__ import annotations

from typing import Annotated

import typer


def _benchmarks() -> str:
    from rlstack.host.devtools import BENCHMARKS

    return "; ".join(f"{name}: {what}" for name, what in BENCHMARKS.items())


def bench(
    name: Annotated[str, typer.Argument(help=f"the benchmark, one of: {_benchmarks()}")],
    smoke: Annotated[bool, typer.Option(help="tiny model on the CPU to check the script (results go to "
                                             "/tmp)")] = False,
    args: Annotated[str, typer.Option(help="arguments for the script, e.g. '--batches 8' (its own --help: "
                                           "--args --help)")] = "",
) -> int:
    """Run one benchmark with this Python (natively, or inside a stack's container); it writes
    bench/results/NAME.json, and `invoke docs` renders docs/performance.md from it."""
    from rlstack.host import devtools

    return devtools.bench(name, smoke=smoke, args=args)


def test(
    no_docker: Annotated[bool, typer.Option(help="skip the Docker tests (they also skip by themselves when no "
                                                 "engine answers)")] = False,
    gpu: Annotated[bool, typer.Option(help="also run the GPU tests (needs CUDA)")] = False,
    k: Annotated[str, typer.Option("-k", help="pytest -k expression")] = "",
    fast: Annotated[bool, typer.Option(help="skip the slow tests (training, network)")] = False,
) -> int:
    """Lint, then the test suite: unit, slow (CPU training) and Docker tests; --gpu adds the GPU tests."""
    from rlstack.host import devtools

    return devtools.run_tests(docker=not no_docker, gpu=gpu, keyword=k, fast=fast)


def lint() -> int:
    """ruff over src, tests, bench and tasks.py."""
    from rlstack.host import devtools

    return devtools.lint()


def typecheck() -> int:
    """mypy over src/rlstack."""
    from rlstack.host import devtools

    return devtools.typecheck()
