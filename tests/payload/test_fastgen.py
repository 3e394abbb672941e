"""fastgen must compute exactly what transformers' generate computes (same tokens, same sampling distribution)."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from rlstack.payload import fastgen  # noqa: E402

_TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5


def _tiny(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=True,
                                   max_position_embeddings=512)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def _adapter_step(model) -> None:
    """What an optimizer step does to the adapter between two generations: lora_B moves (the base does not)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn_like(p) * 0.5)


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
    _adapter_step(model)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 8, do_sample=False, pad_token_id=0)
    assert torch.equal(ref, got)
    for n, p in model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base_before[n]), n


def test_a_model_wrapped_by_lora_after_fastgen_ran_gets_its_own_engine() -> None:
    """PeftModel forwards unknown attributes to the model it wraps: the bare base's engine must not serve the
    wrapped model (it decoded without the adapter: `rlstack eval --fastgen` of the base, then of an adapter)."""
    base = _tiny(5)
    ids, mask = _prompts(5)
    before = fastgen.generate(base, ids, mask, 8, do_sample=False, pad_token_id=0, compile=False)
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    wrapped.eval()
    with torch.no_grad():  # an adapter strong enough to change the greedy tokens
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 1.0)
    assert fastgen.get_engine(wrapped) is not fastgen.get_engine(base)
    ref = wrapped.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    got = fastgen.generate(wrapped, ids, mask, 8, do_sample=False, pad_token_id=0, compile=False)
    assert not torch.equal(ref, before), "the adapter must change the tokens, or this test shows nothing"
    assert torch.equal(ref, got)


def test_on_logits_sees_what_each_step_sampled_from() -> None:
    """The observation hook of bench/fastgen_fidelity.py: each step's logits, before sampling, are the ones the
    token came from and the ones the model's own teacher-forced forward gives at that position."""
    model = peft.get_peft_model(_tiny(6), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(6)
    seen: list[torch.Tensor] = []
    engine = fastgen.get_engine(model, compile=False)
    out = engine.generate(ids, mask, 6, fastgen.Sampling(do_sample=False, pad_token_id=0),
                          on_logits=lambda k, logits: seen.append(logits.clone()))
    assert len(seen) == 6 and all(t.dtype == torch.float32 and t.shape == (3, 300) for t in seen)
    P = ids.shape[1]
    assert torch.equal(torch.stack([t.argmax(-1) for t in seen], 1), out[:, P:])
    full = torch.cat([mask, torch.ones_like(out[:, P:])], 1)
    pos = (full.long().cumsum(-1) - 1).masked_fill(full == 0, 1)
    with torch.no_grad():
        ref = model(input_ids=out, attention_mask=full, position_ids=pos).logits.float()[:, P - 1:-1]
    torch.testing.assert_close(torch.stack(seen, 1), ref, rtol=1e-4, atol=1e-4)


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
    # transformers 5 fills TRL's top_k=None from its global defaults (50); 4.57 keeps None (no top-k warper)
    assert sampling.top_k == (50 if _TRANSFORMERS_5 else None) and max_new == 12
    fastgen.uninstall(model)
    assert not fastgen.installed(model)


def test_the_hook_says_once_how_it_serves(capsys) -> None:
    """A training log must say which path its rollouts took: one line after the first served call, naming the
    shadow and whether the projections were fused (the default), and none on later calls."""
    model = peft.get_peft_model(_tiny(5), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    ids, mask = _prompts(5)
    fastgen.install(model, compile=False)
    for _ in range(2):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("rlstack fastgen: generating with")]
    saved = fastgen.get_engine(model).fused_gemms_saved
    assert saved > 0 and len(lines) == 1
    assert "shadow, LoRA merged" in lines[0] and f"fused projections ({saved} GEMMs fewer a step)" in lines[0]
    assert "eager (compile off)" in lines[0]
    fastgen.uninstall(model)


def test_eos_stops_and_pads_like_generate() -> None:
    model = _tiny(6)
    ids, mask = _prompts(6)
    first = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    eos = int(first[0, 9 + 2])  # make row 0's third greedy token the EOS
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0,
                         eos_token_id=eos)
    got = fastgen.generate(model, ids, mask, 20, do_sample=False, pad_token_id=0, eos_token_id=eos, compile=False)
    assert torch.equal(ref, got)


def test_min_new_tokens_masks_eos_like_generate_then_lets_it_stop() -> None:
    """EOS is every row's first greedy choice: generate masks it for min_new_tokens steps and then stops; fastgen's
    mask takes the step as a device tensor (what a CUDA graph holds), and must agree with it step for step."""
    model = _tiny(6)
    ids, mask = _prompts(6)
    first = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=0)
    eos = int(first[0, 9])
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=eos, min_new_tokens=4)
    ref = model.generate(input_ids=ids, attention_mask=mask, **kw)
    got = fastgen.generate(model, ids, mask, compile=False, **kw)
    assert torch.equal(ref, got)
    assert int(got[0, 9 + 4 - 1]) != eos  # masked up to the fourth token


def test_the_device_tensor_eos_mask_equals_the_step_by_step_one() -> None:
    from rlstack.payload.fastgen.sampling import Sampling, _mask_eos_before_min

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(4))
    sampling = Sampling(eos_token_ids=(7, 11), min_new_tokens=3)
    eos = torch.tensor([7, 11])
    for step in range(6):
        want = logits.clone()
        if step < 3:
            want[:, [7, 11]] = float("-inf")
        got = _mask_eos_before_min(logits, sampling, torch.tensor([step]), eos)
        assert torch.equal(got, want), step
    assert _mask_eos_before_min(logits, Sampling(eos_token_ids=(7,)), torch.tensor([0]), eos) is logits


