"""fastgen's FP8 projections (FastGenerator(fp8="row" | "tensor"), fastgen.fp8): the GEMM is the e4m3 math it
claims, the engine computes exactly a model whose projections do that math (so the plumbing adds nothing of
its own), the copies follow LoRA updates, the memory plan counts them, and the refusals say why."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from test_fastgen import _adapter_step, _new_bytes, _prompts, _tiny  # noqa: E402

from rlstack.payload import fastgen  # noqa: E402
from rlstack.payload.fastgen import fp8  # noqa: E402


@pytest.mark.parametrize("rowwise", [True, False], ids=["row", "tensor"])
def test_the_gemm_is_the_e4m3_product_and_close_to_the_full_precision_one(rowwise: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, 64, generator=g)
    w = torch.randn(48, 64, generator=g) * 0.05
    weight = fp8.Fp8Weight(w, rowwise)
    out = weight(x)
    assert out.shape == (5, 7, 48) and out.dtype == x.dtype
    xq, sx = fp8.quantize_activation(x.reshape(-1, 64), rowwise)
    assert sx.shape == ((35, 1) if rowwise else ())
    exact = (xq.double() * sx.double()) @ weight.dequantized().double().T
    torch.testing.assert_close(out.reshape(-1, 48).double(), exact, rtol=1e-5, atol=1e-6)
    want = w.abs().amax(1) / 448 if rowwise else w.abs().max() / 448
    torch.testing.assert_close(weight.scale, want)
    full = x @ w.T
    assert float((out - full).norm() / full.norm()) < 0.05  # e4m3: 3 mantissa bits a value, errors average out


def test_row_scales_keep_an_outlier_from_blurring_the_other_rows() -> None:
    """Why "row" exists: one token with a large activation sets a per-tensor scale that leaves the others few
    e4m3 steps; per-token scales keep each row's own precision."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 64, generator=g)
    x[3] *= 1e5  # the others then fall to e4m3's subnormals (17 binades below its largest value) or to 0
    w = torch.randn(32, 64, generator=g)
    full = x @ w.T
    errors = {rowwise: float(((fp8.Fp8Weight(w, rowwise)(x) - full)[[0, 1, 2, 4, 5, 6, 7]]).norm()
                             / full[[0, 1, 2, 4, 5, 6, 7]].norm()) for rowwise in (True, False)}
    assert errors[True] < 0.05 < errors[False]


