"""fastgen's fused projections (fuse_projections): the same tokens as generate, one GEMM per group in the compiled
decode step, the fused buffer refreshed with the adapter, and nothing fused where the shadow does not own the
weights."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from rlstack.payload import fastgen  # noqa: E402


def _qwen3(seed: int):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=True,
                                   max_position_embeddings=512)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def _llama(seed: int):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=1, vocab_size=300, max_position_embeddings=512)
    return transformers.LlamaForCausalLM(cfg).eval()


def _lora(model):
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear",
                                                      init_lora_weights=False)).eval()


def _prompts(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("build", [_qwen3, _llama])
def test_fused_greedy_matches_generate(build) -> None:
    model = _lora(build(1))
    ids, mask = _prompts(1)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 12, do_sample=False, pad_token_id=0, compile=False,
                           fuse_projections=True)
    engine = fastgen.get_engine(model)
    assert engine.fused_gemms_saved == 2 * (2 + 1)  # per layer: q/k/v -> 1 saves 2, gate/up -> 1 saves 1
    assert torch.equal(ref, got)


def test_fused_sampling_draws_the_same_tokens_as_unfused() -> None:
    """Same seed, same tokens: the fused GEMM computes each projection's columns from the same rows."""
    ids, mask = _prompts(2)
    outs = []
    for fuse in (False, True):
        model = _lora(_qwen3(2))
        g = torch.Generator().manual_seed(7)
        outs.append(fastgen.generate(model, ids, mask, 16, do_sample=True, top_k=50, top_p=0.9, pad_token_id=0,
                                     generator=g, compile=False, fuse_projections=fuse))
    assert torch.equal(outs[0], outs[1])


def test_the_fused_buffer_follows_lora_updates() -> None:
    """refresh() writes each merged weight into its rows of the group's buffer (views), so the next generation
    decodes the updated adapter through the one GEMM."""
    model = _lora(_qwen3(3))
    ids, mask = _prompts(3)
    before = fastgen.generate(model, ids, mask, 8, do_sample=False, pad_token_id=0, compile=False,
                              fuse_projections=True)
    with torch.no_grad():  # an optimizer step on the adapter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn_like(p) * 0.5)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 8, do_sample=False, pad_token_id=0)
    assert not torch.equal(before, got), "the update must change the tokens, or this test shows nothing"
    assert torch.equal(ref, got)
    attn = fastgen.get_engine(model).decoder.model.layers[0].self_attn
    fused = attn.q_proj.fused_weight
    assert fused.data_ptr() == attn.q_proj.weight.data_ptr()  # q's rows are the buffer's first
    src = model.base_model.model.model.layers[0].self_attn
    expect = torch.cat([src.q_proj.get_base_layer().weight + src.q_proj.get_delta_weight("default"),
                        src.k_proj.get_base_layer().weight + src.k_proj.get_delta_weight("default"),
                        src.v_proj.get_base_layer().weight + src.v_proj.get_delta_weight("default")])
    torch.testing.assert_close(fused, expect)


def test_the_compiled_decode_step_runs_one_gemm_per_group(monkeypatch) -> None:
    """What dynamo hands the compiler: 7 linear ops a layer unfused, 4 fused (qkv, o, gate_up, down), + lm_head;
    no graph break, and the slot emptied after the trace (no tensor kept outside the graph)."""
    linears: list[int] = []

    def count(gm, example_inputs):
        linears.append(sum(1 for n in gm.graph.nodes if n.op == "call_function" and "linear" in str(n.target)))
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=count))
    ids, mask = _prompts(4)
    got = {}
    for fuse in (False, True):
        torch._dynamo.reset()
        linears.clear()
        model = _lora(_qwen3(4))
        got[fuse] = fastgen.generate(model, ids, mask, 6, do_sample=False, pad_token_id=0, compile=True,
                                     fuse_projections=fuse)
        engine = fastgen.get_engine(model)
        assert engine.compile_error is None
        assert linears == [2 * (4 if fuse else 7) + 1], (fuse, linears)
    assert torch.equal(got[False], got[True])
    slot = engine.decoder.model.layers[0].self_attn.q_proj.slot
    assert slot.x is None and slot.y is None


def test_nothing_is_fused_where_the_shadow_shares_the_weights() -> None:
    """A plain model's shadow shares its weights with it: fusing would copy them, so nothing is fused."""
    model = _qwen3(5)
    ids, mask = _prompts(5)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 8, do_sample=False, pad_token_id=0, compile=False,
                           fuse_projections=True)
    assert fastgen.get_engine(model).fused_gemms_saved == 0
    assert torch.equal(ref, got)


def test_a_member_called_on_another_tensor_computes_its_own_rows() -> None:
    """The slot serves only the tensor the group's first member saw; any other input gets its own GEMM."""
    from rlstack.payload.fastgen import fused

    torch.manual_seed(6)
    parent = torch.nn.Module()
    parent.gate_proj = torch.nn.Linear(8, 5, bias=False)
    parent.up_proj = torch.nn.Linear(8, 3, bias=False)
    plain = {n: getattr(parent, n).weight.detach().clone() for n in ("gate_proj", "up_proj")}
    groups = fused.plan(parent, owned=lambda name: True)
    assert groups == [("", ("gate_proj", "up_proj"))]
    bufs, views = fused.allocate(parent, groups, torch.float32, "cpu")
    for name, view in views.items():
        view.copy_(plain[name])
        getattr(parent, name)._parameters["weight"] = torch.nn.Parameter(view, requires_grad=False)
    assert fused.install(parent, groups, bufs) == 1
    x, other = torch.randn(2, 8), torch.randn(2, 8)
    with torch.no_grad():
        assert torch.allclose(parent.gate_proj(x), x @ plain["gate_proj"].T)
        assert torch.allclose(parent.up_proj(other), other @ plain["up_proj"].T)  # not x's columns
        assert torch.allclose(parent.gate_proj(x), x @ plain["gate_proj"].T)
        assert torch.allclose(parent.up_proj(x), x @ plain["up_proj"].T)
    assert parent.gate_proj.slot.x is None  # the last member emptied the slot


def test_groups_with_a_bias_or_shared_weights_are_not_fused() -> None:
    from rlstack.payload.fastgen import fused

    parent = torch.nn.Module()
    parent.q_proj = torch.nn.Linear(8, 8, bias=True)
    parent.k_proj = torch.nn.Linear(8, 4, bias=True)
    parent.v_proj = torch.nn.Linear(8, 4, bias=True)
    parent.gate_proj = torch.nn.Linear(8, 6, bias=False)
    parent.up_proj = torch.nn.Linear(8, 6, bias=False)
    assert fused.plan(parent, owned=lambda name: True) == [("", ("gate_proj", "up_proj"))]
    assert fused.plan(parent, owned=lambda name: name != "up_proj") == []
