"""`rlstack eval --backend hf` gives generate() only what the model takes.

Under transformers 4.57.6 the tokenizer returned token_type_ids and the whole encoding went to generate(), which
died with "The following `model_kwargs` are not used by the model: ['token_type_ids']" on a GPU. These tests
make the tiny local model's tokenizer return token_type_ids, as that one did, and run the real eval path."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlstack.payload.evaluate import gsm8k  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model() -> tuple[Any, Any]:
    from rlstack.payload import tiny
    from rlstack.payload.recipes import TinySpec

    return tiny.build(TinySpec(vocab_size=200, tokenizer_corpus=300))


@pytest.fixture
def tokenizer_with_type_ids(tiny_model: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    tok = tiny_model[1]
    monkeypatch.setattr(tok, "model_input_names", ["input_ids", "token_type_ids", "attention_mask"])
    assert "token_type_ids" in tok(["so 5 + 3 ="], return_tensors="pt"), "the tokenizer must return them"
    return tok


def test_hf_eval_generates_without_token_type_ids(tiny_model: tuple[Any, Any], tokenizer_with_type_ids: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model
    from rlstack.payload.train import loading

    monkeypatch.setattr(loading, "load_base_transformers", lambda target, spec: (model, tok, "transformers", "cpu"))
    calls: list[dict[str, Any]] = []
    real_generate = model.generate

    def spy(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return real_generate(**kwargs)

    monkeypatch.setattr(model, "generate", spy)
    cfg = gsm8k.EvalConfig(model="tiny", batch_size=2, max_new_tokens=2)
    texts, lengths, _, engine = gsm8k._generate_hf("tiny", None, cfg, ["What is 2 + 3?", "What is 10 - 4?", "1+1?"])
    assert len(texts) == 3 and len(lengths) == 3 and engine == "transformers@cpu"
    assert len(calls) == 2
    for kwargs in calls:
        assert "token_type_ids" not in kwargs
        assert {"input_ids", "attention_mask"} <= set(kwargs)
        assert kwargs["attention_mask"].shape == kwargs["input_ids"].shape


class _TypedForward:
    """A model whose forward names token_type_ids (BERT-style): it must still receive them."""

    def forward(self, input_ids: Any = None, attention_mask: Any = None, token_type_ids: Any = None,
                **kwargs: Any) -> None: ...


class _PeftLike:
    """A PEFT wrapper: its own forward is generic; the base model's signature is the one that counts."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def get_base_model(self) -> Any:
        return self.base

    def forward(self, *args: Any, **kwargs: Any) -> None: ...


ENC = {"input_ids": 1, "attention_mask": 2, "token_type_ids": 3, "pixel_values": 4}


def test_generate_inputs_keeps_what_forward_names(tiny_model: tuple[Any, Any]) -> None:
    assert gsm8k.generate_inputs(tiny_model[0], ENC) == {"input_ids": 1, "attention_mask": 2}
    assert gsm8k.generate_inputs(_TypedForward(), ENC) == {"input_ids": 1, "attention_mask": 2, "token_type_ids": 3}


def test_generate_inputs_looks_through_peft(tiny_model: tuple[Any, Any]) -> None:
    assert gsm8k.generate_inputs(_PeftLike(_TypedForward()), ENC) == {"input_ids": 1, "attention_mask": 2,
                                                                       "token_type_ids": 3}
    peft = pytest.importorskip("peft")
    wrapped = peft.get_peft_model(tiny_model[0], peft.LoraConfig(r=2, target_modules=["q_proj"]))
    try:
        assert gsm8k.generate_inputs(wrapped, ENC) == {"input_ids": 1, "attention_mask": 2}
    finally:
        wrapped.unload()  # the tiny model is shared by the module's tests


def test_generate_inputs_without_inspectable_forward() -> None:
    assert gsm8k.generate_inputs(object(), ENC) == {"input_ids": 1, "attention_mask": 2}


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, seen: dict[str, Any], refuse: str | None = None) -> None:
    """A stand-in `vllm` whose LLM records its keyword arguments and the sampler variable in `seen`, and raises
    ValueError(refuse) at start when `refuse` is given, as vLLM does when the GPU has too little free memory."""
    import sys
    import types

    class Out:
        text, token_ids = "#### 1", [1]

    class LLM:
        def __init__(self, **kw: Any) -> None:
            import os

            seen["sampler"] = os.environ.get("VLLM_USE_FLASHINFER_SAMPLER")
            seen["kw"] = kw
            if refuse:
                raise ValueError(refuse)

        def get_tokenizer(self) -> Any:
            return types.SimpleNamespace(chat_template=None)

        def generate(self, prompts: list[str], params: Any, lora_request: Any = None) -> list[Any]:
            return [types.SimpleNamespace(outputs=[Out()]) for _ in prompts]

    vllm = types.ModuleType("vllm")
    vllm.LLM = LLM  # type: ignore[attr-defined]
    vllm.SamplingParams = lambda **kw: kw  # type: ignore[attr-defined]
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda *a: a  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    monkeypatch.setattr(gsm8k.prompt, "render", lambda tok, q, kw: q)


