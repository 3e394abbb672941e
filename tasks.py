"""invoke tasks for rlstack. Each task parses its arguments and calls one library function; the library
prints every external command before it runs it. `invoke --list` shows them all, `invoke --help TASK`
shows a task's options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from invoke import Context, Exit, task

sys.path.insert(0, "src")  # so `invoke` works from a checkout before `pip install -e .`

from rlstack.errors import RlstackError


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn RlstackError into a one-paragraph message and the error's exit code, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            rc = fn(*args, **kwargs)
        except RlstackError as exc:
            raise Exit(f"rlstack: error: {exc}", code=exc.exit_code) from None
        if isinstance(rc, int) and rc != 0:
            raise Exit(code=rc)
        return rc

    return wrapper


def _cli(*argv: str) -> int:
    from rlstack.cli import main

    return main([a for a in argv if a])


# --- foundation: stacks and locks ------------------------------------------------------------------


@task(help={"stack": "one stack or a comma-separated list (default: all)", "json": "machine-readable output"})
@friendly
def stacks(c: Context, stack: str = "", json: bool = False) -> int:
    """List the stacks with their key versions (read from stack.toml and the locks)."""
    return _cli("stacks", *(["--stack", stack] if stack else []), "--json" if json else "")


@task(help={"stack": "one stack or a comma-separated list (default: all)",
            "check": "exit non-zero when a lock is stale against stack.toml/requirements.in"})
@friendly
def lock(c: Context, stack: str = "", check: bool = False) -> int:
    """Resolve each stack with uv for its platform into images/<stack>/requirements.lock (with hashes)."""
    return _cli("lock", *(["--stack", stack] if stack else []), "--check" if check else "")


# --- images and containers (issue: images) ----------------------------------------------------------

# --- payload: training and evaluation (issue: payload) ----------------------------------------------

# --- probes and the compat matrix (issue: probes) ---------------------------------------------------

# --- CI (issue: CI) ---------------------------------------------------------------------------------

# --- benchmarks (issue: GPU performance) ------------------------------------------------------------

# --- development ------------------------------------------------------------------------------------


@task(help={"docker": "also run the Docker tests (needs a Docker engine)", "k": "pytest -k expression",
            "gpu": "also run the GPU tests (needs CUDA)"})
@friendly
def test(c: Context, docker: bool = False, gpu: bool = False, k: str = "") -> int:
    """Run lint and the test suite (unit tests; --docker adds the image tests)."""
    from rlstack.devtools import run_tests

    return run_tests(docker=docker, gpu=gpu, keyword=k)
