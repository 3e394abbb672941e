"""fastgen on the portable default path, on a real GPU: a model loaded by rlstack's Unsloth loader (4-bit QLoRA),
generated through the installed hook the way TRL calls it; plus the memory check against real CUDA memory.

The Unsloth test runs in a subprocess: unsloth must be imported before transformers, which pytest has imported by
then. It needs a stack with unsloth (portable) and prints one JSON line the test reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from rlstack.payload import fastgen  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[3]

UNSLOTH_SCRIPT = textwrap.dedent('''
    import json, sys
    import unsloth  # noqa: F401  (before transformers, as rlstack's loader does)
    import torch
    from rlstack.payload import fastgen, prompt
    from rlstack.payload.data import load_problems
    from rlstack.payload.recipes import LoraSpec, ModelSpec
    from rlstack.payload.train.loading import load_for_training

    name, real = sys.argv[1], sys.argv[2] == "1"
    spec = ModelSpec(name=name, load_in_4bit=True, loader="unsloth", max_seq_length=512)
    loaded = load_for_training(spec, LoraSpec(r=16, alpha=16), seed=0)
    model, tok = loaded.model, loaded.tokenizer
    tok.padding_side = "left"
    texts = [prompt.render(tok, p.question) for p in load_problems("generated-easy:8", split="test")]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to("cuda")
    from transformers import GenerationConfig
    gc = GenerationConfig(max_new_tokens=48, do_sample=False, pad_token_id=tok.pad_token_id,
                          eos_token_id=tok.eos_token_id, top_k=None, top_p=1.0, temperature=1.0)
    base = model.get_base_model()
    unsloth_generate = base.generate  # Unsloth's instance-level generate (FastLlamaModel.from_pretrained)
    calls = []
    def counted(*a, **k):
        calls.append(1)
        return unsloth_generate(*a, **k)
    base.generate = counted
    ref = model.generate(**enc, generation_config=gc)
    before = len(calls)
    fastgen.install(model)
    model.train()  # TRL generates with the policy in train mode
    with torch.no_grad():
        got = model.generate(**enc, generation_config=gc, disable_compile=True)
    engine = model.__dict__.get("_rlstack_fastgen_engine")
    p = enc["input_ids"].shape[1]
    same = [tok.decode(r[p:], skip_special_tokens=True) == tok.decode(g[p:], skip_special_tokens=True)
            for r, g in zip(ref, got)]
    print("RESULT " + json.dumps({
        "loader": loaded.loader, "failure": fastgen.failure(model), "unsloth_generate_calls_by_fastgen":
        len(calls) - before, "patches": engine.patches if engine else None,
        "dtype": str(engine.dtype) if engine else None, "same_text": sum(same), "rows": len(same),
        "plan": engine.last_plan.__dict__ if engine and engine.last_plan else None}))
''')


def _model_name() -> tuple[str, bool]:
    """The embedded pretrained model when it is here (real weights: text agreement means something), else the
    project's tiny model (structure only)."""
    from rlstack.payload import embedded

    try:
        return str(embedded.ensure("embedded:smollm2-135m")), True
    except embedded.EmbeddedModelError:
        from rlstack.payload import tiny
        from rlstack.payload.recipes import TinySpec

        return str(tiny.ensure(TinySpec(tie_word_embeddings=False))), False


def test_unsloth_qlora_model_is_served_by_fastgen_not_unsloths_generate() -> None:
    import importlib.util

    if importlib.util.find_spec("unsloth") is None:
        pytest.skip("unsloth is not installed in this stack (the portable stack has it)")
    name, real = _model_name()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", UNSLOTH_SCRIPT, name, "1" if real else "0"], capture_output=True,
                         text=True, timeout=900, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-4000:]
    res = json.loads(lines[-1][len("RESULT "):])
    assert res["loader"] == "unsloth"
    assert res["failure"] is None, res
    assert res["unsloth_generate_calls_by_fastgen"] == 0, res
    assert res["patches"], "Unsloth patched the model classes; the shadow must come from a pristine copy"
    assert res["dtype"] == "torch.bfloat16", res
    if real:  # bf16 eager (Unsloth) vs a compiled graph may split a rare near-tie
        assert res["same_text"] >= res["rows"] - 1, res