def test_the_cpus_dequantized_product_is_what_scaled_mm_computes() -> None:
    """Off CUDA fp8.linear multiplies the dequantized e4m3 values (oneDNN's _scaled_mm is ~40,000 times slower
    than bf16 here); on CUDA it calls torch._scaled_mm. Both are the same product: pinned against the CPU's own
    _scaled_mm with the same per-tensor scales."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 32, generator=g)
    weight = fp8.Fp8Weight(torch.randn(16, 32, generator=g), rowwise=False)
    xq, sx = fp8.quantize_activation(x, rowwise=False)
    scaled = torch._scaled_mm(xq, weight.w8.t(), scale_a=sx, scale_b=weight.scale, out_dtype=torch.float32)
    torch.testing.assert_close(weight(x), scaled, rtol=1e-5, atol=1e-5)


def test_an_all_zero_weight_quantizes_to_zeros_not_nans() -> None:
    weight = fp8.Fp8Weight(torch.zeros(16, 32))
    assert torch.equal(weight(torch.randn(2, 32)), torch.zeros(2, 16))


class _Emulated(torch.nn.Module):
    """The reference: one projection computing fp8.linear on its weight quantized at given scales ([N]: row-wise,
    []: per tensor), written out here rather than taken from fastgen.fp8."""

    def __init__(self, linear, scale) -> None:
        super().__init__()
        w = linear.weight.float()
        self.w8 = (w / (scale[:, None] if scale.dim() else scale)).to(fp8.FP8)
        self.scale, self.bias = scale, linear.bias

    def forward(self, x):
        out = fp8.linear(x, self.w8, self.scale)
        return out if self.bias is None else out + self.bias


def _emulate(model, scales: str, fused: bool):
    """``model`` (plain, float32) with every projection computing through e4m3 at the scales fastgen.fp8 uses:
    "row", each output channel's; "tensor", the tensor's own, or with ``fused`` its group's (q+k+v, gate+up)
    largest value. lm_head stays as it is."""
    for layer in model.model.layers:
        for parent, groups in ((layer.self_attn, [("q_proj", "k_proj", "v_proj"), ("o_proj",)]),
                               (layer.mlp, [("gate_proj", "up_proj"), ("down_proj",)])):
            for group in groups if fused and scales == "tensor" else [(n,) for g in groups for n in g]:
                mods = [getattr(parent, n) for n in group]
                for name, mod in zip(group, mods, strict=True):
                    if scales == "row":
                        scale = mod.weight.detach().float().abs().amax(1) / fp8.FP8_MAX
                    else:
                        scale = torch.stack([m.weight.abs().max() for m in mods]).max().float() / fp8.FP8_MAX
                    setattr(parent, name, _Emulated(mod, scale.detach()))
    return model


@pytest.mark.parametrize("scales", ["row", "tensor"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_a_plain_model_decodes_as_one_whose_projections_compute_in_e4m3(do_sample: bool, scales: str) -> None:
    """No adapter: the shadow shares the weights (nothing fused), each projection has its own FP8 copy."""
    model = _tiny(21)
    ids, mask = _prompts(21)
    kw = {"do_sample": do_sample, "top_k": 20, "pad_token_id": 0}
    torch.manual_seed(3)
    got = fastgen.generate(model, ids, mask, 12, compile=False, fp8=scales, **kw)
    engine = fastgen.get_engine(model)
    assert engine.fp8_weights == 2 * 7 and engine.fused_gemms_saved == 0
    emulated = _emulate(_tiny(21), scales, fused=False)  # built first: _tiny seeds torch's generator
    torch.manual_seed(3)
    ref = emulated.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, **kw)
    assert torch.equal(ref, got)


@pytest.mark.parametrize("scales", ["row", "tensor"])
def test_a_lora_model_decodes_as_its_merge_in_e4m3_and_follows_adapter_updates(scales: str) -> None:
    """With an adapter the shadow owns merged weights, fused into groups (per tensor: one scale a group, as
    vLLM's fused q/k/v; row-wise: each row its own); after an optimizer step the FP8 copies are quantized again
    from the new merge."""
    model = peft.get_peft_model(_tiny(22), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(22)
    for step in range(2):
        got = fastgen.generate(model, ids, mask, 12, do_sample=False, pad_token_id=0, compile=False, fp8=scales)
        merged = peft.get_peft_model(_tiny(22), peft.LoraConfig(r=4, target_modules="all-linear",
                                                                init_lora_weights=False))
        merged.load_state_dict(model.state_dict())
        ref = _emulate(merged.merge_and_unload().eval(), scales, fused=True)
        want = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(want, got), step
        engine = fastgen.get_engine(model)
        assert engine.fp8_weights == 2 * 4 and engine.fused_gemms_saved == 2 * 3
        if step == 0:
            first = got
            _adapter_step(model)
    assert not torch.equal(first, got)  # the update reached the FP8 copies


def test_the_memory_plan_counts_the_fp8_copies(monkeypatch) -> None:
    from test_fastgen import _fake_gpu

    model = peft.get_peft_model(_tiny(23), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    ids, mask = _prompts(23)
    _fake_gpu(monkeypatch, free=64 * 2**30)
    engine = fastgen.get_engine(model, compile=False, memory_check=True, fp8="row")
    engine.generate(ids, mask, 4, fastgen.Sampling(do_sample=False))
    shadow, _kv = _new_bytes(model, engine)
    copies = {b.data_ptr(): b.numel() for n, b in engine.decoder.named_buffers() if n.endswith(".w8")}
    assert engine.last_plan is not None and engine.last_plan.shadow == shadow + sum(copies.values())
    assert len(copies) == engine.fp8_weights


def test_fp8_is_refused_where_it_cannot_serve(monkeypatch) -> None:
    lora = peft.get_peft_model(_tiny(24), peft.LoraConfig(r=4, target_modules="all-linear"))
    with pytest.raises(fastgen.FastgenError, match="fp8 needs the merged shadow"):
        fastgen.FastGenerator(lora, merge_lora=False, fp8="row")
    with pytest.raises(fastgen.FastgenError, match="reference_kernels .*fp8='row'"):
        fastgen.FastGenerator(lora, reference_kernels=True, fp8="row")
    with pytest.raises(fastgen.FastgenError, match="unknown fp8 'yes'"):
        fastgen.FastGenerator(lora, fp8="yes")
    fake_cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    assert "capability >= 8.9" in (fp8.unavailable(fake_cuda) or "") and "8.6" in (fp8.unavailable(fake_cuda) or "")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8.unavailable(fake_cuda) is None and fp8.unavailable(torch.device("cpu")) is None


def test_the_compiled_fp8_step_gives_the_eager_fp8_steps_tokens(monkeypatch) -> None:
    """The FP8 step through dynamo and AOT autograd (the stand-in for inductor here): the FP8 modules trace (no
    compile_error, so no silent eager fallback) and give the eager engine's exact tokens."""
    from test_fastgen import _compile_with

    model = peft.get_peft_model(_tiny(25), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    ids, mask = _prompts(25)
    want = fastgen.generate(model, ids, mask, 10, do_sample=False, pad_token_id=0, compile=False, fp8="row")
    fastgen.release(model)
    _compile_with(monkeypatch, "aot_eager")
    got = fastgen.generate(model, ids, mask, 10, do_sample=False, pad_token_id=0, compile=True, fp8="row")
    engine = fastgen.get_engine(model)
    assert engine.compile and engine.compile_error is None and engine._compiled_ok
    assert torch.equal(want, got)


def test_projections_whose_sizes_scaled_mm_cannot_take_stay_in_bf16(monkeypatch) -> None:
    """_scaled_mm takes inner and output sizes divisible by 16 on CUDA: an MLP of 72 columns keeps its bf16
    GEMMs (and the memory plan does not count copies that are never made), the attention goes through FP8."""
    from test_fastgen import _fake_gpu

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=True)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    ids, mask = _prompts(26)
    _fake_gpu(monkeypatch, free=64 * 2**30)
    engine = fastgen.get_engine(model, compile=False, memory_check=True, fp8="tensor")
    engine.generate(ids, mask, 4, fastgen.Sampling(do_sample=False))
    mlp = engine.decoder.model.layers[0].mlp
    assert type(mlp.down_proj) is torch.nn.Linear and engine.fp8_weights == 2 * 4
    shadow, _kv = _new_bytes(model, engine)
    copies = sum(b.numel() for n, b in engine.decoder.named_buffers() if n.endswith(".w8"))
    assert engine.last_plan is not None and engine.last_plan.shadow == shadow + copies


def test_a_fully_fine_tuned_plain_model_is_quantized_again_from_its_new_weights() -> None:
    """The shadow of a plain model shares its weights, which full fine-tuning changes between generations: the
    FP8 copies are quantized again at every refresh, so the tokens follow (those of the updated model in e4m3)."""
    model = _tiny(27)
    ids, mask = _prompts(27)
    first = fastgen.generate(model, ids, mask, 10, do_sample=False, pad_token_id=0, compile=False, fp8="row")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # what optimizer steps on every weight could do
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.add_(torch.randn(p.shape, generator=g) * p.abs().mean() * 3)
    got = fastgen.generate(model, ids, mask, 10, do_sample=False, pad_token_id=0, compile=False, fp8="row")
    updated = _tiny(27)
    updated.load_state_dict(model.state_dict())
    want = _emulate(updated, "row", fused=False).generate(input_ids=ids, attention_mask=mask, max_new_tokens=10,
                                                          do_sample=False, pad_token_id=0)
    assert torch.equal(want, got) and not torch.equal(first, got)


@pytest.mark.parametrize("rowwise", [True, False], ids=["row", "tensor"])
def test_the_cuda_branch_passes_torchs_own_checks_of_scaled_mm(rowwise: bool) -> None:
    """The GPU path (torch._scaled_mm) cannot run here, but torch checks its arguments in the op's meta function
    (layouts: the activation row-major, the weight column-major; sizes divisible by 16; scale shapes), which
    fake CUDA tensors run on the host: fp8.linear's CUDA branch on the Qwen3-4B q/k/v shape, a fused member's
    rows, and a [B, 1, K] decode input, in both granularities. (The checks refuse, e.g., a row-wise scale_b of
    shape [N] or a row-major weight: what this test would catch.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        w8 = torch.empty(6144, 2560, dtype=fp8.FP8, device="cuda")
        scale = torch.empty((6144,) if rowwise else (), dtype=torch.float32, device="cuda")
        x = torch.empty(8, 1, 2560, dtype=torch.bfloat16, device="cuda")
        out = fp8.linear(x, w8, scale)
        assert out.shape == (8, 1, 6144) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
        rows = fp8.linear(x, w8[4096:5120], scale[4096:5120] if rowwise else scale)
        assert rows.shape == (8, 1, 1024)
        with pytest.raises(RuntimeError, match="col_major"):
            torch._scaled_mm(torch.empty(8, 2560, dtype=fp8.FP8, device="cuda"), w8.t().contiguous(),
                             scale_a=torch.ones((), device="cuda"), scale_b=torch.ones((), device="cuda"),
                             out_dtype=torch.bfloat16)
