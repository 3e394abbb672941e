"""fastgen's top-k draw as two Triton kernels (``FastGenerator(draw="triton")``): temperature, top-k and the
draw of one token a row from the float32 logits, in two launches instead of the ~8 torch kernels of
``engine._warp`` + ``engine._draw`` (and the ~8 of the bookkeeping after them, see ``Advance``).

Why: between two replays of the decode step the pick's GPU work is many times what reading the logits costs
(``pick_parts`` in bench/results/fastgen_profile.json): torch.topk over 151,936 logits with one row a sequence
leaves most of the GPU idle, then a masked copy, Exp(1) noise over the whole vocabulary, its log and an argmax,
each a pass over [B, V] float32, while the logits are 4.9 MB at 8 sequences, one read of them a few
microseconds at HBM bandwidth. So:

1. ``chunk_top`` (grid rows x chunks): each program reads one chunk of a row (the temperature applied as torch
   applies it on CUDA: a multiply by the float32 reciprocal) and keeps its KP largest (KP: top_k rounded up to
   a power of two) as 64-bit keys, an order-preserving form of the float32 value above the token's index, with
   Triton's bitonic ``tl.topk``. A row's k largest are among its chunks' KP largest.
2. ``row_draw`` (one program a row): the KP largest of the row's candidates, sorted; the k-th is the threshold
   transformers' TopKLogitsWarper keeps (``logits >= kth``, ties kept); then the Gumbel-max draw over the kept
   candidates: argmax(value - log(E)), E = -log(U), U uniform from Triton's Philox keyed by the generation's
   seed and counted by (step, row, token). That is a sample of softmax(value) over the kept tokens, as
   ``engine._draw`` is (which takes E ~ Exp(1) from torch's generator: aten's multinomial); the distribution is
   the same, the random stream is not (torch's exponential_ cannot be reproduced in a kernel), so a seeded
   call gives other tokens than the torch draw does, and the same tokens again under the same seed. With
   ``advance`` (the engine's launch) the same program then does the pick's bookkeeping for its row (EOS, the
   pad token, the token buffer, the position: ``Advance``), ~8 small torch kernels a step fewer.

Exact where ties sit at the threshold: a chunk whose KP-th candidate is still kept may have dropped equal values
(transformers keeps them all), so such a row reads its whole logits once more and draws over every token at or
above the threshold (the same noise for the same token: the same draw). Rows that are not a distribution (a NaN
or +inf logit, or none finite) are marked in ``invalid``, as ``engine._draw`` marks them.

What it does not do (``applies`` says which, the engine then draws in torch): top-p, min-p, no top-k (a draw
over the whole vocabulary), top_k > MAX_TOP_K, greedy (one argmax is already one kernel).
Kernels are built on first use (``kernels``), as fastgen.split_attention's are: ``triton.jit`` decides at
decoration whether it compiles or runs in Triton's CPU interpreter (TRITON_INTERPRET=1, the CPU tests).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlstack.payload.fastgen.triton_support import pow2_at_least

MAX_TOP_K = 128  # KP = 128: a row's candidates (<= 38 chunks x 128 for a 152k vocabulary) sort in one program
TARGET_CHUNKS = 64  # chunks a row at most, for a large vocabulary: 8 rows x ~38 chunks fill a 132-SM sm_90 GPU
NUM_WARPS = 8


@dataclasses.dataclass(frozen=True)
class Plan:
    """The kernels' shape for a (vocabulary, top_k): candidates kept a chunk (``kp``), the chunk's width, how many
    chunks a row has, and the candidates' count padded to a power of two (the second kernel's sort)."""

    kp: int
    width: int
    chunks: int
    cand_p2: int

    @classmethod
    def make(cls, vocab: int, top_k: int, target_chunks: int | None = None) -> Plan:
        """``target_chunks`` (default TARGET_CHUNKS): at most this many chunks a row, fewer where a chunk must
        still hold kp tokens; more chunks are more programs (more SMs busy at 8 rows) and more candidates for the
        one program a row to sort (bench/fastgen_profile.py times a few: ``draw_triton_by_chunks``)."""
        kp = max(16, pow2_at_least(top_k))
        width = max(kp, pow2_at_least(-(-vocab // (target_chunks or TARGET_CHUNKS))))
        chunks = -(-vocab // width)
        return cls(kp=kp, width=width, chunks=chunks, cand_p2=pow2_at_least(chunks * kp))


def applies(do_sample: bool, top_k: int | None, top_p: float, min_p: float | None, vocab: int,
            batch: int) -> str | None:
    """None where the kernels draw what ``engine._warp`` + ``engine._draw`` would (in distribution), else why not,
    for the engine to say once and draw in torch."""
    if not do_sample:
        return "greedy decoding is one argmax"
    if not top_k or top_k >= vocab:
        return "sampling without top-k (the kernels draw among a row's top-k candidates)"
    if top_k > MAX_TOP_K:
        return f"top_k {top_k} > {MAX_TOP_K}"
    if top_p < 1.0 or min_p is not None:
        return "top-p / min-p sampling"
    if batch * vocab >= 2 ** 31:
        return f"{batch} rows x {vocab} tokens: more than 2**31 logits"
    return None


_KERNELS: Any = None
# the kernels' Triton helpers: module globals, bound by kernels()' `def`s under these very names, because Triton
# resolves a name a kernel calls in the kernel's module globals, and inductor (a kernel inside a compiled graph)
# re-declares each helper from its source, under the name its `def` gives it (split_attention's helper, bound
# under another name, failed in inductor's compile worker on the GPU)
_key: Any = None
_value: Any = None
_scores: Any = None


def kernels() -> Any:
    """(chunk_top, row_draw, noise_of), decorated on first use (FastGenerator calls it when made, outside any graph)."""
    global _KERNELS, _key, _value, _scores
    if _KERNELS is not None:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def _key(x):  # binds the global (declared above)
        # float32 -> uint32 in the same order (negatives' bits flipped, positives' sign bit set); a NaN becomes
        # the largest key, so a row holding one shows as invalid (its largest value is not finite)
        x = tl.where(x == 0.0, 0.0, x)  # -0.0 as +0.0: equal as floats, so equal as keys
        bits = x.to(tl.uint32, bitcast=True)
        # (a xor, not ~: Triton 3.6's interpreter fails ~ on an unsigned tensor)
        key = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
        return tl.where(x != x, 0xFFFFFFFF, key)

    @triton.jit
    def _value(key):
        bits = tl.where((key >> 31) != 0, key & 0x7FFFFFFF, key ^ 0xFFFFFFFF)  # _key, undone
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _scores(value, token, seed, step, row, batch, vocab):
        # Gumbel-max: value - log(E), E = -log(U) ~ Exp(1); U from Philox at (seed; (step, row, token)). U = 0
        # (one in 2**31) gives E = inf and a score of -inf: never drawn, as aten's exponential_ at inf
        u = tl.rand(seed, (step * batch + row) * vocab + token.to(tl.int64))
        return value - tl.log(-tl.log(u))

    @triton.jit
    def chunk_top(logits_ptr, cand_ptr, stride_b, vocab, INV_T: tl.constexpr, CHUNKS: tl.constexpr,
                  WIDTH: tl.constexpr, KP: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        idx = c * WIDTH + tl.arange(0, WIDTH)
        x = tl.load(logits_ptr + row * stride_b + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        if INV_T != 1.0:
            x = x * INV_T
        packed = (_key(x).to(tl.uint64) << 32) | idx.to(tl.uint64)
        tl.store(cand_ptr + (row * CHUNKS + c) * KP + tl.arange(0, KP), tl.topk(packed, KP))

    @triton.jit
    def row_draw(logits_ptr, cand_ptr, seed_ptr, step_ptr, tok_ptr, invalid_ptr, live_ptr, eos_ptr, tokens_ptr,
                 pos_ptr, stride_b, vocab, batch, stride_tokens,
                 INV_T: tl.constexpr, K: tl.constexpr, CHUNKS: tl.constexpr, KP: tl.constexpr,
                 CAND_P2: tl.constexpr, CHUNKS_P2: tl.constexpr, WIDTH: tl.constexpr, ADVANCE: tl.constexpr,
                 N_EOS: tl.constexpr, EOS_P2: tl.constexpr, PAD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        seed = tl.load(seed_ptr)
        step = tl.load(step_ptr)
        offs = tl.arange(0, CAND_P2)
        base = cand_ptr + row * CHUNKS * KP
        cand = tl.load(base + offs, mask=offs < CHUNKS * KP, other=0)  # 0: below every real key
        keys = cand >> 32
        best = tl.topk(keys, KP)  # sorted, largest first
        thr = tl.max(tl.where(tl.arange(0, KP) == K - 1, best, 0), axis=0)  # the k-th largest
        top = tl.max(keys, axis=0)
        bad = (top >= 0xFF800000) | (top <= 0x007FFFFF)  # largest is +inf or NaN, or -inf: no distribution
        # a chunk whose last candidate is kept (and finite) may have dropped values equal to the threshold
        cs = tl.arange(0, CHUNKS_P2)
        last = tl.load(base + cs * KP + KP - 1, mask=cs < CHUNKS, other=0) >> 32
        spilled = tl.sum(((last >= thr) & (last > 0x007FFFFF)).to(tl.int32), axis=0) > 0
        if spilled:  # rare: every token of the row at or above the threshold, read again
            best_s = tl.full([], float("-inf"), tl.float32)
            best_t = tl.full([], 0, tl.int32)
            for start in range(0, CHUNKS * WIDTH, WIDTH):
                idx = start + tl.arange(0, WIDTH)
                x = tl.load(logits_ptr + row * stride_b + idx, mask=idx < vocab,
                            other=float("-inf")).to(tl.float32)
                if INV_T != 1.0:
                    x = x * INV_T
                s = tl.where(_key(x).to(tl.uint64) >= thr, _scores(x, idx, seed, step, row, batch, vocab),
                             float("-inf"))
                m = tl.max(s, axis=0)
                at = tl.argmax(s, axis=0)
                take = m > best_s
                best_t = tl.where(take, start + at, best_t)
                best_s = tl.where(take, m, best_s)
            tok = best_t.to(tl.int64)
        else:
            token = (cand & 0xFFFFFFFF).to(tl.int32)
            s = tl.where((keys >= thr) & (offs < CHUNKS * KP),
                         _scores(_value(keys.to(tl.uint32)), token, seed, step, row, batch, vocab), float("-inf"))
            at = tl.argmax(s, axis=0)
            tok = tl.sum(tl.where(offs == at, token, 0), axis=0).to(tl.int64)
        old = tl.load(invalid_ptr + row)
        tl.store(invalid_ptr + row, old | bad)
        if ADVANCE:  # engine._pick's bookkeeping for this row (its step and slot counters stay torch's: shared)
            if N_EOS > 0:
                live = tl.load(live_ptr + row)
                tok = tl.where(live, tok, PAD)  # a finished row gets the pad token
                ids = tl.arange(0, EOS_P2)
                eos = tl.load(eos_ptr + ids, mask=ids < N_EOS, other=-1)
                hit = tl.sum((eos == tok).to(tl.int32), axis=0) > 0
                tl.store(live_ptr + row, live & (hit == 0))
            tl.store(tokens_ptr + row * stride_tokens + step, tok)
            tl.store(pos_ptr + row, tl.load(pos_ptr + row) + 1)
        tl.store(tok_ptr + row, tok)

    @triton.jit
    def noise_of(out_ptr, seed_ptr, step_ptr, batch, vocab, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        u = tl.rand(tl.load(seed_ptr), (tl.load(step_ptr) * batch + row) * vocab + idx.to(tl.int64))
        tl.store(out_ptr + row * vocab + idx, tl.log(-tl.log(u)), mask=idx < vocab)

    _KERNELS = (chunk_top, row_draw, noise_of)
    return _KERNELS


def inverse_temperature(temperature: float) -> float:
    """1 / temperature as torch's CUDA kernel computes ``logits / temperature`` for a Python scalar: the float32
    reciprocal, multiplied in (aten's div_true_kernel_cuda). A float32 value, so the constexpr Triton gets is
    exact."""
    import numpy as np

    return float(np.float32(1.0) / np.float32(temperature))


@dataclasses.dataclass(frozen=True)
class Advance:
    """What ``draw`` also does for each row after its token, in the same program (``engine._pick``'s bookkeeping,
    which is otherwise ~8 small torch kernels a step): a finished row (``live`` False) gets ``pad``; a row whose
    token is one of ``eos`` is finished; the token is written at column ``step`` of ``tokens`` [B, L] and into
    ``tok`` [B, 1]; ``pos`` [B, 1] moves on by one. The step and slot counters are shared by every row: the
    caller moves them after the launch."""

    live: Any
    eos: Any  # [E] int64, or None: no EOS
    tokens: Any
    tok: Any
    pos: Any
    pad: int


def draw(logits: Any, top_k: int, temperature: float, seed: Any, step: Any, invalid: Any,
         target_chunks: int | None = None, num_warps: int = NUM_WARPS, advance: Advance | None = None) -> Any:
    """One token a row, [B] int64, from float32 (or bf16) ``logits`` [B, V] (rows contiguous): temperature, top-k
    (transformers' rule, ties at the k-th value kept), then a draw from the softmax over what is kept. ``seed``
    and ``step`` are [1] int64 device tensors (a captured graph reads them where they are: the step advances in
    place); ``invalid`` [B] bool is or-ed with the rows that were not a distribution. Call ``applies`` first.
    ``target_chunks`` and ``num_warps``: the launch shape (Plan.make; the defaults are the engine's). With
    ``advance`` the kernel also does the pick's bookkeeping (Advance), and the token it returns is the one
    written (the pad token for a finished row); the returned tensor is ``advance.tok`` then."""
    import torch

    chunk_top, row_draw, _ = kernels()
    batch, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    plan = Plan.make(vocab, top_k, target_chunks)
    inv_t = inverse_temperature(temperature)
    cand = torch.empty((batch, plan.chunks, plan.kp), dtype=torch.uint64, device=logits.device)
    chunk_top[(batch, plan.chunks)](logits, cand, logits.stride(0), vocab, INV_T=inv_t, CHUNKS=plan.chunks,
                                    WIDTH=plan.width, KP=plan.kp, num_warps=num_warps)
    if advance is None:
        tok = torch.empty((batch,), dtype=torch.long, device=logits.device)
        live = eos = tokens = pos = tok  # not read (ADVANCE=0)
        n_eos, stride_tokens, pad = 0, 0, 0
    else:
        tok, live, tokens, pos, pad = advance.tok, advance.live, advance.tokens, advance.pos, advance.pad
        if tok.stride(0) != 1 or pos.stride(0) != 1 or tokens.stride(1) != 1:
            raise ValueError("draw's advance wants [B, 1] tok and pos and a [B, L] tokens buffer, rows contiguous")
        eos = advance.eos if advance.eos is not None else tok
        n_eos, stride_tokens = (0 if advance.eos is None else advance.eos.numel()), tokens.stride(0)
    row_draw[(batch,)](logits, cand, seed, step, tok, invalid, live, eos, tokens, pos, logits.stride(0), vocab,
                       batch, stride_tokens, INV_T=inv_t, K=top_k, CHUNKS=plan.chunks, KP=plan.kp,
                       CAND_P2=plan.cand_p2, CHUNKS_P2=pow2_at_least(plan.chunks), WIDTH=plan.width,
                       ADVANCE=int(advance is not None), N_EOS=n_eos, EOS_P2=pow2_at_least(n_eos), PAD=pad,
                       num_warps=num_warps)
    return tok


def noise(seed: Any, step: Any, batch: int, vocab: int) -> Any:
    """log(-log(U)) for every (row, token) of a step, [batch, vocab] float32 on ``seed``'s device, from the same
    Philox numbers ``draw`` uses (``seed`` and ``step`` as ``draw`` takes them): what a reference draw in torch
    subtracts from the kept values (``draw``'s score is value - this)."""
    import torch

    out = torch.empty((batch, vocab), dtype=torch.float32, device=seed.device)
    block = 1024
    kernels()[2][(batch, -(-vocab // block))](out, seed, step, batch, vocab, BLOCK=block)
    return out
