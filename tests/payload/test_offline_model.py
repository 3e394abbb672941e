"""A hub model id that cannot be reached offline is a clear error with the fix, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_unknown_model_offline_is_a_clear_error(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rlstack.cli", "eval", "--model", "no-such-org/no-such-model", "-n", "2",
         "--data", "generated:2"],
        capture_output=True, text=True, timeout=300,
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode != 0
    assert "could not load model 'no-such-org/no-such-model'" in proc.stderr
    assert "HF_HUB_OFFLINE" in proc.stderr  # the hint says what to do
    assert "Traceback" not in proc.stderr
