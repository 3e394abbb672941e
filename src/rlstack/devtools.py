"""The project's own test and lint entry points, shared by `invoke test` and .ci/run."""

from __future__ import annotations

import sys

from rlstack import runner


def run_tests(*, docker: bool = False, gpu: bool = False, keyword: str = "") -> int:
    """ruff, then pytest. Markers select the heavy tests; pytest's 'no tests ran' (5) is not a failure."""
    runner.run([sys.executable, "-m", "ruff", "check", "src", "tests", "bench", "tasks.py"])
    markers: list[str] = []
    if not docker:
        markers.append("not docker")
    if not gpu:
        markers.append("not gpu")
    cmd = [sys.executable, "-m", "pytest", "-m", " and ".join(markers) or "docker or not docker"]
    if keyword:
        cmd += ["-k", keyword]
    rc = runner.run(cmd, check=False).returncode
    return 0 if rc == 5 else rc
