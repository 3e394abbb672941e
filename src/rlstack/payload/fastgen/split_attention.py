"""fastgen's decode attention as a split-KV Triton kernel (``FastGenerator(decode_attention="triton")``).

Why: the matmul decode attention (grouped matmuls, ``engine.gqa_decode_attention``) has static shapes, so it reads
every slot of the static cache at every step (at 64 sequences over a 768-slot cache, 7.25 GB a step), while the
filled slots average 466 of the 768 over a 512-token generation; at 8 sequences its skinny batched GEMMs (4 query
heads per KV head) fall well short of the copy bandwidth (docs/performance.md's ``attention_ms``).
``attend_bucket`` reads less by compiling a step per read length. This kernel takes the number of slots to read from
a device tensor instead (the slot this step writes, + 1), so one compiled step and one CUDA graph read exactly the
filled slots at every step, and it splits each (sequence, KV head)'s slots over several thread blocks
(flash-decoding), so that 8 sequences still fill the GPU; the splits are merged by their log-sum-exp.

Numerics: on a GPU the dots take the cache's dtype (bf16 x bf16 products are exact in the float32 accumulator,
and the probabilities are rounded to the cache's dtype before they weigh V, as the matmul kernel's softmax output
is), scores and softmax in float32 like the matmul kernel; the result differs from it in the order of the
float32 reductions. In Triton's CPU interpreter (3.6), which computes bf16 dots wrongly, q, k and v are widened
to float32 first (``INTERPRETED``): the same products, the probabilities kept in float32.

With ``groups`` (``FastGenerator(shared_prompt=True)``) the slots of the prompt are read once per group of rows
whose prompts are the same (GRPO's G generations of one prompt hold G copies of its K/V): a first pass attends
the queries of up to ``rows_per_entry(G)`` such rows (each KV head's G query heads pad the dot's 16 rows anyway)
against one row's copy of the prompt slots, a second pass each row against its own slots after the prompt, and
both passes' splits are merged together.

The kernel is built on first use: ``triton.jit`` decides at decoration whether it runs compiled or in Triton's
CPU interpreter (TRITON_INTERPRET=1, set before triton is imported), which is how the CPU tests run it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rlstack.payload.fastgen.triton_support import pow2_at_least

BLOCK_N = 32  # cache slots per inner iteration
# with BLOCK_N 32 and 8 warps: 80-92 registers a thread, no spill, loads pipelined, for sm_90 and sm_120 (ptxas,
# ahead of time on the host, compiled as a launch specializes it: tests/payload/test_fastgen_triton.py); a
# while-loop form of the kernel spilled 2 KB a thread at BLOCK_N 64 and 4 warps. Registers are not speed: the GPU
# profile chooses (docs/archive/notes.md)
NUM_WARPS = 8
MIN_BLOCK_H = 16  # tl.dot's smallest M: the query heads of one KV head (4 for Qwen3-4B) are padded to it
TARGET_PROGRAMS = 512  # ~4 thread blocks per SM of a 132-SM sm_90 GPU: how many splits a call asks for


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The kernel's launch shape: cache slots per inner iteration (``block_n``), warps per program, how many
    programs a call asks for (``programs``: the splits per (sequence, KV head) follow from it) and Triton's
    software-pipelining depth (``num_stages``; None: Triton's default for the GPU), and whether the kernel merges
    the splits itself (``fuse_merge``: the last program of each (sequence, KV head) to finish merges its splits
    and writes the attention in the query's dtype, one split writes it at once; otherwise ``merge_splits`` runs
    after the kernel, a kernel of its own a layer inside the compiled step, whose launches cost a large share of
    the attention's kernel time for a few KB of partials: docs/archive/notes.md).

    Why a value and not only the constants: alone the kernel read the cache slower than the grouped matmuls do
    (bench/results/archive/sm90/fastgen_profile-triton-20261205.md), and which shape reads faster is a GPU measurement
    (``bench/attention_sweep.py`` times a grid of these); the engine uses ``TUNING`` until one wins there."""

    block_n: int = BLOCK_N
    num_warps: int = NUM_WARPS
    programs: int = TARGET_PROGRAMS
    num_stages: int | None = None
    fuse_merge: bool = False

    def __post_init__(self) -> None:
        for name in ("block_n", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"split attention {name} must be a power of two, not {value!r}")
        if self.block_n < 16:
            raise ValueError(f"split attention block_n must be >= 16 (tl.dot's smallest size), not {self.block_n}")
        if not isinstance(self.programs, int) or self.programs < 1:
            raise ValueError(f"split attention programs must be a positive count, not {self.programs!r}")
        if self.num_stages is not None and (not isinstance(self.num_stages, int) or self.num_stages < 1):
            raise ValueError(f"split attention num_stages must be >= 1 or None, not {self.num_stages!r}")
        if not isinstance(self.fuse_merge, bool):
            raise ValueError(f"split attention fuse_merge must be True or False, not {self.fuse_merge!r}")

    def spec(self) -> str:
        """The compact form ``parse`` reads (``32:8:512:default``, ``:fused`` added with fuse_merge): what an
        engine option or a bench's ``--engine-option attention_tuning=...`` carries (no commas or equals signs,
        which those options' own syntax uses)."""
        stages = "default" if self.num_stages is None else str(self.num_stages)
        return ":".join([str(self.block_n), str(self.num_warps), str(self.programs), stages]
                        + (["fused"] if self.fuse_merge else []))

    @classmethod
    def parse(cls, spec: str) -> Tuning:
        """``block_n:num_warps:programs:num_stages[:fused]`` (``spec``'s form; num_stages ``default`` for
        Triton's) as a Tuning, refused with the form where it is not one."""
        parts = spec.strip().split(":")
        form = "block_n:num_warps:programs:num_stages[:fused], e.g. 64:4:2048:2 or 32:8:512:default:fused"
        if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "fused"):
            raise ValueError(f"split attention tuning {spec!r}: expected {form}")
        try:
            block_n, warps, programs = (int(x) for x in parts[:3])
            stages = None if parts[3] == "default" else int(parts[3])
        except ValueError:
            raise ValueError(f"split attention tuning {spec!r}: expected {form}") from None
        return cls(block_n=block_n, num_warps=warps, programs=programs, num_stages=stages,
                   fuse_merge=len(parts) == 5)

    def label(self) -> str:
        """``block_n=32,num_warps=8,programs=512,num_stages=default``: one results row's key."""
        return ",".join(f"{f.name}={getattr(self, f.name) if getattr(self, f.name) is not None else 'default'}"
                        for f in dataclasses.fields(self))


