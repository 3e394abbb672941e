"""Where fastgen's own Triton kernel (fastgen.split_attention's decode attention) can run: one check, which
FastGenerator uses both to refuse ``decode_attention="triton"`` with a reason and to decide what "auto" takes. No
torch or triton import at module level: FastGenerator's option checks stay cheap."""

from __future__ import annotations

import os


def interpreted() -> bool:
    """Whether Triton runs in its CPU interpreter (TRITON_INTERPRET=1): the only way the kernels run off CUDA."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def available(device_type: str, what: str) -> str | None:
    """None where the kernels can run on this device, else why not, for FastGenerator to refuse ``what`` (the
    option) with."""
    if device_type != "cuda" and not interpreted():
        return f"{what} runs on CUDA (or in Triton's CPU interpreter, TRITON_INTERPRET=1)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return f"{what} needs the triton package (torch's CUDA wheels bring it)"
    return None


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): the block sizes Triton's tl.arange and the kernels' sorts
    need, from the sizes fastgen launches them for."""
    return 1 << max(0, n - 1).bit_length()
