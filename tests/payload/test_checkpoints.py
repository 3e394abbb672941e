"""Checkpoint sealing, torn-checkpoint handling, torn metrics lines and a real full disk (tmpfs)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlstack.core.errors import RlstackError
from rlstack.payload.train import checkpoints, metrics
from rlstack.payload.train.grpo import last_checkpoint


def _ckpt(root: Path, step: int, sealed: bool) -> Path:
    d = root / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(os.urandom(64))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if sealed:
        checkpoints.seal(d)
    return d


def test_resume_picks_the_newest_sealed_checkpoint(tmp_path: Path) -> None:
    _ckpt(tmp_path, 2, sealed=True)
    _ckpt(tmp_path, 4, sealed=True)
    _ckpt(tmp_path, 6, sealed=False)  # killed mid-save
    assert last_checkpoint(tmp_path).name == "checkpoint-4"  # type: ignore[union-attr]


def test_torn_checkpoints_are_moved_aside(tmp_path: Path) -> None:
    _ckpt(tmp_path, 2, sealed=True)
    torn = _ckpt(tmp_path, 4, sealed=False)
    moved = checkpoints.quarantine_torn(tmp_path / "checkpoints")
    assert [p.name for p in moved] == ["torn-checkpoint-4"]
    assert not torn.exists()
    assert [p.name for p in checkpoints.sealed_checkpoints(tmp_path / "checkpoints")] == ["checkpoint-2"]


def test_no_sealed_checkpoint_means_nothing_to_resume(tmp_path: Path) -> None:
    _ckpt(tmp_path, 2, sealed=False)
    assert last_checkpoint(tmp_path) is None


def test_torn_last_metrics_line_is_dropped(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "reward": 0.1}\n{"step": 2, "reward": 0.2}\n{"step": 3, "rew')
    assert [r["step"] for r in metrics.read_rows(p)] == [1, 2]


def test_damaged_middle_metrics_line_is_named(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\ngarbage\n{"step": 3}\n')
    with pytest.raises(RlstackError, match="metrics.jsonl:2"):
        metrics.read_rows(p)


def test_disk_full_guard_translates_enospc(tmp_path: Path) -> None:
    with pytest.raises(checkpoints.DiskFullError) as exc, checkpoints.disk_full_guard(tmp_path, "saving", "free space"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert "disk full while saving" in str(exc.value) and "free space" in str(exc.value)
    with pytest.raises(PermissionError), checkpoints.disk_full_guard(tmp_path, "saving", "x"):
        raise PermissionError(errno.EACCES, "denied")


class SafetensorError(Exception):
    """Stands in for safetensors' Rust error type: not an OSError, its message carries the OS error."""


@pytest.mark.parametrize("exc", [
    SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left '
                    'on device" })'),
    RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data/0: file "
                 "write failed"),
])
def test_disk_full_guard_reads_a_library_wrapped_enospc(tmp_path: Path, exc: Exception) -> None:
    with pytest.raises(checkpoints.DiskFullError) as got, checkpoints.disk_full_guard(tmp_path, "writing", "free"):
        raise exc
    assert got.value.exit_code == 28


def test_disk_full_guard_reads_a_chained_enospc(tmp_path: Path) -> None:
    with pytest.raises(checkpoints.DiskFullError), checkpoints.disk_full_guard(tmp_path, "writing", "free"):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise ValueError("could not save the tokenizer") from inner
    with pytest.raises(ValueError, match="unrelated"), checkpoints.disk_full_guard(tmp_path, "writing", "free"):
        raise ValueError("unrelated")


@contextlib.contextmanager
def tiny_tmpfs(tmp_path: Path, size: str = "256k") -> Iterator[Path]:
    mnt = tmp_path / "full"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_full_disk_adapter_write_leaves_nothing(tmp_path: Path) -> None:
    from rlstack.payload import adapters

    with tiny_tmpfs(tmp_path) as mnt:
        def fill(folder: Path) -> None:
            (folder / "adapter_model.safetensors").write_bytes(os.urandom(1024 * 1024))  # 1 MiB > 256 KiB

        with pytest.raises(checkpoints.DiskFullError, match="writing adapter a1"), \
                checkpoints.disk_full_guard(mnt, "writing adapter a1", "free space"):
            adapters.write_adapter(mnt, "a1", fill, base_model="tiny")
        assert list(mnt.iterdir()) == []  # no adapter, no temp folder


def test_real_full_disk_seal_does_not_mark_complete(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path, "64k") as mnt:
        d = mnt / "checkpoints" / "checkpoint-2"
        d.mkdir(parents=True)
        with pytest.raises(OSError), (d / "optimizer.pt").open("wb") as fh:
            fh.write(os.urandom(256 * 1024))
        assert not checkpoints.is_sealed(d)
        assert checkpoints.sealed_checkpoints(mnt / "checkpoints") == []
