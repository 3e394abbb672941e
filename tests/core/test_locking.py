"""The run folder lock: one holder at a time, named to the one refused; gone with its process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlstack.core.locking import FolderInUseError, exclusive

HOLD = ("import sys, time\nfrom pathlib import Path\nfrom rlstack.core.locking import exclusive\n"
        "with exclusive(Path(sys.argv[1]), 'x', 'y'):\n    print('held', flush=True)\n    time.sleep(60)\n")


def test_a_second_holder_is_refused_with_the_first_named(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUseError) as exc, exclusive(tmp_path / "run", "run folder r", "wait for it"):
            pass
        assert f"run folder r is in use by pid {holder.pid}" in exc.value.message and exc.value.hint == "wait for it"
        os.kill(holder.pid, signal.SIGKILL)  # a killed holder leaves no stale lock
        holder.wait()
        with exclusive(tmp_path / "run", "run folder r", "h"):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_released_after_the_block(tmp_path: Path) -> None:
    with exclusive(tmp_path, "f", "h"):
        pass
    with exclusive(tmp_path, "f", "h"):
        pass