TUNING = Tuning()  # what the engine launches with


@dataclasses.dataclass(frozen=True)
class Prologue:
    """What the kernel does before attending where ``FastGenerator(fuse_rotary=True)`` asks it to (``attend``'s
    ``prologue``; the query it is given is then the projection's raw one): this step's raw ``key`` and ``value``
    [B, KV, D] (any strides, a unit last one), the RMSNorm weights of the query and key heads [D] (Qwen3's q_norm /
    k_norm; None for a family without them, Llama's) and their ``eps``, and the rotary embedding's ``cos`` / ``sin``
    for this step's position of each sequence [B, D] (rotate_half's convention: the first half's partner is the
    second half's element). Why: transformers runs the norms, the rotary and the cache write as two kernels a layer
    around the attention (their time a step: docs/archive/notes.md), each reading and writing what the attention then
    reads again."""

    key: Any
    value: Any
    q_weight: Any
    k_weight: Any
    eps: float
    cos: Any
    sin: Any


_KERNEL: Any = None  # built once per process by kernel(): compiled, or interpreted (TRITON_INTERPRET=1)
_INTERPRETED = False  # whether kernel() built it for Triton's interpreter (float32 dots, a fixed trip count)
# the kernel's Triton helper: a module global, bound by kernel()'s `def` under this very name, because Triton
# resolves a name a kernel calls in the kernel's module globals, and inductor (a kernel inside a compiled graph)
# re-declares each helper from its source: a helper defined as `rounded` and bound to `_rounded` reached inductor's
# compile worker as `rounded`, and the kernel's call to `_rounded` failed there with a NameError
_rounded: Any = None


