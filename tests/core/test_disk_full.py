"""A full disk anywhere ends in exit 28 with one clean message: where no code nearer the write named it (a
command's output, a report, a matrix), the command line does."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rlstack.core.errors import DiskFullError, RlstackError, as_disk_full, is_disk_full


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_found_through_a_librarys_wrapping() -> None:
    try:
        try:
            raise _enospc()
        except OSError as inner:
            raise RuntimeError("could not save") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
        full = as_disk_full(outer)
    assert isinstance(full, DiskFullError) and full.exit_code == 28 and "run the same command again" in str(full)
    assert as_disk_full(OSError(errno.EACCES, "denied")) is None
    assert as_disk_full(RlstackError("a user's mistake")) is None


def test_the_command_line_turns_a_stray_enospc_into_exit_28(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`probe -o` on a full disk was an OSError traceback (exit 1)."""
    from rlstack.cli import main
    from rlstack.probes import commands

    def full(path: Path, text: str) -> Path:
        raise _enospc()

    monkeypatch.setattr(commands, "write_atomic", full)
    assert main(["probe", "--stack", "cpu", "--layer", "resolve", "-o", str(tmp_path / "p.json")]) == 28
    err = capsys.readouterr().err
    assert "disk full" in err and "Traceback" not in err