def test_logits_that_are_not_a_distribution_raise_like_generate() -> None:
    """multinomial refuses NaN probabilities; fastgen's draw has no host check inside the loop (a CUDA graph
    cannot hold one), so it marks the row and raises once at the end, naming it (the hook then falls back)."""
    model = _tiny(8)
    ids, mask = _prompts(8)
    with torch.no_grad():
        model.lm_head.weight[3].fill_(float("nan"))  # tied: token 3's embedding and its logit
    with pytest.raises(fastgen.FastgenError, match="not a distribution"):
        fastgen.generate(model, ids, mask, 4, do_sample=True, pad_token_id=0, compile=False)


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


@pytest.mark.parametrize(("mask_kind", "read"), [("bool", None), ("additive", None), ("none", None),
                                                ("bool", 32)])
def test_gqa_decode_attention_matches_repeat_kv_sdpa(mask_kind: str, read: int | None) -> None:
    """The shadow's decode attention (grouped matmuls, no repeat_kv) equals transformers' sdpa path: with a
    boolean (keep) or additive padding mask, or none; and reading only the first ``read`` slots (attend_bucket)
    equals attending over all of them with the rest masked out."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rlstack.payload.fastgen.attention import gqa_decode_attention
    from rlstack.payload.fastgen.keywords import READ_KWARG

    g = torch.Generator().manual_seed(9)
    b, h, kv, d, length = 3, 8, 2, 16, 40
    q = torch.randn(b, h, 1, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, kv, length, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, kv, length, d, generator=g, dtype=torch.float64)
    keep = torch.ones(b, 1, 1, length, dtype=torch.bool)
    keep[0, ..., :7] = False
    keep[2, ..., 30:] = False
    if read is not None:
        keep[..., read:] = False  # what the engine guarantees: the slots after the read length hold no keys yet
    mask = {"bool": keep, "none": None,
            "additive": torch.zeros(b, 1, 1, length, dtype=torch.float64).masked_fill(~keep, float("-inf"))}[mask_kind]

    class M(torch.nn.Module):
        num_key_value_groups = h // kv
        is_causal = True

    ref, _ = sdpa_attention_forward(M(), q, k, v, mask, scaling=0.25)
    extra = {READ_KWARG: read} if read is not None else {}
    got, _ = gqa_decode_attention(M(), q, k, v, mask, scaling=0.25, **extra)
    assert got.shape == ref.shape == (b, 1, h, d)
    assert torch.allclose(got, ref, atol=1e-10)


# --- generation configs: resolved as the installed transformers' generate resolves them -------------------------


def _qwen3_hub_generation_config(model) -> None:
    """The sampling defaults Qwen3 checkpoints ship in generation_config.json (Qwen/Qwen3-4B)."""
    model.generation_config.do_sample = True
    model.generation_config.temperature = 0.6
    model.generation_config.top_k = 20
    model.generation_config.top_p = 0.95


def _trl_generation_config(max_new_tokens: int, **extra):
    """GenerationConfig as TRL 0.24's GRPOTrainer builds it (use_vllm=False)."""
    kw = dict(max_new_tokens=max_new_tokens, do_sample=True, pad_token_id=0, bos_token_id=None, eos_token_id=5,
              temperature=1.0, top_p=1.0, top_k=None, min_p=None, repetition_penalty=1.0, cache_implementation=None)
    kw.update(extra)
    return transformers.GenerationConfig(**kw)


def test_trl_config_keeps_max_new_tokens_over_a_model_config_without_it() -> None:
    """The transformers 4.57.6 failure ('fastgen needs max_new_tokens'): the model's own generation config (no
    max_new_tokens) was written over TRL's. Whatever the version, TRL's value must win."""
    model = _tiny(12)
    assert model.generation_config.max_new_tokens is None
    sampling, max_new = fastgen.sampling_from_generation_config(_trl_generation_config(33), model)
    assert max_new == 33 and sampling.eos_token_ids == (5,) and sampling.do_sample
    # without a model (no _prepare_generation_config to ask), only None fields are filled
    _, max_new = fastgen.sampling_from_generation_config(_trl_generation_config(21), None)
    assert max_new == 21


def test_model_sampling_defaults_resolve_like_generate_and_sample_the_same_tokens() -> None:
    """A model whose generation_config carries sampling defaults (as Qwen3's does) under TRL's config: the two
    transformers lines resolve it differently, and fastgen must follow the installed one, token for token."""
    model = peft.get_peft_model(_tiny(13), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    _qwen3_hub_generation_config(model.get_base_model())
    ids, mask = _prompts(13)
    gc = _trl_generation_config(10)
    resolved = fastgen.resolve_generation_config(gc, model)
    if _TRANSFORMERS_5:  # caller's None fields take the model's values; set ones stay
        assert (resolved.temperature, resolved.top_k, resolved.top_p) == (1.0, 20, 1.0)
    else:  # 4.57: caller's values equal to the global default take the model's; None stays None
        assert (resolved.temperature, resolved.top_k, resolved.top_p) == (0.6, None, 0.95)
    assert resolved.max_new_tokens == 10
    torch.manual_seed(3)
    ref = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, disable_compile=True)
    fastgen.install(model, compile=False)
    torch.manual_seed(3)
    got = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, disable_compile=True)
    assert fastgen.failure(model) is None
    assert torch.equal(ref, got)


