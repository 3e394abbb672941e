"""The stacks table (`invoke stacks`, README): every cell is read from stack files and locks."""

from __future__ import annotations

from rlstack.core.errors import LockError
from rlstack.host import locks
from rlstack.host.stacks import Stack

HEADERS = ["stack", "python", "torch", "cuda", "nvcc", "gpu archs", "key packages", "lock"]


def stack_row(stack: Stack) -> list[str]:
    try:
        versions = locks.locked_versions(stack)
        lock_id = locks.lock_hash(stack)[:12]
    except (LockError, FileNotFoundError):
        versions, lock_id = {}, "missing"
    keys = ", ".join(f"{p} {versions.get(locks.normalize(p), '?')}" for p in stack.key_packages)
    return [
        stack.name,
        stack.python,
        stack.torch.version,
        stack.cuda_label,
        stack.cuda_toolkit.version if stack.cuda_toolkit else "-",
        " ".join(stack.gpu_archs) or "cpu only",
        keys,
        lock_id,
    ]
