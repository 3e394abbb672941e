"""fastgen must compute exactly what transformers' generate computes (same tokens, same sampling distribution)."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from rlstack.payload import fastgen  # noqa: E402


def _tiny(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=True,
                                   max_position_embeddings=512)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def _prompts(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[1, :2] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_matches_generate_plain_model(seed: int) -> None:
    model = _tiny(seed)
    ids, mask = _prompts(seed)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 12, do_sample=False, pad_token_id=0, compile=False)
    assert torch.equal(ref, got)


@pytest.mark.parametrize("merge", [True, False])
def test_greedy_matches_generate_with_lora(merge: bool) -> None:
    model = peft.get_peft_model(_tiny(3), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(3)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 10, do_sample=False, pad_token_id=0, compile=False, merge_lora=merge)
    assert torch.equal(ref, got)


def test_shadow_follows_lora_updates_without_touching_base() -> None:
    model = peft.get_peft_model(_tiny(4), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    ids, mask = _prompts(4)
    fastgen.generate(model, ids, mask, 4, do_sample=False, pad_token_id=0, compile=False)
    with torch.no_grad():  # an optimizer step on the adapter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn_like(p) * 0.5)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 8, do_sample=False, pad_token_id=0)
    assert torch.equal(ref, got)
    for n, p in model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base_before[n]), n


def test_installed_hook_samples_like_trl_generate() -> None:
    """TRL's call: generate(**inputs, generation_config=gc, disable_compile=True), top_k=None -> 50 default."""
    model = peft.get_peft_model(_tiny(5), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    ids, mask = _prompts(5)
    gc = transformers.GenerationConfig(max_new_tokens=12, do_sample=True, temperature=0.9, top_p=0.95, top_k=None,
                                       pad_token_id=0, eos_token_id=5, min_new_tokens=3)
    torch.manual_seed(11)
    ref = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, disable_compile=True)
    fastgen.install(model, compile=False)
    assert fastgen.installed(model)
    torch.manual_seed(11)
    got = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, disable_compile=True)
    assert torch.equal(ref, got)
    sampling, max_new = fastgen.sampling_from_generation_config(gc, model)
    assert sampling.top_k == 50 and max_new == 12
    fastgen.uninstall(model)
    assert not fastgen.installed(model)


def test_eos_stops_and_pads_like_generate() -> None:
    model = _tiny(6)
    ids, mask = _prompts(6)
    first = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    eos = int(first[0, 9 + 2])  # make row 0's third greedy token the EOS
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0,
                         eos_token_id=eos)
    got = fastgen.generate(model, ids, mask, 20, do_sample=False, pad_token_id=0, eos_token_id=eos, compile=False)
    assert torch.equal(ref, got)


def test_unsupported_options_fall_back_to_generate() -> None:
    model = _tiny(7)
    ids, mask = _prompts(7)
    gc = transformers.GenerationConfig(max_new_tokens=5, do_sample=False, repetition_penalty=1.3, pad_token_id=0)
    with pytest.raises(fastgen.FastgenError, match="repetition_penalty"):
        fastgen.sampling_from_generation_config(gc, model)
    ref = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
    fastgen.install(model, compile=False)
    assert torch.equal(model.generate(input_ids=ids, attention_mask=mask, generation_config=gc), ref)


def test_right_padding_is_refused() -> None:
    model = _tiny(8)
    ids, mask = _prompts(8)
    with pytest.raises(fastgen.FastgenError, match="left-padded"):
        fastgen.generate(model, ids, mask.flip(1), 4, compile=False)


def test_import_does_not_load_torch() -> None:
    code = "import sys, rlstack.payload.fastgen; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gqa_decode_attention_matches_repeat_kv_sdpa() -> None:
    """The shadow's decode attention (grouped matmuls, no repeat_kv) equals transformers' sdpa path."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rlstack.payload.fastgen.engine import gqa_decode_attention

    g = torch.Generator().manual_seed(9)
    b, h, kv, d, length = 3, 8, 2, 16, 40
    q = torch.randn(b, h, 1, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, kv, length, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, kv, length, d, generator=g, dtype=torch.float64)
    mask = torch.ones(b, 1, 1, length, dtype=torch.bool)
    mask[0, ..., :7] = False
    mask[2, ..., 30:] = False

    class M(torch.nn.Module):
        num_key_value_groups = h // kv
        is_causal = True

    ref, _ = sdpa_attention_forward(M(), q, k, v, mask, scaling=0.25)
    got, _ = gqa_decode_attention(M(), q, k, v, mask, scaling=0.25)
    assert got.shape == ref.shape == (b, 1, h, d)
    assert torch.allclose(got, ref, atol=1e-10)