def kernel() -> Any:
    """The split kernel, decorated on first use. FastGenerator calls this when it is created, outside the
    compiled step: inside it, dynamo then finds a built kernel (a global) instead of tracing its decoration."""
    global _KERNEL, _INTERPRETED, _rounded
    if _KERNEL is not None:
        return _KERNEL
    import os

    import triton
    import triton.language as tl

    @triton.jit
    def _rounded(x, dt: tl.constexpr, INTERPRETED: tl.constexpr):  # binds the global (declared above)
        # float32 x rounded to dt and widened back: an intermediate as eager rounds it. Triton 3.6's interpreter
        # truncates where it narrows float32 to bf16 (the GPU rounds to nearest even), so there bf16's rounding
        # is done on the bits: the interpreter tests then check the roundings the GPU does
        if INTERPRETED and dt == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
        else:
            return x.to(dt).to(tl.float32)

    @triton.jit
    def split_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, slot_ptr, rows_ptr, prefix_ptr, o_ptr, lse_ptr, f_ptr, cnt_ptr,
                     kn_ptr, vn_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
                     sq_b, sq_h, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sm_b, length,
                     skn_b, skn_h, svn_b, svn_h, sc_b, ss_b,
                     SCALE: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, SPLITS: tl.constexpr, D: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK: tl.constexpr, MASK: tl.constexpr,
                     ITERS: tl.constexpr, PASS: tl.constexpr, R: tl.constexpr, SPLIT0: tl.constexpr,
                     TOTAL: tl.constexpr, FUSE: tl.constexpr, S_P2: tl.constexpr, INTERPRETED: tl.constexpr,
                     PRO: tl.constexpr, NORM: tl.constexpr, EPS: tl.constexpr, HALF: tl.constexpr):
        # SCALE (the softmax scale, a Python float) is a constexpr: inside the compiled step inductor compiles this
        # kernel with its own signature, typing a runtime Python float fp64, which made the scores and the running
        # max fp64 and failed the compile (Triton: "Loop-carried variable m_i ... re-assigned to fp64"); a
        # constexpr float multiplies as float32 (one compile per model: the scale is the model's)
        # PRO 1 (fuse_rotary, PASS 0 only): q_ptr holds the projections' raw query [B, H, D] and kn_ptr / vn_ptr
        # this step's raw key and value [B, KV, D]: every program normalizes (NORM 1: RMSNorm over D with weight
        # qw_ptr / kw_ptr and EPS, Qwen3's q_norm / k_norm) and rotates (cos_ptr / sin_ptr [B, D], rotate_half's
        # halves of HALF) its query heads itself, rounding where eager rounds (to the query's dtype after the
        # norm, the weight, each product and the sum); the program whose split holds this step's slot does the
        # same for the key, writes key and value into the cache at the slot, and attends to them from registers
        # (its loop stops before the slot), so no program reads a slot another one writes.
        # one program: one entry (PASS 0 and 2: one sequence; PASS 1: up to R sequences of one prompt, from
        # rows_ptr [entries, R], -1 where none), one KV head (its G query heads a sequence), one split of the
        # slots the pass reads: PASS 0 every filled slot, 1 the prompt's (< prefix), 2 those after the prompt
        bk = tl.program_id(0)
        split = tl.program_id(1)
        entry = (bk // KV).to(tl.int64)  # 64-bit offsets: a layer cache of 2**31 elements (4 GiB of bf16) is reachable
        kvh = bk % KV
        filled = tl.minimum(tl.load(slot_ptr) + 1, length)  # the slots written so far, this step's included
        begin = filled * 0
        end = filled
        if PASS == 1:
            end = tl.minimum(tl.load(prefix_ptr), filled)
        elif PASS == 2:
            begin = tl.minimum(tl.load(prefix_ptr), filled)
        chunk = tl.cdiv(tl.cdiv(end - begin, SPLITS), BLOCK) * BLOCK
        lo = begin + split * chunk
        hi = tl.minimum(lo + chunk, end)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        member = offs_h // G  # which of the entry's sequences a row of the q tile is
        heads = kvh * G + offs_h % G
        if PASS == 1:
            rows = tl.load(rows_ptr + entry * R + member, mask=member < R, other=-1).to(tl.int64)
            b = tl.load(rows_ptr + entry * R).to(tl.int64)  # the sequence whose K/V (and mask) the entry reads
            hi = tl.where(b >= 0, hi, lo)  # an unused entry reads nothing
            b = tl.maximum(b, 0)
        else:
            rows = tl.where(member < 1, entry, -1)
            b = entry
        h_ok = rows >= 0
        rows = tl.maximum(rows, 0)
        d_ok = offs_d < D
        q = tl.load(q_ptr + rows[:, None] * sq_b + heads[:, None] * sq_h + offs_d[None, :],
                    mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        stop = hi  # where the loop stops: before this step's slot in the program that attends to it from registers
        if PRO == 1:
            dt = q_ptr.dtype.element_ty
            twin = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)  # rotate_half's partner of each element
            sign = tl.where(offs_d < HALF, -1.0, 1.0)
            cos = tl.load(cos_ptr + b * sc_b + offs_d, mask=d_ok, other=0.0).to(tl.float32)
            sin = tl.load(sin_ptr + b * ss_b + offs_d, mask=d_ok, other=0.0).to(tl.float32)
            q_twin = tl.load(q_ptr + rows[:, None] * sq_b + heads[:, None] * sq_h + twin[None, :],
                             mask=h_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            q_own = q.to(tl.float32)
            if NORM == 1:
                inv = tl.rsqrt(tl.sum(q_own * q_own, axis=1) / D + EPS)
                w_own = tl.load(qw_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32)
                w_twin = tl.load(qw_ptr + twin, mask=d_ok, other=0.0).to(tl.float32)
                q_own = _rounded(w_own[None, :] * _rounded(q_own * inv[:, None], dt, INTERPRETED), dt, INTERPRETED)
                q_twin = _rounded(w_twin[None, :] * _rounded(q_twin * inv[:, None], dt, INTERPRETED), dt,
                                  INTERPRETED)
            q = _rounded(_rounded(q_own * cos[None, :], dt, INTERPRETED)
                         + _rounded(sign[None, :] * q_twin * sin[None, :], dt, INTERPRETED), dt, INTERPRETED).to(dt)
            here = tl.load(slot_ptr).to(tl.int64)  # this step's slot (filled - 1)
            owns = (here >= lo) & (here < hi)
            stop = tl.where(owns, hi - 1, hi)
        if INTERPRETED:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
        # compiled, the split's own blocks (a tensor bound: the loop stays pipelined, cp.async, which the
        # ahead-of-time test checks); in Triton 3.6's interpreter, which takes no tensor as a range bound (the CPU
        # tests), a fixed trip count, the longest split's blocks, whose blocks past `hi` load nothing (masked)
        # and add nothing. An empty split (or an unused entry of the prompt pass) skips the loop. Conditions stand
        # around the loop, not in it: one inside stopped the pipelining. (A while loop was not pipelined either.)
        # (the bound is not assigned to a name: the interpreter makes every assigned value a tensor)
        if stop > lo:
            for it in range(ITERS if INTERPRETED else tl.cdiv(stop - lo, BLOCK)):
                offs_n = lo + it * BLOCK + tl.arange(0, BLOCK)
                n_ok = offs_n < stop
                k = tl.load(k_ptr + b * sk_b + kvh * sk_h + offs_n[:, None] * sk_n + offs_d[None, :],
                            mask=n_ok[:, None] & d_ok[None, :], other=0.0)
                if INTERPRETED:
                    k = k.to(tl.float32)
                s = tl.dot(q, tl.trans(k)) * SCALE  # [BLOCK_H, BLOCK]
                if MASK == 1:  # keep (bool, as uint8)
                    keep = tl.load(mask_ptr + b * sm_b + offs_n, mask=n_ok, other=0)
                    s = tl.where((n_ok & (keep != 0))[None, :], s, float("-inf"))
                elif MASK == 2:  # additive
                    add = tl.load(mask_ptr + b * sm_b + offs_n, mask=n_ok, other=float("-inf")).to(tl.float32)
                    s = tl.where(n_ok[None, :], s + add[None, :], float("-inf"))
                else:
                    s = tl.where(n_ok[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing kept yet: no NaN
                alpha = tl.exp(m_i - m_safe)
                p = tl.exp(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                v = tl.load(v_ptr + b * sv_b + kvh * sv_h + offs_n[:, None] * sv_n + offs_d[None, :],
                            mask=n_ok[:, None] & d_ok[None, :], other=0.0)
                if INTERPRETED:
                    v = v.to(tl.float32)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
        if PRO == 1:  # noqa: SIM102 (Triton takes no `and` of a constexpr and a tensor in one condition)
            if owns:
                k_own = tl.load(kn_ptr + b * skn_b + kvh * skn_h + offs_d, mask=d_ok, other=0.0).to(tl.float32)
                k_twin = tl.load(kn_ptr + b * skn_b + kvh * skn_h + twin, mask=d_ok, other=0.0).to(tl.float32)
                if NORM == 1:
                    k_inv = tl.rsqrt(tl.sum(k_own * k_own, axis=0) / D + EPS)
                    kw_own = tl.load(kw_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32)
                    kw_twin = tl.load(kw_ptr + twin, mask=d_ok, other=0.0).to(tl.float32)
                    k_own = _rounded(kw_own * _rounded(k_own * k_inv, dt, INTERPRETED), dt, INTERPRETED)
                    k_twin = _rounded(kw_twin * _rounded(k_twin * k_inv, dt, INTERPRETED), dt, INTERPRETED)
                k_new = _rounded(_rounded(k_own * cos, dt, INTERPRETED)
                                 + _rounded(sign * k_twin * sin, dt, INTERPRETED), dt, INTERPRETED).to(dt)
                v_new = tl.load(vn_ptr + b * svn_b + kvh * svn_h + offs_d, mask=d_ok, other=0.0)
                tl.store(k_ptr + b * sk_b + kvh * sk_h + here * sk_n + offs_d, k_new, mask=d_ok)
                tl.store(v_ptr + b * sv_b + kvh * sv_h + here * sv_n + offs_d, v_new, mask=d_ok)
                k_f = k_new.to(tl.float32)  # the key as the cache now holds it (the cache's dtype is the query's)
                s_new = tl.sum(q.to(tl.float32) * k_f[None, :], axis=1) * SCALE  # [BLOCK_H]
                if MASK == 1:
                    keep_new = tl.load(mask_ptr + b * sm_b + here)
                    s_new = tl.where(keep_new != 0, s_new, float("-inf"))
                elif MASK == 2:
                    s_new = s_new + tl.load(mask_ptr + b * sm_b + here).to(tl.float32)
                m_new = tl.maximum(m_i, s_new)
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m_i - m_safe)
                p_new = tl.exp(s_new - m_safe)
                l_i = l_i * alpha + p_new
                # as the loop's probabilities: float32 in the interpreter, rounded to the cache's dtype compiled
                weight = p_new if INTERPRETED else p_new.to(dt).to(tl.float32)
                acc = acc * alpha[:, None] + weight[:, None] * v_new.to(tl.float32)[None, :]
                m_i = m_new
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        head_row = rows * (KV * G) + heads  # each q-tile row's (sequence, head) row of the [B, H] outputs
        hd_ok = h_ok[:, None] & d_ok[None, :]
        if FUSE == 1 and TOTAL == 1:  # one split (PASS 0): its output is the attention, in the query's dtype
            tl.store(f_ptr + head_row[:, None] * D + offs_d[None, :], out, mask=hd_ok)
        else:
            # partials [B, H, TOTAL, D] and [B, H, TOTAL], contiguous; this pass's splits from SPLIT0
            row = head_row * TOTAL + SPLIT0 + split
            tl.store(o_ptr + row[:, None] * D + offs_d[None, :], out, mask=hd_ok)
            tl.store(lse_ptr + row, lse, mask=h_ok)
            if FUSE == 1:  # (PASS 0 only: attend fuses no two-pass launch)
                # the splits of one (sequence, KV head) take a ticket each once their partials are stored (the
                # barrier: every thread's stores before the one atomic, which releases them at GPU scope); the
                # program that takes the last merges them, as merge_splits does, reading past L1 (.cg) what
                # other programs wrote, and puts the ticket counter back to 0 for the next launch
                tl.debug_barrier()
                ticket = tl.atomic_add(cnt_ptr + bk, 1, sem="acq_rel")
                if ticket == TOTAL - 1:
                    offs_s = tl.arange(0, S_P2)
                    hs_ok = h_ok[:, None] & (offs_s < TOTAL)[None, :]
                    lses = tl.load(lse_ptr + head_row[:, None] * TOTAL + offs_s[None, :], mask=hs_ok,
                                   other=float("-inf"), cache_modifier=".cg")
                    top = tl.max(lses, axis=1)
                    top = tl.where(top == float("-inf"), 0.0, top)
                    w = tl.exp(lses - top[:, None])
                    merged = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
                    for s in range(TOTAL):
                        part = tl.load(o_ptr + (head_row * TOTAL + s)[:, None] * D + offs_d[None, :], mask=hd_ok,
                                       other=0.0, cache_modifier=".cg")
                        merged += tl.sum(tl.where(offs_s[None, :] == s, w, 0.0), axis=1)[:, None] * part
                    merged = merged / tl.maximum(tl.sum(w, axis=1), 1e-30)[:, None]
                    tl.store(f_ptr + head_row[:, None] * D + offs_d[None, :], merged, mask=hd_ok)
                    tl.atomic_xchg(cnt_ptr + bk, 0)

    _KERNEL = split_kernel
    _INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # what triton.jit itself read at the decoration above
    return split_kernel


COUNTER_SLOTS = 1 << 16  # fuse_merge's ticket counters: one a (sequence, KV head) of a launch (256 KB of int32)
_COUNTERS: dict[str, Any] = {}  # device -> the counters, zero between launches (each launch puts its own back)


def counters(device: Any) -> Any:
    """fuse_merge's ticket counters on ``device``, allocated once (zeros) and kept for the process: a captured
    graph holds their address. FastGenerator asks for them when it is created, outside the compiled step, where
    a first allocation would be traced as a graph operation."""
    import torch

    key = str(device)
    found = _COUNTERS.get(key)
    if found is None:
        found = _COUNTERS[key] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return found


def splits_for(batch: int, kv_heads: int, length: int, tuning: Tuning = TUNING) -> int:
    """How many splits of the cache each (sequence, KV head) gets: enough programs to fill the GPU
    (``tuning.programs``), never more than the cache has blocks. Static per shape, like the rest of a captured
    step."""
    want = max(1, math.ceil(tuning.programs / (batch * kv_heads)))
    return max(1, min(want, math.ceil(length / tuning.block_n)))


def iters_for(length: int, splits: int, tuning: Tuning = TUNING) -> int:
    """The kernel's fixed trip count: the blocks of the longest split (a split covers at most length / splits
    slots, rounded up; the filled slots, split at run time, never need more)."""
    return math.ceil(math.ceil(length / splits) / tuning.block_n)


def rows_per_entry(g: int) -> int:
    """How many sequences of one prompt a prompt-pass program serves: their query heads (g each) fill the rows a
    tl.dot computes anyway (MIN_BLOCK_H), so reading the prompt once for them costs no extra arithmetic."""
    return max(1, MIN_BLOCK_H // g)


def prompt_groups(input_ids: Any, attention_mask: Any, per_entry: int) -> list[list[int]]:
    """The entries of the prompt pass: sequences with the same prompt (ids and mask) together, in order of first
    appearance, cut into lists of at most ``per_entry`` (GRPO's G generations of each prompt are G equal rows)."""
    keys = [(tuple(i), tuple(m)) for i, m in zip(input_ids.tolist(), attention_mask.tolist(), strict=True)]
    groups: dict[tuple[Any, Any], list[int]] = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    return [rows[i:i + per_entry] for rows in groups.values() for i in range(0, len(rows), per_entry)]


def entry_table(entries: list[list[int]], batch: int, per_entry: int) -> list[list[int]]:
    """``prompt_groups``' entries as the kernel's [batch, per_entry] table of sequence indices, -1 where none (a
    batch of distinct prompts has one entry a sequence: batch rows; the table's shape never changes, so the
    captured graph that reads it serves any grouping)."""
    table = [[-1] * per_entry for _ in range(batch)]
    for e, rows in enumerate(entries):
        table[e][:len(rows)] = rows
    return table


def mask_argument(mask: Any, fallback: Any) -> tuple[int, Any]:
    """The kernel's MASK kind and mask tensor: 0 and ``fallback`` (any pointer: MASK == 0 never reads it) without
    a mask, 1 and uint8 keep flags for a bool mask, 2 and the additive float mask itself.

    Why a conversion (``to(uint8)``) and not a bitcast (``view(uint8)``): inside the compiled decode step the mask
    is computed, and inductor does not lower view(dtype) of a computed bool tensor ("torch.bool is not supported by
    torch.iinfo", in torch 2.10 and 2.11; it sends the step to eager). The conversion fuses into the kernel that
    computes the mask."""
    import torch

    if mask is None:
        return 0, fallback
    if mask.dtype == torch.bool:
        return 1, mask.to(torch.uint8).contiguous()
    return 2, mask.contiguous()


def merge_splits(o: Any, lse: Any, dtype: Any) -> Any:
    """The splits' partial outputs ``o`` [B, H, S, D] merged by their log-sum-exps ``lse`` [B, H, S] into
    [B, H, 1, D] of ``dtype`` (a split past the filled slots has lse -inf and weighs 0). Inside fastgen's compiled
    step inductor fuses this into a kernel or two; bench/attention_sweep.py compiles it alone to time the same."""
    import torch

    top = lse.amax(dim=-1, keepdim=True)
    w = torch.exp(lse - top.masked_fill(torch.isinf(top), 0.0))
    out = (o * w[..., None]).sum(dim=2) / w.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    return out[:, :, None, :].to(dtype)


def attend(query: Any, key: Any, value: Any, mask: Any, slot: Any, scale: float,
           groups: tuple[Any, Any] | None = None, tuning: Tuning | None = None,
           merge: Any = merge_splits, prologue: Prologue | None = None) -> Any:
    """One decode step's attention: query [B, H, 1, D], key/value [B, KV, L, D] (a static cache, any strides
    with a unit last one), mask [B, L] (bool keep, additive float, or None), slot a [1] int tensor on the device
    (the slot this step writes: slots after it are not read). ``groups``: (the [B, rows_per_entry] int32 table
    of ``entry_table``, the prompt's length as a [1] int tensor), both on the device: the prompt's slots are
    then read once per entry (the module docstring). ``tuning``: the launch shape (``Tuning``; None: the
    module's ``TUNING`` as it is at the call). ``merge``: how the splits are merged (``merge_splits``; the sweep
    passes a compiled one; not called where the kernel merges them itself, ``tuning.fuse_merge``). ``prologue``
    (``Prologue``; not with ``groups``): the query is the projection's raw one, normalized and rotated in the
    kernel, which also writes this step's key and value (normalized and rotated from the prologue's raw ones)
    into ``key`` / ``value`` at ``slot``: the cache itself then, not a view of fewer slots. Returns [B, H, 1, D]
    in the query's dtype."""
    import torch

    tuning = TUNING if tuning is None else tuning
    b, h, _, d = query.shape
    kv, length = key.shape[1], key.shape[2]
    g = h // kv
    q = query[:, :, 0, :]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        key, value = key.contiguous(), value.contiguous()
    kind, m = mask_argument(mask, q)
    if prologue is not None:
        if groups is not None:
            raise ValueError("split attention: a prologue reads every slot in one pass, not with groups")
        if d % 2:
            raise ValueError(f"split attention: the rotary prologue needs an even head size, not {d}")
        kn, vn = prologue.key, prologue.value
        if kn.stride(-1) != 1 or vn.stride(-1) != 1:
            kn, vn = kn.contiguous(), vn.contiguous()
        cos, sin = prologue.cos, prologue.sin
        if cos.stride(-1) != 1 or sin.stride(-1) != 1:
            cos, sin = cos.contiguous(), sin.contiguous()
        norm = prologue.q_weight is not None
        qw = prologue.q_weight if norm else q
        kw = prologue.k_weight if norm else q
        pro = (kn, vn, qw, kw, cos, sin)
        pro_strides = (kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1), cos.stride(0), sin.stride(0))
        pro_consts = {"PRO": 1, "NORM": int(norm), "EPS": float(prologue.eps), "HALF": d // 2}
    else:  # any pointers: PRO 0 reads none of them
        pro = (q, q, q, q, q, q)
        pro_strides = (0, 0, 0, 0, 0, 0)
        pro_consts = {"PRO": 0, "NORM": 0, "EPS": 0.0, "HALF": 1}
    # (pass, sequences an entry, splits): every filled slot at once, or the prompt's once an entry then the rest
    if groups is None:
        passes = [(0, 1, splits_for(b, kv, length, tuning))]
        rows, prefix = slot, slot  # any pointers: pass 0 reads neither
    else:
        rows, prefix = groups
        r = rows.shape[1]
        passes = [(1, r, splits_for(-(-b // r), kv, length, tuning)), (2, 1, splits_for(b, kv, length, tuning))]
    total = sum(p[2] for p in passes)
    o = torch.empty((b, h, total, d), dtype=torch.float32, device=query.device)
    lse = torch.empty((b, h, total), dtype=torch.float32, device=query.device)
    # the kernel merges the splits itself for one pass (not the prompt pass's two launches) when there are
    # counters enough for its (sequence, KV head) pairs
    fuse = tuning.fuse_merge and groups is None and b * kv <= COUNTER_SLOTS
    # unfused, the kernel never touches either: any pointer, one it only reads (not a buffer it writes, which
    # inductor, seeing it twice, might copy)
    final = torch.empty((b, h, 1, d), dtype=query.dtype, device=query.device) if fuse else slot
    tickets = counters(query.device) if fuse else slot
    block_d = max(16, pow2_at_least(d))
    # FastGenerator built it (kernel()); inside the compiled step dynamo then only looks a global up
    split = _KERNEL if _KERNEL is not None else kernel()
    # num_stages only where the tuning names one: the engine's launch stays the call it has always been
    stages = {} if tuning.num_stages is None else {"num_stages": tuning.num_stages}
    first = 0
    for kind_of_pass, r, splits in passes:
        block_h = max(MIN_BLOCK_H, pow2_at_least(r * g))
        split[(b * kv, splits)](
            q, key, value, m, slot, rows, prefix, o, lse, final, tickets, *pro,
            q.stride(0), q.stride(1), key.stride(0), key.stride(1), key.stride(2),
            value.stride(0), value.stride(1), value.stride(2), m.stride(0) if kind else 0, length, *pro_strides,
            SCALE=scale, KV=kv, G=g, SPLITS=splits, D=d, BLOCK_D=block_d, BLOCK_H=block_h, BLOCK=tuning.block_n,
            MASK=kind, ITERS=iters_for(length, splits, tuning), PASS=kind_of_pass, R=r, SPLIT0=first, TOTAL=total,
            FUSE=int(fuse), S_P2=pow2_at_least(total), INTERPRETED=_INTERPRETED, **pro_consts,
            num_warps=tuning.num_warps, **stages)
        first += splits
    return final if fuse else merge(o, lse, query.dtype)