def test_generate_keyword_arguments_without_a_config() -> None:
    """model.generate(input_ids=..., max_new_tokens=..., do_sample=False): plain kwargs, no generation_config."""
    model = _tiny(14)
    ids, mask = _prompts(14)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=7, do_sample=False, pad_token_id=0)
    fastgen.install(model, compile=False)
    got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=7, do_sample=False, pad_token_id=0)
    assert fastgen.failure(model) is None and fastgen.get_engine(model).decoder is not None
    assert torch.equal(ref, got)


def test_top_k_zero_means_no_top_k_as_in_transformers() -> None:
    """fastgen.generate(top_k=0): no top-k, as transformers' TopK reads 0 (it asked torch.topk for 0 values)."""
    model = _tiny(15)
    ids, mask = _prompts(15)
    torch.manual_seed(2)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=9, do_sample=True, top_k=0,
                         pad_token_id=0)
    torch.manual_seed(2)
    got = fastgen.generate(model, ids, mask, 9, do_sample=True, top_k=0, pad_token_id=0, compile=False)
    assert torch.equal(ref, got)


def test_unpatched_modeling_modules_are_not_reported_as_patched() -> None:
    """transformers decorates its own classes (hub kernels replace __init__): that is not a patch, and the shadow
    keeps using the live classes on the transformers path."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3

    from rlstack.payload.fastgen.shadow import patched_members, shadow_class

    assert patched_members(modeling_qwen3) == [] and patched_members(modeling_llama) == []
    assert shadow_class(transformers.Qwen3ForCausalLM) == (transformers.Qwen3ForCausalLM, [])


def test_pristine_copy_computes_the_same_tokens() -> None:
    """The shadow built from a fresh execution of the modeling module (what the Unsloth path uses) is the same
    function as the live classes."""
    model = peft.get_peft_model(_tiny(15), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(15)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=9, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 9, do_sample=False, pad_token_id=0, compile=False, pristine=True)
    engine = fastgen.get_engine(model)
    assert type(engine.decoder).__module__.endswith("_rlstack_fastgen_pristine_modeling_qwen3")
    assert type(engine.decoder) is not transformers.Qwen3ForCausalLM
    assert torch.equal(ref, got)


# --- fallback, once ----------------------------------------------------------------------------------------------


def test_any_exception_falls_back_once_for_the_rest_of_the_run(monkeypatch, capsys) -> None:
    """A non-FastgenError failure inside the fast path (here: the engine's generate raising RuntimeError) must not
    reach the trainer: this call and every later one use the original generate, the reason is printed once, and
    the fast path is not tried again."""
    model = _tiny(16)
    ids, mask = _prompts(16)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    calls = []

    def broken(self, *a, **k):
        calls.append(1)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(fastgen.FastGenerator, "generate", broken)
    fastgen.install(model, compile=False)
    for _ in range(3):
        got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(ref, got)
    assert len(calls) == 1
    assert "RuntimeError: CUDA error: an illegal memory access" in (fastgen.failure(model) or "")
    err = capsys.readouterr().err
    assert err.count("rlstack fastgen: falling back") == 1 and "illegal memory access" in err
    assert "_rlstack_fastgen_engine" not in vars(model)  # the engine (and its GPU memory) is dropped
    fastgen.uninstall(model)
    assert fastgen.failure(model) is None


def test_a_shadow_that_cannot_be_built_is_not_rebuilt_every_step(monkeypatch) -> None:
    """Before: get_engine stored nothing when the build failed, so every GRPO step rebuilt it and failed again."""
    from rlstack.payload.fastgen import shadow as shadow_mod

    model = peft.get_peft_model(_tiny(17), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    ids, mask = _prompts(17)
    builds = []

    def failing_init(self, *a, **k):
        builds.append(1)
        raise shadow_mod.FastgenError("fastgen: cannot map module model.foo of the shadow model", "")

    monkeypatch.setattr(shadow_mod._Shadow, "__init__", failing_init)
    fastgen.install(model, compile=False)
    gc = _trl_generation_config(4)
    for _ in range(3):
        torch.manual_seed(0)
        model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, disable_compile=True)
    assert len(builds) == 1
    assert "cannot map module" in (fastgen.failure(model) or "")


# --- memory check ------------------------------------------------------------------------------------------------


def _fake_gpu(monkeypatch, free: int, reserved: int = 0, allocated: int = 0) -> list[object]:
    seen: list[object] = []

    def mem_get_info(device=None):
        seen.append(device)
        return free, 80 * 2**30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)
    return seen


def _new_bytes(model, engine) -> tuple[int, int]:
    """(shadow parameter bytes not shared with the trained model, StaticCache bytes): what fastgen allocated."""
    trained = {t.data_ptr() for t in model.parameters()}
    seen, shadow = set(), 0
    for p in engine.decoder.parameters():
        if p.data_ptr() not in trained and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            shadow += p.numel() * p.element_size()
    kv = 0
    for cache, _mask in engine._caches.values():
        for layer in cache.layers:
            for t in (layer.keys, layer.values):
                kv += t.numel() * t.element_size()
    return shadow, kv


def test_memory_estimate_equals_what_fastgen_allocates(monkeypatch) -> None:
    """The plan's shadow and KV bytes are the bytes the shadow and the StaticCache then hold (float32 model with an
    fp64 norm, so a cast copy is counted too)."""
    base = _tiny(18)
    base.model.norm.double()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    ids, mask = _prompts(18)
    seen = _fake_gpu(monkeypatch, free=64 * 2**30)
    engine = fastgen.get_engine(model, compile=False, memory_check=True)
    engine.generate(ids, mask, 5, fastgen.Sampling(do_sample=False))
    plan = engine.last_plan
    assert plan is not None and seen, "the check asked torch.cuda.mem_get_info"
    assert (plan.batch, plan.length) == (3, 128)
    shadow, kv = _new_bytes(model, engine)
    assert plan.shadow == shadow > 0
    assert plan.kv == kv > 0


def test_memory_refusal_names_the_numbers_and_builds_nothing(monkeypatch) -> None:
    model = peft.get_peft_model(_tiny(19), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    ids, mask = _prompts(19)
    _fake_gpu(monkeypatch, free=100 * 2**20, reserved=300 * 2**20, allocated=200 * 2**20)
    engine = fastgen.get_engine(model, compile=False, memory_check=True)
    with pytest.raises(fastgen.FastgenMemoryError) as info:
        engine.generate(ids, mask, 5, fastgen.Sampling(do_sample=False))
    msg = info.value.message
    assert "not enough free GPU memory" in msg and "KV cache" in msg and "3 x 128 tokens" in msg
    assert "device free 0.10" in msg and "cached by torch 0.10" in msg and "usable 0.20 GiB" in msg
    assert engine.decoder is None and not engine._caches  # refused before allocating anything


def test_memory_refusal_through_the_hook_falls_back_with_the_reason(monkeypatch, capsys) -> None:
    model = _tiny(20)
    ids, mask = _prompts(20)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    _fake_gpu(monkeypatch, free=2**30)  # below the 2 GiB margin alone
    fastgen.install(model, compile=False, memory_check=True)
    got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ref, got)
    assert "FastgenMemoryError" in (fastgen.failure(model) or "")
    assert "usable 1.00 GiB" in capsys.readouterr().err


def test_memory_that_fits_is_accepted_and_checked_again_only_for_new_shapes(monkeypatch) -> None:
    model = _tiny(21)
    ids, mask = _prompts(21)
    seen = _fake_gpu(monkeypatch, free=64 * 2**30)
    engine = fastgen.get_engine(model, compile=False, memory_check=True)
    engine.generate(ids, mask, 4, fastgen.Sampling(do_sample=False))
    engine.generate(ids, mask, 4, fastgen.Sampling(do_sample=False))
    assert len(seen) == 1  # same shape: the cache exists, nothing new to allocate
    engine.generate(ids[:2], mask[:2], 4, fastgen.Sampling(do_sample=False))
    assert len(seen) == 2 and engine.last_plan is not None and engine.last_plan.shadow == 0


def test_generation_inside_inference_mode_and_autocast_is_unchanged() -> None:
    """Unsloth's GRPO trainer generates under torch.inference_mode() and autocast; fastgen's tokens must be the
    ones of the model's own dtype, and its cache must stay usable on the next call outside inference mode."""
    model = peft.get_peft_model(_tiny(22), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(22)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = fastgen.generate(model, ids.clone(), mask.clone(), 8, do_sample=False, pad_token_id=0, compile=False)
    assert torch.equal(ref, got)
    again = fastgen.generate(model, ids, mask, 8, do_sample=False, pad_token_id=0)
    assert torch.equal(ref, again)


def test_left_padding_over_a_zero_pad_embedding() -> None:
    """Pad token 0 embeds to zero (nn.Embedding padding_idx; Unsloth also zeroes an untied pad row), so the keys
    of row 0's padding are exactly zero. transformers 4.57's StaticCache.get_seq_length counts non-zero key slots
    of row 0: without an explicit cache_position, decode wrote over the prompt there (tokens diverged after the
    first)."""
    torch.manual_seed(23)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=True,
                                   max_position_embeddings=512, pad_token_id=0, initializer_range=0.2)
    model = transformers.Qwen3ForCausalLM(cfg).eval()  # larger init: tokens depend on the context, not one repeat
    assert not model.get_input_embeddings().weight[0].any()
    ids, mask = _prompts(23)
    assert mask[0, 0] == 0  # row 0 is left-padded
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 12, do_sample=False, pad_token_id=0, compile=False)
    assert torch.equal(ref, got)


