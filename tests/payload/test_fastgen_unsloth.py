"""fastgen on the portable default path's model: a QLoRA PeftModel as Unsloth's FastLanguageModel loads it.

Unsloth needs a GPU and cannot be installed here, so what it does to the model is simulated, following the source
of unsloth 2026.6.1 (the portable lock's version):

* ``FastQwen3Model.pre_patch`` (unsloth/models/qwen3.py) replaces ``forward`` of Qwen3ForCausalLM, Qwen3Model,
  Qwen3DecoderLayer and Qwen3Attention with its own functions, and rebinds ``modeling_qwen3.Qwen3RotaryEmbedding``
  to its LlamaRotaryEmbedding (an ``inv_freq`` buffer plus cos/sin caches indexed by position) before the model is
  built. Simulated: replacement forwards (module ``unsloth.models.llama``) that count their calls, delegate to
  transformers' forwards for a dynamic cache, and raise for a StaticCache (Unsloth's inference forward reads
  ``past_key_values`` as per-layer (K, V) pairs); a rotary class with cos/sin caches; ``self_attn.rotary_emb`` set
  on every layer (FastLlamaModel.from_pretrained does).
* ``FastLlamaModel.from_pretrained`` puts an instance-level ``generate`` on the base model (the class's kept as
  ``_old_generate``; the replacement switches to inference, runs under torch.inference_mode, switches back).
  Simulated the same way, counting calls. PeftModel.generate reaches it through the base model.
* unsloth_zoo's ``prepare_model_for_training``: LoRA A/B in float32 and trainable, everything else frozen.
* The GRPO trainer's ``unsloth_unwrap_model_for_generation`` wraps the PEFT model's ``generate`` for one generation
  (``generate_with_clone``) and puts it back; TRL 0.24 calls it under torch.no_grad().

Not simulated: Unsloth's kernels (the simulated forwards run transformers' code) and bf16 (the model is float32 so
token equality with HF generate can be exact; the shadow computes in the model's dtype). The 4-bit variant needs
bitsandbytes (its CPU backend quantizes NF4 on the CPU) and is skipped where it is not installed.
"""

from __future__ import annotations

import collections
import contextlib
import types
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from transformers.models.qwen3 import modeling_qwen3  # noqa: E402

from rlstack.payload import fastgen  # noqa: E402
from rlstack.payload.fastgen import shadow  # noqa: E402

UNSLOTH_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PATCHED_CLASSES = (modeling_qwen3.Qwen3ForCausalLM, modeling_qwen3.Qwen3Model, modeling_qwen3.Qwen3DecoderLayer,
                   modeling_qwen3.Qwen3Attention)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The project's tiny Qwen3 model (payload/tiny.py), saved like a hub checkpoint."""
    from rlstack.payload import tiny
    from rlstack.payload.recipes import TinySpec

    model, tok = tiny.build(TinySpec())
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _load(folder, four_bit: bool):
    kwargs = {"dtype": torch.float32}
    if four_bit:
        pytest.importorskip("bitsandbytes")
        kwargs.update(device_map={"": "cpu"}, quantization_config=transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    if four_bit:
        # the float32 reference would otherwise be a bf16 one on some CPUs and not others (this test failed on an
        # AMX host and passed in CI)
        shadow.keep_nf4_on_cpu(model)
    return model


def _lora(model, seed: int, layers: list[int] | None = None):
    torch.manual_seed(seed)
    pm = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=UNSLOTH_TARGETS,
                                                    lora_dropout=0.0, init_lora_weights=False,
                                                    layers_to_transform=layers))
    for name, p in pm.named_parameters():  # unsloth_zoo prepare_model_for_training
        p.requires_grad_("lora_" in name)
        if "lora_" in name:
            p.data = p.data.float()
    return pm


class _Counts(collections.Counter):
    pass


def _unsloth_forward(original, counts: _Counts, label: str):
    def forward(self, *args, **kwargs):
        counts[label] += 1
        cache = kwargs.get("past_key_values", kwargs.get("past_key_value"))
        if isinstance(cache, transformers.StaticCache):
            raise TypeError(f"{label}: Unsloth's fast inference forward takes per-layer (K, V) pairs, "
                            "not a StaticCache")
        return original(self, *args, **kwargs)

    forward.__module__ = "unsloth.models.llama"
    forward.__qualname__ = f"{label}_fast_forward"
    return forward


