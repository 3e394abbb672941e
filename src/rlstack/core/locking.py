"""A folder that one process at a time may write (a training run's folder): an exclusive, non-blocking lock
that names its holder when it is refused.

The lock is fcntl.flock on a small file inside the folder: the kernel releases it when the holder's process
ends, however it ends (a kill included), so there is never a stale lock to delete by hand. The file stays
(removing it would let a second process lock a new file of the same name while a third still holds the old
one); what it says about the holder is rewritten by each new holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rlstack.core.errors import RlstackError

LOCK_FILE = ".rlstack-lock"


class FolderInUseError(RlstackError):
    """Another process holds the folder. 75 is sysexits' EX_TEMPFAIL: try again once the holder is done."""

    exit_code = 75


def _holder(path: Path) -> str:
    """Who holds the lock, as the holder wrote it: pid, host, since when, its command line."""
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not written its details yet)"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info.get("since", 0))))
    return f"pid {info['pid']} on {info.get('host', '?')} since {since} ({info.get('command', '?')})"


@contextlib.contextmanager
def exclusive(folder: Path, what: str, hint: str) -> Iterator[Path]:
    """Hold `folder` (created if missing) for this process while the block runs; a FolderInUseError naming the
    holder, at once and before anything is written, when another process holds it. `what` names the folder in
    the message ("run folder runs/train/x"), `hint` says what to do instead."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUseError(f"{what} is in use by {_holder(path)}", hint) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                "command": " ".join(sys.argv)[:300]}
        with contextlib.suppress(OSError):  # on a full disk the lock still holds; only its details are lost
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
        yield folder
    finally:
        os.close(fd)  # closing the last descriptor releases the flock
