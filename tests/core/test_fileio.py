"""The one atomic write and folder swap every data file and run folder goes through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlstack.core import fileio


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "compat_matrix.yaml"
    f.write_text("old rows\n")
    fileio.write_atomic(f, "new rows\n")
    assert f.read_text() == "new rows\n" and sorted(p.name for p in tmp_path.iterdir()) == [f.name]

    def interrupted(src: object, dst: object) -> None:
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(OSError):
        fileio.write_atomic(f, "half")
    assert f.read_text() == "new rows\n" and sorted(p.name for p in tmp_path.iterdir()) == [f.name]


def test_swap_in_replaces_a_folder_in_one_rename(tmp_path: Path) -> None:
    dest, new = tmp_path / "run", tmp_path / ".run.staging"
    dest.mkdir()
    (dest / "metrics.jsonl").write_text("old")
    new.mkdir()
    (new / "metrics.jsonl").write_text("new")
    fileio.swap_in(new, dest)
    assert (dest / "metrics.jsonl").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_wheel_record_parse_and_digest() -> None:
    """One RECORD parser for staging and probes: CSV (a quoted path may hold a comma), unhashed rows kept."""
    import hashlib

    from rlstack.core import wheelrecord

    digest = wheelrecord.b64_digest(hashlib.sha256(b"x").digest())
    text = f'pkg/a.py,sha256={digest},1\n"pkg/b,c.py",sha256=AAA,2\npkg-1.dist-info/RECORD,,\n'
    assert wheelrecord.parse(text) == {"pkg/a.py": ("sha256", digest), "pkg/b,c.py": ("sha256", "AAA"),
                                       "pkg-1.dist-info/RECORD": ("", "")}
    assert "=" not in digest and len(digest) == 43


def test_check_folder_refuses_files_in_the_way_and_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert fileio.check_folder(tmp_path / "new" / "deeper", "--output") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()
    for bad in (tmp_path / "f", tmp_path / "f" / "under"):
        with pytest.raises(fileio.FolderError, match="--output .* is not a folder"):
            fileio.check_folder(bad, "--output")
    with pytest.raises(fileio.FolderError, match="not a usable path"):
        fileio.check_folder(tmp_path / ("x" * 300) / "y", "--output")


def test_check_folder_refuses_a_folder_it_cannot_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda *a, **k: False)  # a read-only file system, as root sees one too
    with pytest.raises(fileio.FolderError, match="cannot write"):
        fileio.check_folder(tmp_path / "run", "--output")
