"""The project's own lint, type-check and test entry points, shared by `invoke`, the workflows and .ci/run.

`invoke test` runs the Docker tests too: they skip (with the reason) where no engine answers, and fail
instead when RLSTACK_REQUIRE_DOCKER=1 (set by .ci/run), so one command serves a laptop and CI.
"""

from __future__ import annotations

import sys

from rlstack.core import runner

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


BENCH_SCRIPTS = {"rollout": "bench/rollout_generation.py", "grpo": "bench/grpo_step.py",
                 "eval": "bench/eval_throughput.py", "e2e": "bench/payload_e2e.py"}


def bench(*, only: str | None = None, smoke: bool = False, args: str = "") -> int:
    """Each benchmark script in its own process (they load models and CUDA); the first failure's exit code."""
    import os
    import shlex

    from rlstack.core.errors import RlstackError
    from rlstack.core.paths import project_root

    names = [n for n in (only.split(",") if only else BENCH_SCRIPTS) if n]
    unknown = sorted(set(names) - set(BENCH_SCRIPTS))
    if unknown:
        raise RlstackError(f"unknown benchmark(s) {', '.join(unknown)}", f"choose from {', '.join(BENCH_SCRIPTS)}")
    env = {"RLSTACK_BENCH_SMOKE": "1" if smoke else os.environ.get("RLSTACK_BENCH_SMOKE", "0")}
    rc = 0
    for name in names:
        script = str(project_root() / BENCH_SCRIPTS[name])
        rc = rc or runner.run([sys.executable, script, *shlex.split(args)], env=env, check=False).returncode
    return rc