def _unsloth_rotary_class():
    hf_rotary = modeling_qwen3.Qwen3RotaryEmbedding

    class LlamaRotaryEmbedding(torch.nn.Module):
        """Unsloth's shape: inv_freq plus cos/sin caches over max_position_embeddings, looked up by position."""

        def __init__(self, config=None, device=None, **_):
            super().__init__()
            self.config = config
            self.register_buffer("inv_freq", torch.empty(0), persistent=False)
            self.register_buffer("cos_cached", torch.empty(0), persistent=False)
            self.register_buffer("sin_cached", torch.empty(0), persistent=False)
            self.rebuild()

        def rebuild(self) -> None:
            """transformers 5 loads on the meta device and leaves non-persistent buffers of classes it does not
            know uninitialized; unsloth/models/loader.py (_NEEDS_ROPE_FIX) recomputes them after loading."""
            inv_freq = hf_rotary(config=self.config).inv_freq
            t = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
            emb = torch.cat((torch.outer(t, inv_freq),) * 2, dim=-1)
            self.inv_freq, self.cos_cached, self.sin_cached = inv_freq, emb.cos(), emb.sin()

        def forward(self, x, position_ids=None, seq_len=None):
            return self.cos_cached[position_ids].to(x.dtype), self.sin_cached[position_ids].to(x.dtype)

    LlamaRotaryEmbedding.__module__ = "unsloth.models.llama"
    return LlamaRotaryEmbedding


def _for_inference(model) -> None:
    model.eval()


def _for_training(model) -> None:
    model.train()


def _unsloth_fast_generate(counts: _Counts):
    def unsloth_fast_generate(self, *args, **kwargs):
        counts["unsloth_generate"] += 1
        restore = self.training
        _for_inference(self)
        kwargs.pop("token_type_ids", None)
        with torch.inference_mode():
            out = self._old_generate(*args, **kwargs)
        if restore:
            _for_training(self)
        return out

    return unsloth_fast_generate


class _Unsloth:
    """The simulated Unsloth: ``apply()`` patches the classes (as pre_patch does, undone after the test), ``load()``
    then loads a model the way FastLanguageModel.from_pretrained + get_peft_model leave it."""

    def __init__(self, monkeypatch) -> None:
        self.monkeypatch = monkeypatch
        self.counts = _Counts()
        self.applied = False

    def apply(self) -> None:
        for cls in PATCHED_CLASSES:
            self.monkeypatch.setattr(cls, "forward", _unsloth_forward(cls.forward, self.counts, cls.__name__))
        self.monkeypatch.setattr(modeling_qwen3, "Qwen3RotaryEmbedding", _unsloth_rotary_class())
        self.applied = True

    def load(self, folder, four_bit: bool, seed: int, layers: list[int] | None = None):
        assert self.applied
        base = _load(folder, four_bit)  # built after pre_patch: Unsloth's rotary class inside
        rotary = base.model.rotary_emb
        rotary.rebuild()
        for layer in base.model.layers:
            layer.self_attn.rotary_emb = rotary
        base._old_generate = base.generate
        base.generate = types.MethodType(_unsloth_fast_generate(self.counts), base)
        return _lora(base, seed, layers)


@pytest.fixture
def unsloth(monkeypatch):
    return _Unsloth(monkeypatch)


@contextlib.contextmanager
def _unsloth_unwrap(model):
    """unsloth/models/rl.py unsloth_unwrap_model_for_generation, minus DeepSpeed/FSDP."""
    _for_inference(model)
    original_generate = model.generate

    def generate_with_clone(*args, **kwargs):
        out = original_generate(*args, **kwargs)
        return out.clone() if isinstance(out, torch.Tensor) else out

    model.generate = generate_with_clone
    try:
        yield model
    finally:
        model.generate = original_generate
        _for_training(model)


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (4, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :3] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _trl_config(greedy: bool) -> object:
    """TRL 0.24 GRPOTrainer's GenerationConfig (top_k None, min_p None), fixed length as in the benchmarks."""
    return transformers.GenerationConfig(max_new_tokens=16, min_new_tokens=16, do_sample=not greedy, pad_token_id=0,
                                         bos_token_id=None, eos_token_id=0, temperature=1.0, top_p=1.0, top_k=None,
                                         min_p=None, repetition_penalty=1.0, cache_implementation=None)


def _trl_generate(model, inputs, gc, seed: int):
    """GRPOTrainer._generate_single_turn's call (use_vllm=False) inside Unsloth's unwrap."""
    torch.manual_seed(seed)
    with _unsloth_unwrap(model) as unwrapped, torch.no_grad():
        return unwrapped.generate(**inputs, generation_config=gc, disable_compile=True)


def _reference(folder, four_bit: bool, seed: int, layers: list[int] | None = None):
    """The same weights without any Unsloth patch (build it before unsloth.apply()): HF generate on it is what
    fastgen must reproduce."""
    ref = _lora(_load(folder, four_bit), seed, layers)
    ref.train()
    return ref


def _copy_lora(src, dst) -> None:
    dst_params = dict(dst.named_parameters())
    with torch.no_grad():
        for name, p in src.named_parameters():
            if "lora_" in name:
                dst_params[name].copy_(p)