def test_a_failed_compile_is_said_even_where_unsloth_silences_dynamo(monkeypatch) -> None:
    """Unsloth sets torch._dynamo.config.suppress_errors process-wide, so a compile that fails would run eager in
    silence. fastgen's first compiled call turns it off: the failure is recorded in compile_error (and warned),
    and decoding falls back to eager with the same tokens. The failing compiler is a stand-in backend."""
    model = _tiny(0)
    ids, mask = _prompts(0)
    ref = fastgen.generate(model, ids, mask, 6, do_sample=False, pad_token_id=0, compile=False)
    model = _tiny(0)  # a fresh model, so a fresh engine for the compiled run

    def no_kernels(gm, example_inputs):  # a Triton failure quotes its kernel's source before the reason
        raise RuntimeError("at 74:20: " + "kernel source line\n" * 300 + "no kernels for this op")

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=no_kernels))
    torch._dynamo.reset()
    # the config's own patch, not monkeypatch: undoing a setattr on torch's config module leaves the option
    # unreadable for every later test (hasattr False, config.patch raises "does not exist")
    with torch._dynamo.config.patch(suppress_errors=True):
        got = fastgen.generate(model, ids, mask, 6, do_sample=False, pad_token_id=0, compile=True)
        assert torch._dynamo.config.suppress_errors is True  # the process-wide setting is left as it was
    engine = fastgen.get_engine(model)
    assert engine.compile_error is not None and "no kernels for this op" in engine.compile_error  # the reason kept
    assert "at 74:20" in engine.compile_error and len(engine.compile_error) < 2000  # and the start, not all of it
    assert torch.equal(ref, got)