def test_vllm_eval_starts_without_flashinfer_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy eval never samples, so the FlashInfer sampler's JIT compile (~100 s per cold start on an H200) is
    off when the engine starts; a user's own VLLM_USE_FLASHINFER_SAMPLER wins. vllm is a stand-in here."""
    seen: dict[str, Any] = {}
    _fake_vllm(monkeypatch, seen)
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER", raising=False)
    texts, _, _, engine = gsm8k._generate_vllm("m", None, None, gsm8k.EvalConfig(backend="vllm"), ["q1", "q2"])
    assert seen["sampler"] == "0" and texts == ["#### 1", "#### 1"] and engine == "vllm"
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "1")
    gsm8k._generate_vllm("m", None, None, gsm8k.EvalConfig(backend="vllm"), ["q"])
    assert seen["sampler"] == "1"


def test_vllm_eval_takes_the_recipes_share_of_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """eval.vllm_gpu_memory_utilization reaches the engine (unset: vLLM's own default, nothing passed), and an
    engine that finds too little free memory ends in an error that names the option."""
    from rlstack.payload import recipes

    seen: dict[str, Any] = {}
    _fake_vllm(monkeypatch, seen)
    gsm8k._generate_vllm("m", None, None, gsm8k.EvalConfig(backend="vllm"), ["q"])
    assert "gpu_memory_utilization" not in seen["kw"]
    share = recipes.load("smollm2-gpu").eval.vllm_gpu_memory_utilization
    assert share is not None and share < 0.5
    gsm8k._generate_vllm("m", None, None, gsm8k.EvalConfig(backend="vllm", vllm_gpu_memory_utilization=share), ["q"])
    assert seen["kw"]["gpu_memory_utilization"] == share and "enforce_eager" not in seen["kw"]
    gsm8k._generate_vllm("m", None, None, gsm8k.EvalConfig(backend="vllm", vllm_enforce_eager=True), ["q"])
    assert seen["kw"]["enforce_eager"] is True
    _fake_vllm(monkeypatch, seen, refuse="Free memory on device (9.1/79.1 GiB) on startup is less than desired GPU "
               "memory utilization (0.9, 71.2 GiB).")
    with pytest.raises(gsm8k.EvalError, match="share of the GPU") as exc:
        gsm8k._generate_vllm("m", None, None, gsm8k.EvalConfig(backend="vllm"), ["q"])
    assert "eval.vllm_gpu_memory_utilization" in exc.value.hint
    _fake_vllm(monkeypatch, seen, refuse="some other engine problem")
    with pytest.raises(ValueError, match="other engine problem"):
        gsm8k._generate_vllm("m", None, None, gsm8k.EvalConfig(backend="vllm"), ["q"])


QUESTIONS = ["What is 2 + 3?", "What is 10 - 4?", "Tom has 3 apples and buys 4 more. How many now?"]


@pytest.mark.parametrize("lora", [False, True])
def test_hf_eval_through_fastgen_gives_the_same_tokens(tiny_model: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], lora: bool) -> None:
    """`rlstack eval --fastgen`: the same greedy generations as transformers' generate (LoRA merged into the
    shadow when there is an adapter), and the engine says which path ran: in its label, and once on stderr
    how fastgen generated."""
    model, tok = tiny_model
    if lora:
        import peft

        torch.manual_seed(1)
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                           target_modules=["q_proj", "v_proj"]))
    from rlstack.payload.train import loading

    monkeypatch.setattr(loading, "load_base_transformers", lambda target, spec: (model, tok, "transformers", "cpu"))
    cfg = gsm8k.EvalConfig(model="tiny", batch_size=2, max_new_tokens=12)
    ref, ref_lengths, _, engine = gsm8k._generate_hf("tiny", None, cfg, QUESTIONS)
    assert engine == "transformers@cpu"
    cfg.fastgen = True
    got, got_lengths, _, engine = gsm8k._generate_hf("tiny", None, cfg, QUESTIONS)
    assert engine == "transformers@cpu+fastgen"
    assert got == ref and got_lengths == ref_lengths
    said = [x for x in capsys.readouterr().err.splitlines() if x.startswith("rlstack eval: fastgen generating with")]
    # a bf16/float32 base's own weights are shared with the shadow, not copied, so only groups whose every member
    # the shadow owns are fused (all LoRA'd, or a dequantized 4-bit base): LoRA on q and v alone fuses none
    assert len(said) == 1 and "projections apart" in said[0] and ("LoRA merged" in said[0]) == lora
    if lora:
        model.unload()


