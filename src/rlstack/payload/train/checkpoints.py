"""Checkpoints that survive a kill at any instant.

The HF Trainer writes `checkpoint-N/` in place, so a SIGKILL or a full disk mid-save leaves a folder that
looks like a checkpoint and is not one. rlstack seals a checkpoint only after the Trainer's save returned:
every file is fsynced, then a marker is written atomically (temp name, fsync, rename). Resume considers
sealed checkpoints only, so a torn one is never picked up under its final name; it is moved aside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlstack.core.errors import DiskFullError, RlstackError, is_disk_full
from rlstack.core.fileio import fsync_path

SEAL = ".rlstack-complete"




def seal(ckpt: Path) -> None:
    """Flush the checkpoint's files to disk, then mark it complete in one atomic rename."""
    for p in sorted(ckpt.rglob("*")):
        if p.is_file():
            fsync_path(p)
    tmp = ckpt / (SEAL + ".tmp")
    with tmp.open("w") as fh:
        fh.write(ckpt.name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, ckpt / SEAL)
    fsync_path(ckpt)


def is_sealed(ckpt: Path) -> bool:
    return (ckpt / SEAL).is_file()


def _step(p: Path) -> int | None:
    tail = p.name.rsplit("-", 1)[-1]
    return int(tail) if p.name.startswith("checkpoint-") and tail.isdigit() else None


def sealed_checkpoints(ckpt_root: Path) -> list[Path]:
    found = [p for p in ckpt_root.glob("checkpoint-*") if p.is_dir() and _step(p) is not None and is_sealed(p)]
    return sorted(found, key=lambda p: _step(p) or 0)


def quarantine_torn(ckpt_root: Path) -> list[Path]:
    """Move unsealed checkpoint folders aside (`torn-checkpoint-N`): kept for a post-mortem, never resumed,
    and out of the Trainer's way when it saves the same step again."""
    moved = []
    for p in ckpt_root.glob("checkpoint-*"):
        if p.is_dir() and _step(p) is not None and not is_sealed(p):
            target = p.with_name("torn-" + p.name)
            if target.exists():
                shutil.rmtree(target)
            os.replace(p, target)
            moved.append(target)
    return moved


def make_seal_callback() -> Any:
    """A TrainerCallback that seals each checkpoint right after the Trainer saved it."""
    from transformers import TrainerCallback

    class SealCallback(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # Under DDP every rank writes its own rng_state_<rank>.pth into the folder: seal after all have.
            from rlstack.payload.train.ranks import barrier

            barrier()
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir() and state.is_world_process_zero:
                seal(ckpt)

    return SealCallback()


# How a full disk reads when a library wraps the OSError: torch.save ("... file write failed"), safetensors' Rust
# writer ("IoError(Os { code: 28, kind: StorageFull, ... })"), tokenizers and others ("No space left on device").
@contextlib.contextmanager
def disk_full_guard(where: Path, what: str, hint: str) -> Iterator[None]:
    """Turn a full disk anywhere inside (ENOSPC, however a library wraps it) into a DiskFullError (exit 28) that
    names the place and what survives."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, RlstackError) or not is_disk_full(exc):
            raise
        try:
            free = f"; {shutil.disk_usage(where if where.exists() else where.parent).free / 1e6:.1f} MB free"
        except OSError:
            free = ""
        raise DiskFullError(f"disk full while {what} ({where}{free})", hint) from None
