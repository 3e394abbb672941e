"""One error type for every failure a user can fix, so the CLI and invoke print it the same way.

Every error carries a `hint`: what to do next. Tracebacks are for our bugs, not for a user's typo.
"""

from __future__ import annotations

import errno


class RlstackError(Exception):
    """A failure the user can act on. `exit_code` lets scripts tell kinds of failure apart."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  -> {self.hint}"
        return self.message


class UnknownStackError(RlstackError):
    pass


class StackFileError(RlstackError):
    pass


class LockError(RlstackError):
    exit_code = 3


class StaleLockError(LockError):
    exit_code = 4


class DockerError(RlstackError):
    exit_code = 5


class DiskFullError(RlstackError):
    """The disk filled up mid-write. 28 is ENOSPC's errno, so scripts can tell a full disk from other failures;
    every durable write (core.fileio) leaves the old content or the new, never a torn file, so freeing space and
    running again is safe."""

    exit_code = 28


# How libraries word an ENOSPC they wrap in their own exception types (safetensors, torch's zip writer, Rust IO).
_ENOSPC_TEXT = ("No space left on device", "file write failed", "StorageFull", "code: 28", "os error 28")


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is a full disk (ENOSPC, or a library's wrapping of it)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno == errno.ENOSPC:
            return True
        if not isinstance(cur, OSError) and any(t in str(cur) for t in _ENOSPC_TEXT):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def as_disk_full(exc: BaseException) -> DiskFullError | None:
    """The DiskFullError a command line reports for `exc` when it is a full disk that no code nearer the write
    turned into one (its output, a report, a matrix); None otherwise. Every durable write replaces a file whole
    (core.fileio), so the hint can say that running again is safe."""
    if isinstance(exc, DiskFullError):
        return exc
    if isinstance(exc, RlstackError) or not is_disk_full(exc):
        return None
    where = getattr(exc, "filename", None)
    return DiskFullError(f"disk full{f' writing {where}' if where else ''}: {exc}",
                         "free disk space (or write elsewhere), then run the same command again: files rlstack "
                         "writes are replaced whole, never left half-written")