def test_hf_eval_through_fastgen_compiles_one_shape_for_the_whole_set(tiny_model: tuple[Any, Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompts of different lengths in batches of 2 with a short last one: fastgen sees one (batch, cache length)
    (each distinct shape is a compile of the model on a GPU), and the texts are still transformers' generate's."""
    from rlstack.payload.fastgen.keywords import ENGINE_ATTR
    from rlstack.payload.train import loading

    model, tok = tiny_model
    vars(model).pop(ENGINE_ATTR, None)  # an engine left by another test would hold its shapes
    questions = [*QUESTIONS, "What is 7 times 8, and then add 100 to the result of that?", "1 + 1?"]
    monkeypatch.setattr(loading, "load_base_transformers", lambda target, spec: (model, tok, "transformers", "cpu"))
    cfg = gsm8k.EvalConfig(model="tiny", batch_size=2, max_new_tokens=40)
    ref, ref_lengths, _, _ = gsm8k._generate_hf("tiny", None, cfg, questions)
    cfg.fastgen = True
    got, got_lengths, _, engine = gsm8k._generate_hf("tiny", None, cfg, questions)
    assert engine == "transformers@cpu+fastgen"
    assert got == ref and got_lengths == ref_lengths and len(got) == len(questions)
    widths = {len(ids) for ids in tok(questions, add_special_tokens=False)["input_ids"]}
    assert len(widths) > 1  # the prompts differ in length, so per-batch padding would have made several shapes
    shapes = list(vars(model)[ENGINE_ATTR]._caches)
    assert len(shapes) == 1 and shapes[0][0] == 2  # the last question came with a filler row
    vars(model).pop(ENGINE_ATTR, None)


def test_hf_eval_fastgen_failure_falls_back_once(tiny_model: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    model, tok = tiny_model
    from rlstack.payload import fastgen
    from rlstack.payload.train import loading

    monkeypatch.setattr(loading, "load_base_transformers", lambda target, spec: (model, tok, "transformers", "cpu"))
    cfg = gsm8k.EvalConfig(model="tiny", batch_size=2, max_new_tokens=6)
    ref, _, _, _ = gsm8k._generate_hf("tiny", None, cfg, QUESTIONS)
    calls: list[int] = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise RuntimeError("CUDA graph capture failed")

    monkeypatch.setattr(fastgen, "generate", broken)
    fastgen.get_engine(model, compile=False)  # an engine from earlier use, holding its shadow
    cfg.fastgen = True
    got, _, _, engine = gsm8k._generate_hf("tiny", None, cfg, QUESTIONS)
    assert got == ref and len(calls) == 1  # tried once, then transformers' generate for every batch
    from rlstack.payload.fastgen.keywords import ENGINE_ATTR

    assert ENGINE_ATTR not in vars(model)  # dropped: its memory is the fallback's
    assert engine.startswith("transformers@cpu+fastgen-fell-back (RuntimeError: CUDA graph capture failed")
    assert capsys.readouterr().err.count("fastgen failed") == 1


def test_fastgen_is_refused_for_the_vllm_backend() -> None:
    from rlstack.core.errors import RlstackError
    from rlstack.payload.commands import eval_

    with pytest.raises(RlstackError, match="--fastgen is for the hf backend"):
        eval_(model="tiny", backend="vllm", fastgen=True, n=1, data="generated:4")


def test_hf_eval_with_fastgens_reference_kernels_gives_the_same_tokens_and_says_so(
        tiny_model: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`rlstack eval --fastgen --reference-kernels`: the engine decodes through the model itself (no shadow), the
    texts are transformers' generate's, and the label and the stderr line name the path."""
    from rlstack.payload.fastgen.keywords import ENGINE_ATTR
    from rlstack.payload.train import loading

    model, tok = tiny_model
    vars(model).pop(ENGINE_ATTR, None)
    monkeypatch.setattr(loading, "load_base_transformers", lambda target, spec: (model, tok, "transformers", "cpu"))
    cfg = gsm8k.EvalConfig(model="tiny", batch_size=2, max_new_tokens=12)
    ref, ref_lengths, _, _ = gsm8k._generate_hf("tiny", None, cfg, QUESTIONS)
    cfg.fastgen = cfg.reference_kernels = True
    got, got_lengths, _, engine = gsm8k._generate_hf("tiny", None, cfg, QUESTIONS)
    assert engine == "transformers@cpu+fastgen-reference"
    assert got == ref and got_lengths == ref_lengths
    assert vars(model)[ENGINE_ATTR].decoder is model
    said = [x for x in capsys.readouterr().err.splitlines() if x.startswith("rlstack eval: fastgen generating with")]
    assert len(said) == 1 and "transformers' kernels" in said[0]
    vars(model).pop(ENGINE_ATTR, None)


def test_reference_kernels_without_fastgen_are_refused() -> None:
    from rlstack.core.errors import RlstackError
    from rlstack.payload.commands import eval_

    with pytest.raises(RlstackError, match="--reference-kernels .* needs --fastgen"):
        eval_(model="tiny", reference_kernels=True, n=1, data="generated:4")