def _compile_with(monkeypatch, backend="aot_eager"):
    """torch.compile as the engine calls it, with a stand-in backend (inductor needs a C++ toolchain here): the
    step through aot_eager (functionalized, then eager kernels) by default."""
    real_compile = torch.compile

    def compile_(fn, **kw):
        return real_compile(fn, backend=backend, dynamic=False)

    monkeypatch.setattr(torch, "compile", compile_)
    torch._dynamo.reset()


# fuse_projections (rlstack.payload.fastgen.fused): the same tokens as generate, one GEMM per group in the
# compiled decode step, the fused buffer refreshed with the adapter, nothing fused where the shadow does not
# own the weights


def _llama(seed: int):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=1, vocab_size=300, max_position_embeddings=512)
    return transformers.LlamaForCausalLM(cfg).eval()


def _lora(model):
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear",
                                                      init_lora_weights=False)).eval()


@pytest.mark.parametrize("build", [_tiny, _llama])
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
        model = _lora(_tiny(2))
        g = torch.Generator().manual_seed(7)
        outs.append(fastgen.generate(model, ids, mask, 16, do_sample=True, top_k=50, top_p=0.9, pad_token_id=0,
                                     generator=g, compile=False, fuse_projections=fuse))
    assert torch.equal(outs[0], outs[1])


def test_the_fused_buffer_follows_lora_updates() -> None:
    """refresh() writes each merged weight into its rows of the group's buffer (views), so the next generation
    decodes the updated adapter through the one GEMM."""
    model = _lora(_tiny(3))
    ids, mask = _prompts(3)
    before = fastgen.generate(model, ids, mask, 8, do_sample=False, pad_token_id=0, compile=False,
                              fuse_projections=True)
    _adapter_step(model)
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
        model = _lora(_tiny(4))
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
    model = _tiny(5)
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


def test_attend_bucket_reads_the_filled_slots_and_decodes_what_generate_decodes(monkeypatch) -> None:
    """attend_bucket: each decode step's attention reads the filled cache slots rounded up to the bucket, not the
    whole cache, and the tokens stay generate's (greedy, and seeded sampling: the masked tail contributed
    exp(-inf) = 0, so dropping it changes nothing but the reduction's length)."""
    from rlstack.payload.fastgen import attention as attention_mod
    from rlstack.payload.fastgen.keywords import READ_KWARG

    reads: list[int] = []
    own = attention_mod.gqa_decode_attention

    def spy(module, query, key, value, mask, *args, **kwargs):
        if query.shape[2] == 1 and module.layer_idx == 0:
            reads.append(min(kwargs.get(READ_KWARG) or key.shape[2], key.shape[2]))
        return own(module, query, key, value, mask, *args, **kwargs)

    monkeypatch.setattr(attention_mod, "gqa_decode_attention", spy)
    model = peft.get_peft_model(_tiny(21), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(21)  # 9 prompt tokens; 40 new: slots 9..48 of a 128-slot cache
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0)
    got = fastgen.generate(model, ids, mask, 40, do_sample=False, pad_token_id=0, compile=False, attend_bucket=16)
    assert torch.equal(ref, got)
    engine = fastgen.get_engine(model)
    assert engine.attend_bucket == 16
    # decode steps k = 1..39 fill slots up to 9 + k: 10..48 -> reads of 16, 32, 48 (prefill not counted)
    assert reads == [engine.read_length(9 + k, 128) for k in range(1, 40)]
    assert sorted(set(reads)) == [16, 32, 48]
    torch.manual_seed(4)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=True, top_k=50,
                         pad_token_id=0)
    torch.manual_seed(4)
    got = fastgen.generate(model, ids, mask, 40, do_sample=True, top_k=50, pad_token_id=0)
    assert torch.equal(ref, got)


def test_attend_bucket_off_reads_the_whole_cache_and_bad_values_are_refused() -> None:
    model = _tiny(22)
    engine = fastgen.FastGenerator(model, compile=False)
    assert engine.attend_bucket == 0 and engine.read_length(10, 128) == 128
    assert fastgen.FastGenerator(model, compile=False, attend_bucket=64).read_length(65, 128) == 128
    for bad in (-1, 2.5, True):
        with pytest.raises(fastgen.FastgenError, match="attend_bucket must be"):
            fastgen.FastGenerator(model, compile=False, attend_bucket=bad)
    with pytest.raises(fastgen.FastgenError, match="needs fastgen's own decode attention"):
        fastgen.FastGenerator(model, compile=False, attend_bucket=64, gqa_attention=False)
    lora = peft.get_peft_model(_tiny(23), peft.LoraConfig(r=4, target_modules="all-linear"))
    with pytest.raises(fastgen.FastgenError, match="needs fastgen's own decode attention"):
        fastgen.FastGenerator(lora, compile=False, attend_bucket=64, merge_lora=False)


