"""fastgen on a real GPU: the compiled (CUDA-graph) decode step must compute what eager generate computes, and the
graphs must see LoRA updates made between calls (the shadow is refreshed in place)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from rlstack.payload import fastgen  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _model():
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=32, vocab_size=512, tie_word_embeddings=True,
                                   max_position_embeddings=1024)
    with torch.device("cuda"):
        base = transformers.Qwen3ForCausalLM(cfg).float().eval()
    return peft.get_peft_model(base, peft.LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False))


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 512, (4, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :9] = 0
    ids[mask == 0] = 0
    return ids.cuda(), mask.cuda()


def _agreement(model, ids, mask, n):
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, n, do_sample=False, pad_token_id=0, compile=True)
    return ref, got


def test_compiled_greedy_matches_generate_and_follows_lora_updates() -> None:
    model = _model()
    model.eval()
    ids, mask = _inputs()
    ref, got = _agreement(model, ids, mask, 24)
    assert got.shape == ref.shape
    assert (ref == got).float().mean().item() > 0.98
    assert torch.equal(ref[:, :24], got[:, :24])  # the prompt is returned untouched
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn_like(p))
    ref2, got2 = _agreement(model, ids, mask, 24)
    assert not torch.equal(got, got2)  # the replayed graph saw the new adapter
    assert (ref2 == got2).float().mean().item() > 0.98
    assert fastgen.get_engine(model).compiles == 1  # same shape: one cache, one graph
