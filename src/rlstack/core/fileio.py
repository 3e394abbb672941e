"""File primitives that every durable write in rlstack shares (adapters, checkpoints, the wheel cache):
content hashing and fsync, so "written" means "on disk" the same way everywhere."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def swap_in(new: Path, dest: Path) -> Path:
    """Put the folder `new` at `dest` in one rename, replacing what was there only once `new` is whole: the old
    folder moves aside first and is removed after, so an interruption leaves one of the two complete."""
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    os.replace(new, dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def write_atomic(path: Path, text: str) -> Path:
    """Write a text file so that a reader (or an interrupted writer) sees the old content or the new, never a
    half-written file: a temporary file in the same folder, then one rename. The temporary name carries the
    process and thread, so two threads writing the same file never share one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