def test_the_draw_is_multinomials_draw_without_the_softmax() -> None:
    """_draw takes argmax(warped - log q) where aten's multinomial takes argmax(softmax(warped) / q) from the same
    Exp(1) noise: the same token for every row, top-k masked or not (here 2,000 rows of a 5,000-token
    vocabulary, wide and peaked logits), and a row that is not a distribution is marked, not drawn from."""
    from rlstack.payload.fastgen.sampling import Sampling, _draw, _warp

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2000, 5000, generator=g) * torch.linspace(0.1, 12.0, 2000)[:, None]
    for sampling in (Sampling(), Sampling(top_k=50), Sampling(temperature=0.7, top_k=20)):
        warped = _warp(logits, sampling)
        invalid = torch.zeros(2000, dtype=torch.bool)
        got = _draw(warped, torch.Generator().manual_seed(1), invalid)
        want = torch.multinomial(warped.softmax(-1), 1, generator=torch.Generator().manual_seed(1))[:, 0]
        assert torch.equal(got, want) and not invalid.any()
    bad = torch.zeros(3, 10)
    bad[0, 2], bad[1] = float("nan"), float("-inf")
    bad[2, 5] = float("inf")
    invalid = torch.zeros(3, dtype=torch.bool)
    _draw(bad, None, invalid)
    assert invalid.tolist() == [True, True, True]


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("do_sample", [False, True])
def test_reference_kernels_decode_through_the_model_itself_and_give_generates_tokens(lora: bool,
                                                                                    do_sample: bool) -> None:
    """reference_kernels: no shadow (the model, a PEFT model's LoRA modules unmerged), transformers' attention,
    generate's exact tokens greedy and under a seed; the memory plan counts no shadow."""
    model = _tiny(9)
    if lora:
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear",
                                                           init_lora_weights=False)).eval()
    ids, mask = _prompts(9)
    kw = {"do_sample": do_sample, "top_k": 20, "pad_token_id": 0}
    torch.manual_seed(4)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, **kw)
    torch.manual_seed(4)
    got = fastgen.generate(model, ids, mask, 10, reference_kernels=True, **kw)
    assert torch.equal(ref, got)
    engine = fastgen.get_engine(model)
    assert engine._shadow is None and engine.decoder is (model.get_base_model() if lora else model)
    assert engine.last_plan is not None and engine.last_plan.shadow == 0
    assert "transformers' kernels, eager" in engine.describe()


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the aten calls that read a tensor's value back to the host (a CUDA graph cannot hold them)."""

    READS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "unique", "equal"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.READS:
            self.seen.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_host_reads_are_detected() -> None:
    with _HostReads() as reads:
        bool(torch.ones(3).all())
        torch.arange(4).nonzero()
    assert reads.seen == ["_local_scalar_dense", "nonzero"]


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("lora", [False, True])
def test_reference_kernels_decode_step_reads_nothing_back_to_the_host(monkeypatch, lora: bool, padded: bool) -> None:
    """What lets reference_kernels capture transformers' eager step into a CUDA graph (on CUDA, where this test
    cannot run): its decode step asks the device for no value, under the installed transformers (5.x and 4.57
    build the static cache's mask without the padding check that reads one). Why a test: a transformers release
    that adds such a read breaks capture, and the GPU then launches every kernel from Python (graph_error).
    Unpadded too: GRPO's G generations of one prompt have no padding, the case a "mask all ones?" check is for."""
    model = _tiny(10)
    if lora:
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear",
                                                           init_lora_weights=False)).eval()
    ids, mask = _prompts(10)
    if not padded:
        mask = torch.ones_like(mask)
    engine = fastgen.get_engine(model, reference_kernels=True)
    calls: list[list[str]] = []
    real = engine._decode

    def watched(*args, **kwargs):
        with _HostReads() as reads:
            out = real(*args, **kwargs)
        calls.append(reads.seen)
        return out

    monkeypatch.setattr(engine, "_decode", watched)
    engine.generate(ids, mask, 5, fastgen.Sampling(do_sample=False, pad_token_id=0))
    assert calls == [[]] * 4  # four decode steps (token 0 comes from the prefill, which is not captured)


@pytest.mark.parametrize("option", [{"compile": True}, {"attend_bucket": 128}, {"decode_attention": "triton"},
                                    {"graph": "trees"}, {"prefill_once": True},
                                    {"attention_tuning": "32:8:512:default"}])
def test_reference_kernels_refuse_options_that_change_the_kernels(option: dict) -> None:
    with pytest.raises(fastgen.FastgenError, match=f"reference_kernels .*{next(iter(option))}="):
        fastgen.FastGenerator(_tiny(0), reference_kernels=True, **option)


def _grpo_prompts(seed: int, per_prompt: int = 4):
    """GRPO's batch: each of _prompts' three (left-padded) prompts repeated ``per_prompt`` times, in order."""
    ids, mask = _prompts(seed)
    return ids.repeat_interleave(per_prompt, 0), mask.repeat_interleave(per_prompt, 0)


