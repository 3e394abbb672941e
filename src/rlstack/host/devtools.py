"""The project's own lint, type-check and test entry points, shared by `invoke`, the workflows and .ci/run.

`invoke test` runs the Docker tests too: they skip (with the reason) where no engine answers, and fail
instead when RLSTACK_REQUIRE_DOCKER=1 (set by .ci/run), so one command serves a laptop and CI.
"""

from __future__ import annotations

import sys

from rlstack.host import runner

LINT_PATHS = ["src", "tests", "bench", "tasks.py"]


def lint() -> int:
    runner.run([sys.executable, "-m", "ruff", "check", *LINT_PATHS])
    return 0


def typecheck() -> int:
    return runner.run([sys.executable, "-m", "mypy"], check=False).returncode


def pytest_command(*, docker: bool = True, gpu: bool = False, keyword: str = "", fast: bool = False) -> list[str]:
    excluded = [m for m, keep in (("docker", docker), ("gpu", gpu), ("slow", not fast)) if not keep]
    expr = " and ".join(f"not {m}" for m in excluded) or "docker or not docker"
    cmd = [sys.executable, "-m", "pytest", "-m", expr]
    if keyword:
        cmd += ["-k", keyword]
    return cmd


def run_tests(*, docker: bool = True, gpu: bool = False, keyword: str = "", fast: bool = False) -> int:
    """ruff, then pytest. pytest's 'no tests collected' (exit 5) is not a failure of the project."""
    lint()
    rc = runner.run(pytest_command(docker=docker, gpu=gpu, keyword=keyword, fast=fast), check=False).returncode
    return 0 if rc == 5 else rc
