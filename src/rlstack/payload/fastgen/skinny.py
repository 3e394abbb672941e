"""A split-K Triton GEMM for the decode step's skinny projections (``FastGenerator(skinny_gemm=True)``).

Why: at 8 sequences a decode step multiplies 8 rows by each weight, so it is a read of the weight, bound by the
memory bandwidth, and cuBLAS's choice for that shape left bandwidth behind on the H200 for two projections:
o_proj at 44 % and down_proj at 62 % of the copy bandwidth (0.40 and 0.68 ms a step over 36 layers, where the
fused gate+up reached 81 %; bench/fastgen_profile.py, 2026-12-04). Both have few output columns (2,560) for
their inner size (4,096 and 9,728), so a kernel that tiles only the output runs ~40 thread blocks on 132 SMs;
this one also splits the inner dimension (split-K), so ~500 blocks each stream a slice of the weight, and the
slices' float32 partial sums are added by torch (one small fused kernel; deterministic, unlike atomics).

Where: the shadow's ``o_proj`` and ``down_proj`` that it owns (merged LoRA or dequantized bases, as
fastgen.fused), for inputs of at most ``MAX_ROWS`` rows: prefill (hundreds of rows) keeps ``F.linear``.
Numerics: on a GPU the dots take the weight's dtype (bf16 x bf16 products are exact in the float32 accumulator,
at twice TF32's tensor-core rate), float32 sums: the result differs from cuBLAS's only in the order of the
float32 additions. Triton 3.6's CPU interpreter computes bf16 dots wrongly, so there (``WIDEN``) both operands
are widened to float32 first: the same products. Built on first use, compiled or in Triton's CPU interpreter
(TRITON_INTERPRET=1 set before triton is imported: the CPU tests).
"""

from __future__ import annotations

import math
from typing import Any

import torch

TARGETS = ("o_proj", "down_proj")  # cuBLAS below 65 % of the bandwidth at 8 rows on the H200 (see above)
MAX_ROWS = 16  # decode steps (one row per sequence) up to this batch; tl.dot's smallest M
BLOCK_N = 64  # output columns per program
BLOCK_K = 128  # inner elements per iteration
TARGET_PROGRAMS = 528  # ~4 thread blocks per SM of an H100/H200 (132 SMs)

_KERNEL: Any = None
_WIDEN = False  # whether kernel() built it for the interpreter (see the docstring)


def kernel() -> Any:
    """The split-K kernel, decorated on first use (see split_attention.kernel: built outside the compiled step)."""
    global _KERNEL, _WIDEN
    if _KERNEL is not None:
        return _KERNEL
    import os

    import triton
    import triton.language as tl

    @triton.jit
    def skinny_kernel(x_ptr, w_ptr, p_ptr, m, n, k, sx, sw, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, ITERS: tl.constexpr, WIDEN: tl.constexpr):
        # one program: BLOCK_N output columns of every row, over one split of the inner dimension (runtime sizes
        # lower case, compile-time ones upper case)
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = offs_m < m
        n_ok = offs_n < n
        w_rows = w_ptr + offs_n[:, None].to(tl.int64) * sw  # 64-bit: an lm_head-sized weight passes 2**31
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        k0 = split * (ITERS * BLOCK_K)
        for it in range(ITERS):  # a fixed trip count (Triton's interpreter takes no tensor bound)
            offs_k = k0 + it * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = offs_k < k
            x = tl.load(x_ptr + offs_m[:, None] * sx + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if WIDEN:
                x, w = x.to(tl.float32), w.to(tl.float32)
            acc += tl.dot(x.to(w.dtype), tl.trans(w))
        tl.store(p_ptr + (split * m + offs_m[:, None]) * n + offs_n[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])

    _KERNEL = skinny_kernel
    _WIDEN = os.environ.get("TRITON_INTERPRET") == "1"  # what triton.jit itself read at the decoration above
    return skinny_kernel


def launch_shape(n: int, k: int) -> tuple[int, int]:
    """(splits, iterations) for an [*, k] @ [n, k].T product: enough programs to fill the GPU (TARGET_PROGRAMS),
    each split a whole number of BLOCK_K blocks and none empty. Static per shape, like a captured step."""
    blocks_k = math.ceil(k / BLOCK_K)
    want = max(1, min(blocks_k, math.ceil(TARGET_PROGRAMS / math.ceil(n / BLOCK_N))))
    iters = math.ceil(blocks_k / want)
    return math.ceil(blocks_k / iters), iters


def matmul(x: Any, weight: Any) -> Any:
    """x [M, K] @ weight [N, K].T for M <= MAX_ROWS, in x's dtype (float32 sums, added split by split)."""
    m, k = x.shape
    n = weight.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    splits, iters = launch_shape(n, k)
    partial = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    split_k = _KERNEL if _KERNEL is not None else kernel()
    split_k[(math.ceil(n / BLOCK_N), splits)](x, weight, partial, m, n, k, x.stride(0), weight.stride(0),
                                              BLOCK_M=MAX_ROWS, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, ITERS=iters,
                                              WIDEN=_WIDEN)
    return partial.sum(dim=0).to(x.dtype)


class SkinnyLinear(torch.nn.Module):
    """A bias-free ``nn.Linear`` of the shadow (same ``weight`` tensor, so refresh's in-place merges reach it)
    whose decode-step calls (at most MAX_ROWS rows) go through the split-K kernel."""

    def __init__(self, linear: Any) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight

    def forward(self, x: Any) -> Any:
        rows = x.numel() // x.shape[-1]
        if rows > MAX_ROWS:
            return torch.nn.functional.linear(x, self.weight)
        return matmul(x.reshape(rows, self.in_features), self.weight).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, split-K up to {MAX_ROWS} rows"


def install(model: Any, owned: Any) -> int:
    """SkinnyLinear in place of each bias-free ``nn.Linear`` named in TARGETS whose weight the shadow owns
    (``owned(full name)``); returns how many (0: nothing to replace, e.g. a shared bf16 base without LoRA)."""
    kernel()
    replaced = 0
    for parent_name, parent in list(model.named_modules()):
        for name in TARGETS:
            mod = getattr(parent, name, None)
            full = f"{parent_name}.{name}" if parent_name else name
            if type(mod) is torch.nn.Linear and mod.bias is None and owned(full):
                setattr(parent, name, SkinnyLinear(mod))
                replaced += 1
    return replaced