@pytest.mark.parametrize("lora", [False, True])
def test_a_repeated_prompt_is_prefilled_once_and_decodes_as_generate(lora: bool) -> None:
    """prefill_once (the default): from a shape's second call the prefill runs on one row per distinct prompt and
    the others take its K/V and logits; greedy and seeded sampling give generate's exact tokens on every call
    (the first, which allocates the cache, prefills every row)."""
    model = _tiny(31)
    if lora:
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear",
                                                           init_lora_weights=False))
    ids, mask = _grpo_prompts(31)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    prefilled = []
    for _ in range(3):
        got = fastgen.generate(model, ids, mask, 10, do_sample=False, pad_token_id=0, compile=False)
        assert torch.equal(ref, got)
        prefilled.append(fastgen.get_engine(model).prefilled_rows)
    assert prefilled == [12, 3, 3]
    torch.manual_seed(9)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=True, top_k=50,
                         pad_token_id=0)
    torch.manual_seed(9)
    got = fastgen.generate(model, ids, mask, 10, do_sample=True, top_k=50, pad_token_id=0, compile=False)
    assert torch.equal(ref, got) and fastgen.get_engine(model).prefilled_rows == 3


def test_prefill_once_gives_the_whole_batchs_logits_in_bf16_and_leaves_other_shapes_alone() -> None:
    """The same engine options with and without prefill_once: every step's logits equal (bf16, LoRA'd: on the
    CPU a GEMM's row does not depend on how many rows it has), and distinct prompts prefill every row."""
    model = peft.get_peft_model(_tiny(32).to(torch.bfloat16),
                                peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    ids, mask = _grpo_prompts(32)
    seen = {}
    for once in (False, True):
        engine = fastgen.FastGenerator(model, prefill_once=once, compile=False)
        for _ in range(2):
            logits: list[torch.Tensor] = []
            tokens = engine.generate(ids, mask, 6, fastgen.Sampling(do_sample=False),
                                     on_logits=lambda k, x, kept=logits: kept.append(x.clone()))
        seen[once] = (tokens, torch.stack(logits), engine.prefilled_rows)
    assert torch.equal(seen[False][0], seen[True][0]) and torch.equal(seen[False][1], seen[True][1])
    assert (seen[False][2], seen[True][2]) == (12, 3)
    distinct, dmask = _prompts(32)
    engine = fastgen.FastGenerator(model, compile=False)
    for _ in range(2):
        engine.generate(distinct, dmask, 4, fastgen.Sampling(do_sample=False))
    assert engine.prefilled_rows == 3


def test_distinct_rows_groups_by_ids_and_mask_in_order_of_first_appearance() -> None:
    from rlstack.payload.fastgen.prefill import distinct_rows

    ids = torch.tensor([[5, 6], [7, 8], [5, 6], [0, 6], [7, 8]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 1], [1, 1]])
    assert distinct_rows(ids, mask) == ([0, 1, 3], [0, 1, 0, 2, 1])
    same_ids = torch.tensor([[0, 6], [0, 6]])
    assert distinct_rows(same_ids, torch.tensor([[0, 1], [1, 1]])) is None  # the mask tells them apart
    assert distinct_rows(ids[:2], mask[:2]) is None


def test_prefill_once_prefills_every_row_where_the_cache_is_not_one_it_knows() -> None:
    """A cache not yet allocated (a shape's first call), or one whose layers do not hold the batch's rows as
    keys/values tensors: every row is prefilled (``_row_views`` is None)."""
    from rlstack.payload.fastgen.prefill import _row_views

    cache = transformers.StaticCache(config=_tiny(0).config, max_cache_len=32)
    assert _row_views(cache, 4) is None
    layer = type("Layer", (), {})()
    layer.keys, layer.values = torch.zeros(4, 2, 32, 16), torch.zeros(4, 2, 32, 16)
    assert _row_views(type("C", (), {"layers": [layer]})(), 4) == [layer]
    assert _row_views(type("C", (), {"layers": [layer]})(), 3) is None  # other rows than the batch's
    layer.values = None
    assert _row_views(type("C", (), {"layers": [layer]})(), 4) is None
    assert _row_views(object(), 4) is None


