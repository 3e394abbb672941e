"""File primitives that every durable write in rlstack shares (adapters, checkpoints, the wheel cache):
content hashing and fsync, so "written" means "on disk" the same way everywhere."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path

from rlstack.core.errors import RlstackError


class FolderError(RlstackError):
    """A folder the user named (a run's --output, an adapter store) that cannot be one: a file is in its place or
    in its path, or it cannot be created or written (a read-only file system)."""


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


def check_folder(path: Path, what: str) -> Path:
    """`path` when it is a folder this process can write, or one it can create (creating nothing); else a
    FolderError that names it under `what`, the flag it came from. Checked before a command starts its work, so
    a file where a folder belongs, or a read-only file system, is refused at once rather than after a training
    as a FileExistsError traceback."""
    existing = Path("/")
    for existing in (path, *path.parents):  # the nearest part of the path that is there
        try:
            os.lstat(existing)
            break
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:  # a name past the file system's limit, a loop of links
            raise FolderError(f"{what} {path}: not a usable path ({exc.strerror or exc})",
                              "pass a shorter path, with no loop of links") from None
    if not existing.is_dir():
        raise FolderError(f"{what} {path} is not a folder: {existing} is a file",
                          "pass a folder (one that does not exist yet is created)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FolderError(f"{what} {path}: cannot write in {existing} (read-only, or not yours)",
                          "pass a folder on a file system you can write to")
    return path


def check_output_file(path: Path, what: str) -> Path:
    """`path` when a file can be written there (what is there is a file, or nothing, in a writable folder);
    else a FolderError under `what`: a folder in its place was an IsADirectoryError traceback from the rename."""
    if path.is_dir():
        raise FolderError(f"{what} {path} is a folder, not a file", f"name a file, e.g. {path / 'out.json'}")
    check_folder(path.parent, what)
    return path


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


def tree_hashes(folder: Path, skip: str = "") -> dict[str, str]:
    """sha256 of every regular file below `folder` (POSIX relative path -> hex), `skip` (a top-level file name,
    the record itself) left out: what a cache folder records when it is written, to check it before reuse."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != skip)
    return {rel: sha256_file(folder / rel) for rel in files}


def tree_difference(folder: Path, recorded: dict[str, str], skip: str = "") -> str | None:
    """How `folder` differs from the hashes `recorded` by tree_hashes (missing, extra or changed files, a
    symlink anywhere), or None when it is exactly what was recorded."""
    links = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_symlink())
    if links:
        return f"symlink(s) {links[:3]}"
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != skip}
    if not recorded or on_disk != set(recorded):
        return f"files differ from the record (missing {sorted(set(recorded) - on_disk)}, extra " \
               f"{sorted(on_disk - set(recorded))})"
    for rel, digest in sorted(recorded.items()):
        if sha256_file(folder / rel) != digest:
            return f"{rel} does not match its sha256 (changed or truncated)"
    return None