def _peft_model(hidden: int = 1024, layers: int = 8):
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                                   num_attention_heads=16, num_key_value_heads=4, head_dim=64, vocab_size=32000,
                                   tie_word_embeddings=True, max_position_embeddings=2048)
    with torch.device("cuda"):
        base = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    return peft.get_peft_model(base, peft.LoraConfig(r=16, target_modules="all-linear", init_lora_weights=False))


def _inputs(batch: int = 8, length: int = 64):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 32000, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :9] = 0
    ids[mask == 0] = 0
    return ids.cuda(), mask.cuda()


def test_memory_plan_against_what_cuda_allocates() -> None:
    """The plan's shadow + KV bytes are allocated and kept; everything retained stays within plan + margin."""
    model = _peft_model()
    ids, mask = _inputs()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    engine = fastgen.get_engine(model)
    engine.generate(ids, mask, 64, fastgen.Sampling(do_sample=False))
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    plan = engine.last_plan
    assert plan is not None and plan.shadow > 0 and plan.kv > 0
    assert plan.shadow + plan.kv <= kept <= plan.total + plan.margin, (kept, plan)


def test_memory_refusal_on_cuda_falls_back_to_generate(monkeypatch) -> None:
    model = _peft_model(hidden=256, layers=2)
    model.eval()
    ids, mask = _inputs()
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 80 * 2**30))
    fastgen.install(model)
    got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert "FastgenMemoryError" in (fastgen.failure(model) or "")
    assert torch.equal(ref, got)


def test_a_4bit_base_is_dequantized_straight_into_the_merged_weight(tmp_path, monkeypatch) -> None:
    """On CUDA the shadow's refresh dequantizes a bitsandbytes NF4 base into the merged weight itself
    (bitsandbytes' ``out=``), then adds the LoRA as one GEMM: the merged weight is the dequantized base plus
    ``scale * B @ A`` within one bf16 rounding (and the adapter's float32 factors rounded to bf16)."""
    bnb = pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as bnbf
    from peft.tuners.lora import LoraLayer

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=64, vocab_size=1024, tie_word_embeddings=True,
                                   max_position_embeddings=1024)
    transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                            bnb_4bit_compute_dtype=torch.bfloat16)
    model = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, quantization_config=quant, device_map="cuda",
                                                          **{dtype_kw: torch.bfloat16})
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False))
    real = bnbf.dequantize_4bit
    outs: list[bool] = []
    monkeypatch.setattr(bnbf, "dequantize_4bit", lambda *a, **kw: (outs.append("out" in kw), real(*a, **kw))[1])
    engine = fastgen.FastGenerator(model, compile=False)  # the refresh is the subject: no step to compile
    ids, mask = _inputs(batch=4, length=16)
    engine.generate(ids.clamp_max(1023), mask, 4, fastgen.Sampling(do_sample=False))
    assert outs and all(outs), outs  # every 4-bit base dequantized in place, none through a new tensor
    shadow = dict(engine.decoder.named_modules())
    for name, layer in model.base_model.model.named_modules():
        if not isinstance(layer, LoraLayer) or name not in shadow:
            continue
        base = layer.get_base_layer()
        assert isinstance(base, bnb.nn.Linear4bit), name
        a, b = layer.lora_A["default"].weight.double(), layer.lora_B["default"].weight.double()
        scale = layer.scaling["default"]
        exact = real(base.weight.data, base.weight.quant_state).double() + scale * b @ a
        bound = torch.finfo(torch.bfloat16).eps * (exact.abs() + 2 * scale * b.abs() @ a.abs())
        assert ((shadow[name].weight.double() - exact).abs() <= bound).all(), name