def test_the_refresh_merges_plain_lora_as_one_gemm_onto_the_base() -> None:
    """The shadow's merged weight is ``W + scale * B @ A`` (bf16, within one rounding of the exact sum), computed
    as one GEMM accumulating onto the base (no call of PEFT's get_delta_weight for a plain LoRA), and follows an
    adapter step; a layer whose delta is not that form (a PEFT variant, fan_in_fan_out) goes through PEFT's
    get_delta_weight, the merged weight as right."""
    from peft.tuners.lora import LoraLayer

    from rlstack.payload.fastgen.shadow import _plain_lora

    model = peft.get_peft_model(_tiny(33).to(torch.bfloat16),
                                peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    engine = fastgen.FastGenerator(model, compile=False, fuse_projections=False)
    ids, mask = _prompts(33)
    calls: list[str] = []
    for _ in range(2):
        with pytest.MonkeyPatch.context() as mp:
            for cls in {type(m) for m in model.modules() if isinstance(m, LoraLayer)}:
                mp.setattr(cls, "get_delta_weight", lambda self, adapter: calls.append(adapter))
            engine.generate(ids, mask, 2, fastgen.Sampling(do_sample=False))
        assert calls == []
        shadow = dict(engine.decoder.named_modules())
        for name, layer in model.base_model.model.named_modules():
            if not isinstance(layer, LoraLayer):
                continue
            assert _plain_lora(layer, "default")
            a, b = layer.lora_A["default"].weight.double(), layer.lora_B["default"].weight.double()
            delta = layer.scaling["default"] * b @ a
            exact = layer.get_base_layer().weight.double() + delta
            # one bf16 rounding of the sum, plus the adapter's float32 factors rounded to bf16 for the GEMM (each
            # product's error: the sum of the products' sizes bounds it, not the delta, whose terms may cancel)
            size = layer.scaling["default"] * b.abs() @ a.abs()
            bound = torch.finfo(torch.bfloat16).eps * (exact.abs() + 2 * size)
            assert ((shadow[name].weight.double() - exact).abs() <= bound).all(), name
        _adapter_step(model)
    # a delta of another form (here a PEFT variant named on the layer) is PEFT's own get_delta_weight's
    name, layer = next((n, m) for n, m in model.base_model.model.named_modules() if isinstance(m, LoraLayer))
    layer.lora_variant = {**(getattr(layer, "lora_variant", None) or {}), "default": object()}
    assert not _plain_lora(layer, "default")
    real = type(layer).get_delta_weight
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(layer), "get_delta_weight",
                   lambda self, adapter: (calls.append(adapter), real(self, adapter))[1])
        engine.generate(ids, mask, 2, fastgen.Sampling(do_sample=False))
    assert calls == ["default"]  # that layer only, once a refresh
    a, b = layer.lora_A["default"].weight.double(), layer.lora_B["default"].weight.double()
    exact = layer.get_base_layer().weight.double() + layer.scaling["default"] * b @ a
    bound = 2 * torch.finfo(torch.bfloat16).eps * (exact.abs() + 2 * layer.scaling["default"] * b.abs() @ a.abs())
    assert ((dict(engine.decoder.named_modules())[name].weight.double() - exact).abs() <= bound).all()
    layer.fan_in_fan_out = True
    assert not _plain_lora(layer, "default")


def test_emulate_precision_casts_reaches_inductor_with_the_modes_own_options(monkeypatch) -> None:
    """emulate_precision_casts compiles the decode step with inductor's option of that name; torch.compile takes a
    mode or options, so a mode's own options (graph="trees": reduce-overhead's CUDA graphs) come along. Without
    it the step compiles as always (the mode alone). Not compiled (the CPU's default), the option does nothing."""
    from rlstack.payload.fastgen.compiling import compile_settings

    seen: list[dict] = []
    real_compile = torch.compile

    def record(fn, **kw):
        seen.append(kw)
        return real_compile(fn, backend="eager")

    monkeypatch.setattr(torch, "compile", record)
    model = _tiny(34)
    ids, mask = _prompts(34)
    torch._dynamo.reset()
    engine = fastgen.FastGenerator(model, compile=True, emulate_precision_casts=True)
    engine.generate(ids, mask, 3, fastgen.Sampling(do_sample=False))
    assert seen[0]["options"] == {"emulate_precision_casts": True} and "mode" not in seen[0]
    assert "inductor rounding as eager does" in engine.describe()
    assert compile_settings("reduce-overhead", True) == {
        "options": {"triton.cudagraphs": True, "emulate_precision_casts": True}}
    assert compile_settings("reduce-overhead", False) == {"mode": "reduce-overhead"}
    assert compile_settings(None, False) == {"mode": None}
    assert not fastgen.FastGenerator(model, compile=False, emulate_precision_casts=True).emulate_precision_casts
    with pytest.raises(fastgen.FastgenError, match="reference_kernels .*emulate_precision_casts=True"):
        fastgen.FastGenerator(model, reference_kernels=True, emulate_precision_casts=True)


def test_attention_tuning_is_refused_without_the_triton_attention_or_in_another_form() -> None:
    """attention_tuning is the triton kernel's launch shape: refused, saying so, with the matmul attention (the
    CPU's default), and a malformed one is refused with the form it takes."""
    model = _tiny(35)
    with pytest.raises(fastgen.FastgenError, match="attention_tuning is the triton decode attention's"):
        fastgen.FastGenerator(model, attention_tuning="64:4:2048:2")
    pytest.importorskip("triton")
    with pytest.raises(fastgen.FastgenError, match="block_n:num_warps:programs:num_stages"):
        fastgen.FastGenerator(model, decode_attention="triton", attention_tuning="64,4,2048,2")


def test_release_frees_the_engine_at_once_not_when_the_cyclic_collector_runs() -> None:
    """The engine is in reference cycles (its step and draw closures refer back to it): release() collects them,
    so the shadow and caches are freed when it returns (a second engine made after it on a GPU peaked with the
    first's 15 GiB still allocated before, 2026-12-05)."""
    import gc
    import weakref

    model = _tiny(0)
    ids, mask = _prompts(0)
    fastgen.generate(model, ids, mask, 4, do_sample=True, top_k=5, pad_token_id=0)
    engine = weakref.ref(fastgen.get_engine(model))
    shadow = weakref.ref(fastgen.get_engine(model)._shadow)
    gc.disable()  # only release's own collection may free them
    try:
        fastgen.release(model)
        assert engine() is None and shadow() is None
    finally:
        gc.enable()
    # the hook's uninstall releases too (it dropped the engine uncollected, so a release() after it found none)
    fastgen.install(model, compile=False)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=True, top_k=5, pad_token_id=0)
    engine = weakref.ref(fastgen.get_engine(model))
    gc.disable()
    try:
        fastgen.uninstall(model)
        assert not fastgen.installed(model) and engine() is None
    finally:
        gc.enable()
