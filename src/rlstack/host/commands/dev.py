"""The project's own development: `invoke test` and, under `invoke dev.`, lint, typecheck and the GPU
benchmarks (rlstack.host.devtools)."""

from __future__ import annotations

from typing import Annotated

import typer


def bench(
    only: Annotated[str | None, typer.Option(help="comma-separated subset of: rollout, grpo, eval, e2e (default: "
                                                  "all)")] = None,
    smoke: Annotated[bool, typer.Option(help="tiny model on the CPU to check the scripts (results go to "
                                             "/tmp)")] = False,
    args: Annotated[str, typer.Option(help="extra arguments passed to every script, e.g. '--completion 64'")] = "",
) -> int:
    """Run the GPU benchmarks (rollout tokens/s, GRPO step, eval throughput, the payload end to end); each
    writes bench/results/*.json + .md."""
    from rlstack.host import devtools

    return devtools.bench(only=only, smoke=smoke, args=args)


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
