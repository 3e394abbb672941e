"""One error type for every failure a user can fix, so the CLI and invoke print it the same way.

Every error carries a `hint`: what to do next. Tracebacks are for our bugs, not for a user's typo.
"""

from __future__ import annotations


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