def _hf_tokens(ref, inputs, gc, seed: int):
    torch.manual_seed(seed)
    with torch.no_grad():
        ref.eval()
        out = ref.generate(**inputs, generation_config=gc, disable_compile=True)
        ref.train()
    return out


@pytest.mark.parametrize("options", [{"fuse_projections": False}, {}, {"attend_bucket": 8}],
                         ids=["separate", "fused", "fused-attend8"])
@pytest.mark.parametrize("four_bit", [False, True], ids=["bf16-shape", "qlora-4bit"])
def test_unsloth_loaded_model_generates_hf_tokens_through_fastgen(tiny_folder, unsloth, four_bit: bool,
                                                                  options: dict[str, Any]) -> None:
    """Greedy and seeded sampling: exact token equality with HF generate on the same (unpatched) weights; the
    fast path never calls Unsloth's generate or its patched forwards, and follows LoRA updates between calls.
    With fuse_projections (the default): the pristine copy's q/k/v and gate/up over the dequantized, merged
    weights; with attend_bucket: its attention reading 16, then 24 and 32 of the cache's 128 slots."""
    fuse = options.get("fuse_projections", True)
    ref = _reference(tiny_folder, four_bit, seed=1)
    unsloth.apply()
    counts = unsloth.counts
    model = unsloth.load(tiny_folder, four_bit, seed=1)
    _copy_lora(ref, model)
    model.train()
    fastgen.install(model, compile=False, **options)
    inputs = _inputs(2)
    for greedy, seed in ((True, 0), (False, 5), (False, 6)):
        gc = _trl_config(greedy)
        want = _hf_tokens(ref, inputs, gc, seed)
        counts.clear()
        got = _trl_generate(model, inputs, gc, seed)
        assert fastgen.failure(model) is None
        assert counts == {}, f"Unsloth's generate / patched forwards ran: {dict(counts)}"
        assert torch.equal(want, got), (greedy, seed)
    engine = fastgen.get_engine(model)
    assert any("Qwen3ForCausalLM.forward -> unsloth" in p for p in engine.patches), engine.patches
    assert any(p.startswith("Qwen3RotaryEmbedding -> unsloth") for p in engine.patches), engine.patches
    assert type(engine.decoder.model.rotary_emb).__name__ == "Qwen3RotaryEmbedding"
    assert "model.rotary_emb.inv_freq" in engine._shadow.own_buffers
    assert engine.fused_gemms_saved == (3 * engine.decoder.config.num_hidden_layers if fuse else 0)
    # an optimizer step on the adapter: the next generation must see it
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.3)
    _copy_lora(ref, model)
    gc = _trl_config(greedy=True)
    assert torch.equal(_hf_tokens(ref, inputs, gc, 0), _trl_generate(model, inputs, gc, 0))


def test_qlora_with_lora_on_the_top_layer_only(tiny_folder, unsloth) -> None:
    """lora.top_layers (Unsloth's layers_to_transform): the lower layer's projections stay plain 4-bit linears with
    no LoRA. The shadow dequantizes those once; tokens must still be HF generate's."""
    pytest.importorskip("bitsandbytes")
    ref = _reference(tiny_folder, True, seed=9, layers=[1])
    unsloth.apply()
    model = unsloth.load(tiny_folder, True, seed=9, layers=[1])
    _copy_lora(ref, model)
    fastgen.install(model, compile=False)
    inputs = _inputs(10)
    for greedy, seed in ((True, 0), (False, 4)):
        gc = _trl_config(greedy)
        want = _hf_tokens(ref, inputs, gc, seed)  # (the class-level patches count the reference's calls too)
        unsloth.counts.clear()
        assert torch.equal(want, _trl_generate(model, inputs, gc, seed)), greedy
        assert fastgen.failure(model) is None and unsloth.counts == {}
    engine = fastgen.get_engine(model)
    assert len(engine._shadow._merged) == len(UNSLOTH_TARGETS)  # only layer 1 is merged on every refresh
    assert type(model.base_model.model.model.layers[0].mlp.up_proj.weight).__name__ == "Params4bit"


