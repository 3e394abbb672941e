"""fastgen's Triton kernel (fastgen.split_attention) in Triton's CPU interpreter. Not collected on its
own: tests/payload/test_fastgen_triton.py runs this file in a process started with TRITON_INTERPRET=1, because
``triton.jit`` decides at decoration, for triton.language's own helpers too, whether it compiles or interprets."""

from __future__ import annotations

import dataclasses
import os

import pytest

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/payload/test_fastgen_triton.py"

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from test_fastgen import _prompts, _tiny  # noqa: E402  (this folder is on the path, as pytest puts it)

from rlstack.payload import fastgen  # noqa: E402
from rlstack.payload.fastgen import split_attention, topk_draw  # noqa: E402
from rlstack.payload.fastgen.attention import gqa_decode_attention  # noqa: E402
from rlstack.payload.fastgen.keywords import SLOT_KWARG  # noqa: E402


class _Attn(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


@pytest.mark.parametrize(("b", "h", "kv", "d", "length", "slot"),
                         [(3, 8, 2, 16, 100, 70), (2, 4, 4, 32, 300, 299), (2, 32, 8, 128, 200, 0),
                          (1, 6, 2, 24, 130, 129)],
                         ids=["gqa4", "mha-last-slot", "qwen3-4b-heads-first-slot", "head-dim-24"])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_kernel_attends_as_the_matmul_kernel_and_reads_nothing_after_the_slot(
        b: int, h: int, kv: int, d: int, length: int, slot: int, mask_kind: str, dtype: torch.dtype) -> None:
    """The same output as the grouped matmuls over the slots up to ``slot`` (a left-padded row masked); the slots
    after it hold NaN, which the kernel must not read (the matmul reference gets zeros there, masked out)."""
    g = torch.Generator().manual_seed(b * 1000 + length)
    q = torch.randn(b, h, 1, d, generator=g).to(dtype)
    k = torch.randn(b, kv, length, d, generator=g).to(dtype)
    v = torch.randn(b, kv, length, d, generator=g).to(dtype)
    keep = torch.ones(b, 1, 1, length, dtype=torch.bool)
    keep[0, ..., : min(5, slot)] = False  # row 0 left-padded (never the slot itself)
    keep[..., slot + 1:] = False
    mask = {"bool": keep, "none": None,
            "additive": torch.zeros(b, 1, 1, length, dtype=dtype).masked_fill(~keep, float("-inf"))}[mask_kind]
    k_ref, v_ref = k.clone(), v.clone()
    k_ref[:, :, slot + 1:], v_ref[:, :, slot + 1:] = 0, 0
    bound = torch.ones_like(keep)
    bound[..., slot + 1:] = False
    ref_mask = bound if mask is None else mask  # the matmul kernel reads every slot: it needs them masked
    want, _ = gqa_decode_attention(_Attn(h // kv), q, k_ref, v_ref, ref_mask, scaling=0.3)
    k[:, :, slot + 1:], v[:, :, slot + 1:] = float("nan"), float("nan")
    got, _ = gqa_decode_attention(_Attn(h // kv), q, k, v, mask, scaling=0.3,
                                  **{SLOT_KWARG: torch.tensor([slot])})
    assert got.shape == want.shape == (b, 1, h, d) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 4e-2  # bf16: the output's own rounding (a few ulp near 1)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def _rotary_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor,
                      sin: torch.Tensor) -> torch.Tensor:
    """transformers' Qwen3RMSNorm then apply_rotary_pos_emb on x [B, N, D] with cos / sin [B, D], in x's dtype and
    rounded where its eager modules round (Llama's family: no norm where ``weight`` is None)."""
    from transformers.models.qwen3.modeling_qwen3 import rotate_half

    if weight is not None:
        f = x.float()
        x = weight * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


@pytest.mark.parametrize(("b", "h", "kv", "d", "length", "slot", "programs"),
                         [(3, 8, 2, 16, 100, 70, 64), (2, 32, 8, 128, 200, 0, 512), (2, 4, 4, 32, 300, 299, 8),
                          (1, 6, 2, 24, 130, 31, 512)],
                         ids=["gqa4-splits", "qwen3-4b-heads-first-slot", "mha-last-slot-one-split",
                              "head-dim-24-slot-ends-a-block"])
@pytest.mark.parametrize("norm", [True, False], ids=["qwen3-norms", "llama-no-norm"])
@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_rotary_prologue_normalizes_rotates_writes_and_attends_as_transformers_does(
        b: int, h: int, kv: int, d: int, length: int, slot: int, programs: int, norm: bool, mask_kind: str,
        dtype: torch.dtype) -> None:
    """fuse_rotary: given the projections' raw query, key and value, the kernel writes into the cache at the slot
    the key transformers' q/k norm and rotary make (and the raw value), and attends as the matmul kernel does
    over the cache as transformers' update leaves it; whatever split owns the slot (one split, several, the slot
    first or last in its split). The slots after it hold NaN, which it must not read."""
    g = torch.Generator().manual_seed(b * 7 + length)
    q = torch.randn(b, h, 1, d, generator=g).to(dtype)
    k_new, v_new = (torch.randn(b, kv, d, generator=g).to(dtype) for _ in range(2))
    k = torch.randn(b, kv, length, d, generator=g).to(dtype)
    v = torch.randn(b, kv, length, d, generator=g).to(dtype)
    qw = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype) if norm else None  # a weight that is not ones
    kw = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype) if norm else None
    angle = torch.rand(b, d // 2, generator=g) * 6.0
    cos, sin = torch.cat([angle.cos()] * 2, -1).to(dtype), torch.cat([angle.sin()] * 2, -1).to(dtype)
    keep = torch.ones(b, 1, 1, length, dtype=torch.bool)
    keep[0, ..., : min(5, slot)] = False
    keep[..., slot + 1:] = False
    mask = keep if mask_kind == "bool" else torch.zeros(b, 1, 1, length, dtype=dtype).masked_fill(~keep, -torch.inf)
    k_ref, v_ref = k.clone(), v.clone()
    k_ref[:, :, slot] = _rotary_reference(k_new, kw, 1e-6, cos, sin)
    v_ref[:, :, slot] = v_new
    k_ref[:, :, slot + 1:], v_ref[:, :, slot + 1:] = 0, 0
    q_ref = _rotary_reference(q[:, :, 0], qw, 1e-6, cos, sin)[:, :, None]
    want, _ = gqa_decode_attention(_Attn(h // kv), q_ref, k_ref, v_ref, mask, scaling=0.3)
    k[:, :, slot:], v[:, :, slot:] = float("nan"), float("nan")  # the slot itself too: the kernel writes it
    tuning = split_attention.Tuning(block_n=16, programs=programs)
    got = split_attention.attend(q, k, v, mask[:, 0, -1, :], torch.tensor([slot]), 0.3, tuning=tuning,
                                 prologue=split_attention.Prologue(k_new, v_new, qw, kw, 1e-6, cos, sin))
    assert got.shape == (b, h, 1, d) and got.dtype == dtype
    # bf16: one ulp where the kernel's float32 sum of squares rounds the other way than torch's mean
    ulp = 0.0 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(k[:, :, slot].float(), k_ref[:, :, slot].float(), rtol=ulp + 1e-6, atol=1e-5)
    assert torch.equal(v[:, :, slot], v_new)
    assert torch.isnan(k[:, :, slot + 1:]).all() and torch.equal(k[:, :, :slot], k_ref[:, :, :slot])
    tol = 1e-5 if dtype == torch.float32 else 4e-2
    torch.testing.assert_close(got.transpose(1, 2).float(), want.float(), rtol=tol, atol=tol)


def test_the_rotary_prologue_is_refused_with_groups_and_an_odd_head_size() -> None:
    q = torch.zeros(2, 4, 1, 15)
    k = torch.zeros(2, 2, 32, 15)
    new = torch.zeros(2, 2, 15)
    turn = torch.zeros(2, 15)
    pro = split_attention.Prologue(new, new, None, None, 1e-6, turn, turn)
    with pytest.raises(ValueError, match="even head size"):
        split_attention.attend(q, k, k, None, torch.tensor([3]), 0.3, prologue=pro)
    with pytest.raises(ValueError, match="not with groups"):
        split_attention.attend(q, k, k, None, torch.tensor([3]), 0.3, prologue=pro,
                               groups=(torch.zeros(2, 1, dtype=torch.int32), torch.tensor([2])))


@pytest.mark.parametrize(("h", "kv"), [(8, 2), (4, 4), (12, 2)], ids=["gqa4-four-a-read", "mha-16-a-read",
                                                                     "gqa6-two-a-read"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_prompt_read_once_a_group_attends_as_every_row_reading_its_own(h: int, kv: int,
                                                                         dtype: torch.dtype) -> None:
    """shared_prompt: rows 0-4 share a prompt (two entries where a read serves fewer than five, one where it
    serves 16), rows 5 and 6 have prompts of their own, left-padded differently. The prompt's slots of every row
    that is not the first of its entry hold NaN: the pass over the prompt must read only the entry's first row
    there, and its output equals every row attending over its own copy (the same values); the slots after
    `slot` hold NaN for every row, as in the test above."""
    b, d, length, prompt, slot = 7, 16, 100, 20, 50
    g = torch.Generator().manual_seed(h * 10 + kv)
    q = torch.randn(b, h, 1, d, generator=g).to(dtype)
    k = torch.randn(b, kv, length, d, generator=g).to(dtype)
    v = torch.randn(b, kv, length, d, generator=g).to(dtype)
    ids = torch.randint(3, 50, (b, prompt), generator=g)
    keep = torch.ones(b, length, dtype=torch.bool)
    keep[:5, :3] = False  # the shared prompt is left-padded by 3, row 6's by 7
    keep[6, :7] = False
    ids[1:5] = ids[0]
    k[1:5, :, :prompt], v[1:5, :, :prompt] = k[0, :, :prompt], v[0, :, :prompt]
    want = split_attention.attend(q, k, v, keep, torch.tensor([slot]), 0.3)
    per = split_attention.rows_per_entry(h // kv)
    entries = split_attention.prompt_groups(ids, keep[:, :prompt].long(), per)
    assert entries[0] == list(range(min(5, per))) and [5] in entries and [6] in entries
    firsts = {e[0] for e in entries}
    for row in range(b):
        if row not in firsts:
            k[row, :, :prompt], v[row, :, :prompt] = float("nan"), float("nan")
    k[:, :, slot + 1:], v[:, :, slot + 1:] = float("nan"), float("nan")
    table = torch.tensor(split_attention.entry_table(entries, b, per), dtype=torch.int32)
    got = split_attention.attend(q, k, v, keep, torch.tensor([slot]), 0.3, (table, torch.tensor([prompt])))
    tol = 1e-5 if dtype == torch.float32 else 4e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("tuning", [split_attention.Tuning(block_n=64, num_warps=4, programs=2048, num_stages=2),
                                    split_attention.Tuning(block_n=16, programs=64),
                                    split_attention.Tuning(block_n=16, programs=64, fuse_merge=True)],
                         ids=["wide", "narrow", "narrow-fused"])
def test_another_launch_shape_attends_as_the_default_one(tuning: split_attention.Tuning) -> None:
    """bench/attention_sweep.py times launch shapes other than the engine's: each must compute the same attention
    (more or fewer splits, other blocks), the slots after ``slot`` unread (NaN), with and without the prompt pass."""
    b, h, kv, d, length, slot, prompt = 5, 8, 2, 16, 200, 150, 40
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(b, n, m, d, generator=g).to(torch.bfloat16) for n, m in ((h, 1), (kv, length), (kv, length)))
    keep = torch.ones(b, length, dtype=torch.bool)
    keep[1, :4] = False
    want = split_attention.attend(q, k, v, keep, torch.tensor([slot]), 0.3)
    k[:, :, slot + 1:], v[:, :, slot + 1:] = float("nan"), float("nan")
    got = split_attention.attend(q, k, v, keep, torch.tensor([slot]), 0.3, tuning=tuning)
    torch.testing.assert_close(got.float(), want.float(), rtol=4e-2, atol=4e-2)
    table = torch.tensor(split_attention.entry_table([[0], [1], [2], [3], [4]], b, 4), dtype=torch.int32)
    grouped = split_attention.attend(q, k, v, keep, torch.tensor([slot]), 0.3, (table, torch.tensor([prompt])),
                                     tuning=tuning)
    torch.testing.assert_close(grouped.float(), want.float(), rtol=4e-2, atol=4e-2)


@pytest.mark.parametrize("programs", [64, 2], ids=["splits", "one-split"])
def test_the_kernel_merging_its_own_splits_attends_as_the_separate_merge_and_leaves_its_tickets_at_zero(
        programs: int) -> None:
    """fuse_merge: the last program of each (sequence, KV head) merges the splits (or one split stores the
    attention at once): the same attention as the kernel followed by merge_splits, within the float32 sums' order
    (a row with every slot masked gives zeros both ways), on every launch of a step, the ticket counters back at
    zero after each; attend does not call the separate merge then."""
    b, h, kv, d, length, slot = 5, 8, 2, 16, 200, 150
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(b, n, m, d, generator=g).to(torch.bfloat16) for n, m in ((h, 1), (kv, length), (kv, length)))
    keep = torch.ones(b, length, dtype=torch.bool)
    keep[1, :4] = False
    keep[3] = False
    apart = split_attention.Tuning(block_n=16, programs=programs)
    fused = dataclasses.replace(apart, fuse_merge=True)
    assert (split_attention.splits_for(b, kv, length, fused) == 1) is (programs == 2)
    want = split_attention.attend(q, k, v, keep, torch.tensor([slot]), 0.3, tuning=apart)

    def never(o, lse, dtype):
        raise AssertionError("merge_splits called while the kernel merges")

    for _ in range(3):  # the tickets of one launch must not carry into the next
        got = split_attention.attend(q, k, v, keep, torch.tensor([slot]), 0.3, tuning=fused, merge=never)
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
        assert not bool(got[3].any())
        assert not bool(split_attention.counters(q.device).any())


def _record_launches(monkeypatch: pytest.MonkeyPatch, *constexprs: str) -> list:
    """The real split kernel in the module's place, each launch's ``constexprs`` (a tuple) recorded in the
    returned list."""
    real, seen = split_attention.kernel(), []

    class Launches:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(tuple(kwargs[name] for name in constexprs))
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(split_attention, "_KERNEL", Launches())
    return seen


def test_fastgen_with_the_kernel_merging_its_own_splits_decodes_what_generate_decodes(monkeypatch) -> None:
    """The engine's attention launched with fuse_merge (as if it were TUNING): its ticket counters allocated
    when the engine is made, greedy tokens as generate's over a LoRA shadow, the counters at zero after."""
    monkeypatch.setattr(split_attention, "TUNING", split_attention.Tuning(block_n=16, programs=64, fuse_merge=True))
    model = peft.get_peft_model(_tiny(25), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(25)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    split_attention._COUNTERS.clear()
    engine = fastgen.FastGenerator(model, compile=False, decode_attention="triton")
    assert str(ids.device) in split_attention._COUNTERS  # made with the engine, not inside its step
    fused = _record_launches(monkeypatch, "FUSE")
    got = engine.generate(ids, mask, 12, fastgen.Sampling(do_sample=False, pad_token_id=0))
    assert torch.equal(ref, got)
    assert fused and set(fused) == {(1,)}  # every decode step's launches merged in the kernel
    assert not bool(split_attention.counters(ids.device).any())


def test_an_engine_launches_the_attention_with_its_own_tuning(monkeypatch) -> None:
    """attention_tuning: this engine's launch shape (here 16-slot blocks, merged in the kernel), every decode
    step's launch with it, generate's greedy tokens; said in describe()."""
    model = peft.get_peft_model(_tiny(26), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(26)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    engine = fastgen.FastGenerator(model, compile=False, decode_attention="triton",
                                   attention_tuning="16:8:64:default:fused")
    seen = _record_launches(monkeypatch, "BLOCK", "FUSE")
    got = engine.generate(ids, mask, 10, fastgen.Sampling(do_sample=False, pad_token_id=0))
    assert torch.equal(ref, got)
    assert seen and set(seen) == {(16, 1)}
    assert "triton decode attention (launch 16:8:64:default:fused)" in engine.describe()


def test_splits_fill_the_gpu_and_never_outnumber_the_cache_blocks() -> None:
    assert split_attention.splits_for(8, 8, 768) == 8  # 64 (sequence, KV head) pairs x 8 = 512 programs
    assert split_attention.splits_for(64, 8, 768) == 1
    assert split_attention.splits_for(1, 1, 100) == 4  # 100 slots are 4 blocks of 32
    assert split_attention.iters_for(768, 8) == 3 and split_attention.iters_for(100, 3) == 2  # 34 slots: 2 blocks


@pytest.mark.parametrize("options", [{}, {"attend_bucket": 16}], ids=["whole-cache", "attend16"])
def test_fastgen_with_the_triton_attention_decodes_what_generate_decodes(options: dict) -> None:
    """Greedy and seeded sampling through a LoRA shadow give generate's tokens, the attention reading the filled
    slots only (from the slot tensor the loop advances), alone or inside attend_bucket's read lengths."""
    model = peft.get_peft_model(_tiny(24), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(24)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 12, do_sample=False, pad_token_id=0, compile=False,
                           decode_attention="triton", **options)
    assert torch.equal(ref, got)
    engine = fastgen.get_engine(model)
    assert engine.decode_attention == "triton" and "triton decode attention" in engine.describe()
    torch.manual_seed(8)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=True, top_k=50,
                         pad_token_id=0)
    torch.manual_seed(8)
    assert torch.equal(ref, fastgen.generate(model, ids, mask, 12, do_sample=True, top_k=50, pad_token_id=0))


def _tiny_llama(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=True,
                                   max_position_embeddings=512)
    return transformers.LlamaForCausalLM(cfg).eval()


def _norms_off_ones(model: torch.nn.Module, seed: int) -> None:
    """q_norm / k_norm weights other than a new model's ones, so a kernel reading one weight for the other, or an
    element's for its rotary partner's, decodes other tokens."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                param.copy_(1 + 0.5 * torch.randn(param.shape, generator=g))


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_fastgen_with_the_rotary_in_the_kernel_decodes_and_caches_what_generate_does(family: str,
                                                                                     monkeypatch) -> None:
    """fuse_rotary through a LoRA shadow: every decode step's attention launched with the prologue, greedy and
    seeded tokens as generate's, and the cache it leaves (keys written by the kernel, the layers' write counters
    advanced by the engine) the cache transformers' own forward leaves in the engine without it."""
    base = _tiny(27) if family == "qwen3" else _tiny_llama(27)
    _norms_off_ones(base, 27)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(27)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    pro = _record_launches(monkeypatch, "PRO")
    fused = fastgen.FastGenerator(model, compile=False, decode_attention="triton", fuse_rotary=True)
    got = fused.generate(ids, mask, 12, fastgen.Sampling(do_sample=False, pad_token_id=0))
    assert torch.equal(ref, got)
    assert pro and set(pro) == {(1,)}  # every decode step's launch did the norms and the rotary
    assert "rotary and cache write in the attention kernel" in fused.describe()
    plain = fastgen.FastGenerator(model, compile=False, decode_attention="triton")
    assert torch.equal(plain.generate(ids, mask, 12, fastgen.Sampling(do_sample=False, pad_token_id=0)), got)
    (c_fused, _), (c_plain, _) = fused._caches[(3, 128)], plain._caches[(3, 128)]
    # float32: equal up to the attention's reduction order, which moves the next layer's inputs by float32 rounding;
    # how far depends on the CPU's kernels (a host with AMX lands just past 1e-6 on a near-zero key), so atol 1e-5,
    # still far below what a rotary at a wrong position or a cache write to a wrong slot changes
    for a, b in zip(c_fused.layers, c_plain.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)
        if hasattr(b, "cumulative_length"):  # the layers' write counters: transformers 5 (4.57 has none)
            assert torch.equal(a.cumulative_length, b.cumulative_length)
    assert torch.equal(c_fused.layers[0].values, c_plain.layers[0].values)  # layer 0's inputs are the same bits
    torch.manual_seed(8)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=True, top_k=50,
                         pad_token_id=0)
    torch.manual_seed(8)
    assert torch.equal(ref, fused.generate(ids, mask, 12, fastgen.Sampling(do_sample=True, top_k=50,
                                                                           pad_token_id=0)))


@pytest.mark.parametrize("options", [{}, {"attend_bucket": 16}], ids=["whole-cache", "attend16"])
def test_fastgen_reading_each_prompt_once_decodes_what_generate_decodes(options: dict) -> None:
    """shared_prompt through a LoRA shadow on GRPO's shape (each prompt G times: two prompts x 3, then distinct
    prompts): generate's greedy and seeded tokens, the loop's table naming the groups; alone or inside
    attend_bucket's read lengths."""
    model = peft.get_peft_model(_tiny(25), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(25)
    grpo_ids, grpo_mask = ids[[0, 0, 0, 2, 2, 2]], mask[[0, 0, 0, 2, 2, 2]]
    for i, m in ((grpo_ids, grpo_mask), (ids, mask)):
        ref = model.generate(input_ids=i, attention_mask=m, max_new_tokens=10, do_sample=False, pad_token_id=0)
        got = fastgen.generate(model, i, m, 10, do_sample=False, pad_token_id=0, compile=False,
                               decode_attention="triton", shared_prompt=True, **options)
        assert torch.equal(ref, got)
        torch.manual_seed(9)
        ref = model.generate(input_ids=i, attention_mask=m, max_new_tokens=10, do_sample=True, top_k=50,
                             pad_token_id=0)
        torch.manual_seed(9)
        assert torch.equal(ref, fastgen.generate(model, i, m, 10, do_sample=True, top_k=50, pad_token_id=0))
    engine = fastgen.get_engine(model)
    assert engine.shared_prompt and "the prompt read once a group" in engine.describe()
    loop = engine._loops[(6, 128)]
    assert loop.entries.tolist()[:2] == [[0, 1, 2, -1, -1, -1, -1, -1], [3, 4, 5, -1, -1, -1, -1, -1]]


@pytest.mark.parametrize("scales", ["row", "tensor"])
def test_fp8_projections_with_the_triton_attention_decode_what_fp8_alone_decodes(scales: str) -> None:
    """The profile's combined variants (fp8 with the triton attention and shared_prompt): the attention kernel
    changes nothing the FP8 projections compute (float32 model, LoRA shadow, GRPO's shape), greedy and seeded."""
    model = peft.get_peft_model(_tiny(26), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(26)
    ids, mask = ids[[1, 1, 1, 0]], mask[[1, 1, 1, 0]]
    for sample in ({"do_sample": False}, {"do_sample": True, "top_k": 50}):
        torch.manual_seed(4)
        alone = fastgen.generate(model, ids, mask, 10, pad_token_id=0, compile=False, fp8=scales, **sample)
        fastgen.release(model)
        torch.manual_seed(4)
        both = fastgen.generate(model, ids, mask, 10, pad_token_id=0, compile=False, fp8=scales,
                                decode_attention="triton", shared_prompt=True, **sample)
        fastgen.release(model)
        assert torch.equal(alone, both), sample


def _reference_draw(logits: torch.Tensor, top_k: int, temperature: float, seed: torch.Tensor,
                    step: torch.Tensor) -> torch.Tensor:
    """What topk_draw.draw must return: transformers' own TopK warper (after the temperature as torch multiplies
    it in on CUDA), then the Gumbel-max over the kept logits with the kernels' own noise (topk_draw.noise)."""
    scores = logits.float()
    if temperature != 1.0:
        scores = scores * topk_draw.inverse_temperature(temperature)
    scores = transformers.TopKLogitsWarper(top_k)(None, scores)
    return (scores - topk_draw.noise(seed, step, *scores.shape)).argmax(-1)


@pytest.mark.parametrize(("batch", "vocab", "top_k", "temperature", "kind"),
                         [(3, 300, 5, 1.0, "normal"), (2, 600, 50, 0.7, "normal"), (3, 257, 16, 1.3, "bf16-ties"),
                          (2, 300, 1, 1.0, "normal"), (2, 500, 128, 1.0, "strided"), (3, 300, 5, 1.0, "signed-zeros")],
                         ids=["k5", "k50-t0.7", "bf16-ties-odd-vocab", "k1", "k128-strided-rows", "signed-zeros"])
def test_the_top_k_draw_is_the_gumbel_max_over_transformers_top_k(batch: int, vocab: int, top_k: int,
                                                                  temperature: float, kind: str) -> None:
    """The kernels' token is the argmax of the kept logits minus their noise, the kept ones being exactly what
    transformers' TopKLogitsWarper keeps (bf16-rounded logits: many ties at the k-th value, all kept; -0.0 kept
    beside a k-th value of 0.0), for rows the logits' own stride apart too; at two steps (the noise moves with
    the step), and at another launch shape (fewer, wider chunks; 4 warps)."""
    g = torch.Generator().manual_seed(vocab + top_k)
    logits = torch.randn(batch, vocab + (7 if kind == "strided" else 0), generator=g) * 3
    if kind == "bf16-ties":
        logits = logits.to(torch.bfloat16).float()
    if kind == "signed-zeros":  # 10 tokens at 0.0 and 10 at -0.0 above every other: all 20 kept at top_k 5
        logits = -logits.abs() - 1
        logits[:, :10], logits[:, 10:20] = 0.0, -0.0
    logits = logits[:, :vocab]
    seed = torch.tensor([vocab * 7919 + top_k])
    for k in (0, 37):
        step = torch.tensor([k])
        invalid = torch.zeros(batch, dtype=torch.bool)
        got = topk_draw.draw(logits, top_k, temperature, seed, step, invalid)
        assert got.tolist() == _reference_draw(logits, top_k, temperature, seed, step).tolist()
        assert not invalid.any()
    # another launch shape (the profile times several): fewer, wider chunks, 4 warps; the same token
    assert topk_draw.draw(logits, top_k, temperature, seed, step, invalid, target_chunks=4, num_warps=4).tolist() \
        == got.tolist()


def test_ties_past_a_chunks_candidates_are_all_drawn_from() -> None:
    """A row whose k-th value is tied by more tokens than a chunk keeps as candidates (transformers keeps every
    tie): the kernel reads the row again, and its draws reach the tied tokens past the candidates, as the
    reference's do. (Chunks of 128 for a 400-token vocabulary, so that a chunk drops some of its 96 ties.)"""
    vocab, top_k = 400, 5
    plan = topk_draw.Plan.make(vocab, top_k, target_chunks=4)
    assert (plan.kp, plan.width, plan.chunks) == (16, 128, 4)
    logits = torch.full((3, vocab), float("-inf"))
    logits[:, 32:132] = 2.0  # 100 equal logits: 96 in the first chunk, which keeps 16 of them as candidates
    logits[1, 200] = 3.0
    seed = torch.tensor([11])
    seen: set[int] = set()
    for k in range(12):
        step = torch.tensor([k])
        got = topk_draw.draw(logits, top_k, 1.0, seed, step, torch.zeros(3, dtype=torch.bool), target_chunks=4)
        assert got.tolist() == _reference_draw(logits, top_k, 1.0, seed, step).tolist()
        seen.update(got.tolist())
    assert len(seen & set(range(32, 132))) > 20  # more than the 16 + 4 candidates the two chunks keep


def test_the_noise_makes_the_draw_a_sample_of_the_kept_softmax() -> None:
    """The draw is exactly the Gumbel-max over the kernels' noise (the tests above), so its distribution is the
    noise's: drawn that way for 4,000 rows of one row's logits, every top-k token and no other is drawn, the
    frequencies match softmax(logits / T) over the top k to a total variation under 0.05 (a draw ignoring the
    temperature is 0.12 away), and the noise of two steps is uncorrelated. (The noise of one 160,000-token row
    stands in for 4,000 rows of 40: the same Philox numbers at other counters, in 157 interpreted programs.)"""
    vocab, top_k, temperature, batch = 40, 10, 0.5, 4000
    row = torch.linspace(-2.0, 2.0, vocab)[torch.randperm(vocab, generator=torch.Generator().manual_seed(0))]
    seed = torch.tensor([2026])
    kept_logits = transformers.TopKLogitsWarper(top_k)(None, row[None] * topk_draw.inverse_temperature(temperature))
    got = (kept_logits - topk_draw.noise(seed, torch.tensor([3]), 1, batch * vocab).view(batch, vocab)).argmax(-1)
    counts = torch.bincount(got, minlength=vocab).float()
    kept = row >= row.topk(top_k).values[-1]
    want = torch.where(kept, row / temperature, float("-inf")).softmax(-1)
    assert counts[~kept].sum() == 0 and bool((counts[kept] > 0).all())
    assert 0.5 * (counts / counts.sum() - want).abs().sum() < 0.05
    a, b = (topk_draw.noise(seed, torch.tensor([k]), 1, 20000).flatten() for k in (3, 4))
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.03


def test_rows_that_are_not_a_distribution_are_marked_invalid() -> None:
    """As engine._draw marks them: a NaN or +inf logit, or no finite one; a row already marked stays marked."""
    logits = torch.randn(5, 300)
    logits[1, 7] = float("nan")
    logits[2, 9] = float("inf")
    logits[3] = float("-inf")
    invalid = torch.tensor([False, False, False, False, True])
    topk_draw.draw(logits, 20, 1.0, torch.tensor([1]), torch.tensor([0]), invalid)
    assert invalid.tolist() == [False, True, True, True, True]


def test_fastgen_draws_top_k_in_the_kernels_repeatably_and_only_among_the_top_k(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """draw="triton" through a LoRA shadow: every sampled token is among its step's top k (the logits the engine
    computed, on_logits), the same torch seed gives the same tokens and another seed others; a sampling the
    kernels do not draw (top-p) is drawn in torch, saying why: generate's own seeded tokens."""
    monkeypatch.setattr(topk_draw, "TARGET_CHUNKS", 2)  # 2 chunks of 256: few programs for the interpreter
    model = peft.get_peft_model(_tiny(27), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(27)
    engine = fastgen.FastGenerator(model, compile=False, draw="triton")
    sampling = fastgen.Sampling(top_k=5, temperature=0.9, pad_token_id=0)
    steps: list[torch.Tensor] = []
    torch.manual_seed(3)
    first = engine.generate(ids, mask, 6, sampling, on_logits=lambda k, logits: steps.append(logits.clone()))
    tokens = first[:, ids.shape[1]:]
    for k, logits in enumerate(steps):
        top = logits.topk(5, dim=-1).values[:, -1:]
        assert bool((logits.gather(1, tokens[:, k:k + 1]) >= top).all()), k
    torch.manual_seed(3)
    assert torch.equal(engine.generate(ids, mask, 6, sampling), first)
    torch.manual_seed(4)
    assert not torch.equal(engine.generate(ids, mask, 6, sampling), first)
    assert engine.draw_why is None and engine.draw_error is None and "top-k draw in Triton" in engine.describe()
    torch.manual_seed(5)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=True, top_k=50, top_p=0.9,
                         pad_token_id=0)
    torch.manual_seed(5)
    got = engine.generate(ids, mask, 10, fastgen.Sampling(top_k=50, top_p=0.9, pad_token_id=0))
    assert engine.draw_why == "top-p / min-p sampling" and torch.equal(ref, got)


def test_the_kernels_bookkeeping_finishes_rows_at_eos_and_pads_as_generate_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """top_k=1 makes the draw the argmax, so draw="triton" must give greedy generate's tokens exactly, through the
    bookkeeping the row program does (a finished row padded, EOS among two ids ending a row, min_new_tokens
    holding EOS back, the token buffer and positions): generate's own output with the same EOS rules."""
    monkeypatch.setattr(topk_draw, "TARGET_CHUNKS", 2)
    model = _tiny(29)
    ids, mask = _prompts(29)
    plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                           pad_token_id=0)[:, ids.shape[1]:]
    early = set(plain[:, :2].flatten().tolist())
    late = [t for t in plain[:, 2:].flatten().tolist() if t not in early and t != 0]
    assert late, plain  # a token a row reaches after min_new_tokens (a fixed seed: the scenario is pinned)
    eos = (late[0], int(plain[0, 0]))  # the second: row 0's first greedy token, which min_new_tokens holds back
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                         eos_token_id=list(eos), min_new_tokens=2)
    engine = fastgen.FastGenerator(model, compile=False, draw="triton")
    got = engine.generate(ids, mask, 12, fastgen.Sampling(top_k=1, eos_token_ids=eos, min_new_tokens=2,
                                                          pad_token_id=0))
    assert engine.draw_why is None and engine._draw_ok
    assert torch.equal(ref, got)
    assert (got[:, -1] == 0).any()  # a row ended at an EOS and was padded after it (the test is about that)


def test_a_failing_first_launch_draws_in_torch_from_then_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any exception of the kernels' first launch is kept (draw_error), said once, and the torch draw serves that
    pick and every later one: the kernels are not tried again."""
    model = _tiny(28)
    ids, mask = _prompts(28)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(topk_draw, "draw", broken)
    engine = fastgen.FastGenerator(model, compile=False, draw="triton")
    sampling = fastgen.Sampling(top_k=5, pad_token_id=0)
    for _ in range(2):
        out = engine.generate(ids, mask, 6, sampling)
        assert out.shape == (3, ids.shape[1] + 6)
    assert calls == [1] and "ptxas died" in (engine.draw_error or "")
    assert "top-k draw in torch (the Triton kernels failed)" in engine.describe()
