"""Which process this is when `rlstack train` runs under a multi-process launcher (`accelerate launch
--num_processes N`, torchrun). Every process trains its share of the batch; only rank 0 may write the run's
files (recipe.json, metrics.jsonl, the curve, DONE) and the adapter, or N processes would race on one folder.

The launcher puts RANK and WORLD_SIZE in the environment before Python starts, so the answer is known before
torch.distributed is initialised (the run folder is prepared before the Trainer exists). Without a launcher
both are absent: one process, rank 0.
"""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    """Wait for every process (a no-op with one): used before rank 0 seals a checkpoint that the other ranks
    write their own RNG state into."""
    if world_size() <= 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