def test_qlora_shadow_memory_estimate_matches_its_allocation(tiny_folder, unsloth, monkeypatch) -> None:
    """4-bit: every projection becomes a dense weight in the shadow (LoRA'd ones merged); the plan counts exactly
    those bytes (and the static cache's) before any of them is allocated."""
    unsloth.apply()
    model = unsloth.load(tiny_folder, True, seed=3)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (64 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    engine = fastgen.get_engine(model, compile=False, memory_check=True)
    inputs = _inputs(4)
    engine.generate(inputs["input_ids"], inputs["attention_mask"], 8, fastgen.Sampling(do_sample=False))
    trained = {t.data_ptr() for t in model.parameters()}
    dense = {p.data_ptr(): p.numel() * p.element_size() for p in engine.decoder.parameters()
             if p.data_ptr() not in trained}
    cfg = model.config
    projections = cfg.num_hidden_layers * (
        cfg.hidden_size * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
        + cfg.num_attention_heads * cfg.head_dim * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size)
    assert engine.last_plan is not None
    assert engine.last_plan.shadow == sum(dense.values()) == projections * 4  # float32 compute dtype here


def _falls_back_to_unsloths_generate(unsloth, tiny_folder, capsys, **options) -> str:
    """fastgen installed with ``options`` on an Unsloth-loaded model fails, turns itself off once, and this and
    every later call go to Unsloth's own generate: the tokens of a twin model that never had fastgen. Returns
    the failure fastgen recorded."""
    unsloth.apply()
    twin = unsloth.load(tiny_folder, False, seed=7)
    model = unsloth.load(tiny_folder, False, seed=7)
    _copy_lora(twin, model)
    fastgen.install(model, compile=False, **options)
    inputs = _inputs(8)
    gc = _trl_config(greedy=True)
    want = _trl_generate(twin, inputs, gc, 0)
    unsloth.counts.clear()
    for call in (1, 2, 3):
        assert torch.equal(want, _trl_generate(model, inputs, gc, 0))
        assert unsloth.counts["unsloth_generate"] == call
    assert capsys.readouterr().err.count("rlstack fastgen: falling back") == 1
    return fastgen.failure(model) or ""


def test_without_the_pristine_copy_the_patched_classes_fail_and_fastgen_falls_back_once(
        tiny_folder, unsloth, capsys) -> None:
    """Control: a shadow built from the live (patched) classes runs Unsloth's forwards, which cannot take a
    StaticCache. That TypeError (not a FastgenError) must turn fastgen off once."""
    failure = _falls_back_to_unsloths_generate(unsloth, tiny_folder, capsys, pristine=False)
    assert "TypeError" in failure and "StaticCache" in failure


def test_qlora_shadow_computes_in_the_4bit_compute_dtype(tiny_folder) -> None:
    """PEFT's prepare_model_for_kbit_training (rlstack's transformers+bnb4 loader) casts every unquantized tensor
    to float32; the shadow must still be bf16, the bitsandbytes compute dtype, not a float32 copy of a 4B model
    (twice the memory and bandwidth), and the plan must count the bf16 copies of those float32 tensors."""
    pytest.importorskip("bitsandbytes")
    from rlstack.payload.fastgen.memory import generation_dtype as _generation_dtype

    q = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                        bnb_4bit_compute_dtype=torch.bfloat16)
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_folder, quantization_config=q, dtype=torch.bfloat16,
                                                             device_map={"": "cpu"})
    base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    model = peft.get_peft_model(base, peft.LoraConfig(r=8, target_modules=UNSLOTH_TARGETS))
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert _generation_dtype(model) == torch.bfloat16
    plan = fastgen.plan_memory(model, 2, 128, torch.bfloat16)
    cfg = model.config
    embed = cfg.vocab_size * cfg.hidden_size * 2  # tied: one bf16 copy for embedding and lm_head
    assert plan.shadow > embed


def test_reference_kernels_refuse_unsloths_patched_classes_and_fall_back_once(tiny_folder, unsloth, capsys) -> None:
    """reference_kernels decodes through the model's own classes; under Unsloth those are Unsloth's forwards, not
    transformers', so fastgen refuses, saying so, and Unsloth's own generate serves."""
    failure = _falls_back_to_unsloths_generate(unsloth, tiny_folder, capsys, reference_kernels=True)
    assert "patched" in failure and "transformers' generate" in failure


def test_a_4bit_weight_repacked_for_bitsandbytes_cpu_kernel_is_refused_not_decoded(tiny_folder) -> None:
    """bitsandbytes repacks a 4-bit weight in place for its CPU kernel (an eval-mode forward without grad on a CPU
    with AVX512-BF16); dequantized as NF4 that layout is another matrix, so fastgen says so instead of sampling
    from another model. The flag is set by hand: whether the repack happens depends on the CPU."""
    model = peft.get_peft_model(_load(tiny_folder, four_bit=True), peft.LoraConfig(r=4, target_modules=UNSLOTH_TARGETS))
    layer = model.base_model.model.model.layers[0].mlp.up_proj.base_layer
    layer.weight.quant_state.packing_format_for_cpu = True
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(fastgen.FastgenError, match="repacked a 4-bit weight"):
        fastgen.FastGenerator(model, compile=False).generate(ids, torch.ones_like(ids), 2,
                                                             fastgen.Sampling(do_sample=False, pad_token_id=0))
