"""`rlstack eval`: accuracy on GSM8K (or a JSONL / generated problems) with the training prompt and extraction.

Greedy decoding, a fixed question order (the first N of the split, no shuffle) and a fixed seed, so a base run
and a tuned run score the same questions and `compare` can pair them. Every raw generation is saved with its
extracted answer (generations.jsonl) so results can be re-scored offline (`rlstack rescore`) when the extractor
improves; results.json holds accuracy, Wilson interval, counts, config, versions and timings.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from rlstack import __version__
from rlstack.core.fileio import check_folder
from rlstack.payload import adapters, prompt
from rlstack.payload.evaluate.scoring import EvalError, score
from rlstack.payload.recipes import EvalSpec, ModelSpec, TinySpec

VERSION_PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "unsloth", "vllm", "bitsandbytes")


class EvalConfig(EvalSpec):
    """One evaluation: the recipe's [eval] options (recipes.EvalSpec, declared there once) and what the run adds:
    which model and adapter, how the base is loaded, the decoding path and the output folder."""

    model: str | None = None  # base model; default: the adapter's manifest base_model
    adapter: str | None = None
    load_in_4bit: bool = False
    load_in_fp8: bool = False  # vllm backend: quantization="fp8"
    fastgen: bool = False  # hf backend: greedy decoding through rlstack's fastgen instead of transformers' generate
    # with fastgen: transformers' own kernels in a CUDA graph (FastGenerator reference_kernels): generate's tokens
    reference_kernels: bool = False
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    tiny: dict[str, Any] | None = None  # [model.tiny] of a recipe, for --model tiny without an adapter
    output: Path | None = None


def versions() -> dict[str, str]:
    out = {"rlstack": __version__, "python": platform.python_version()}
    for name in VERSION_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _base_for(cfg: EvalConfig) -> tuple[str, str, Path | None, adapters.Manifest | None, ModelSpec | None]:
    """(what to load, base id, adapter folder, manifest, model spec from the adapter's recipe)."""
    adapter_dir = manifest = spec = None
    if cfg.adapter:
        adapter_dir = adapters.find_adapter(cfg.adapter)
        manifest = adapters.verify(adapter_dir, expected_base_model=cfg.model if cfg.model != "tiny" else None)
        try:
            spec = ModelSpec.model_validate(manifest.recipe.get("model", {}))
        except Exception:
            spec = None
    base_id = (manifest.base_model if manifest and cfg.model in (None, "tiny") else cfg.model)
    if not base_id:
        raise EvalError("no model to evaluate", "pass --model NAME (the base) and/or --adapter NAME")
    if base_id == "tiny" or base_id.startswith("tiny-"):
        from rlstack.payload import tiny

        tspec = spec.tiny if spec and spec.tiny else TinySpec.model_validate(cfg.tiny or {})
        if base_id == "tiny":
            base_id = tiny.model_id(tspec)
        if tiny.model_id(tspec) != base_id:
            raise EvalError(f"cannot rebuild tiny base {base_id}: the adapter's recipe describes "
                            f"{tiny.model_id(tspec)}", "evaluate with the adapter this base was trained for")
        return str(tiny.ensure(tspec)), base_id, adapter_dir, manifest, spec
    from rlstack.payload import embedded

    if embedded.is_embedded(base_id):
        return str(embedded.ensure(base_id)), base_id, adapter_dir, manifest, spec
    from rlstack.payload.train.loading import check_model_name

    check_model_name(base_id)
    return base_id, base_id, adapter_dir, manifest, spec


def generate_inputs(model: Any, encoding: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a tokenizer's encoding that `model.generate` accepts.

    Tokenizers may return more than the model takes: under transformers 4.57.6 the tokenizer returned
    token_type_ids on a GPU eval, and generate() rejects them for Qwen3/Llama with "ValueError: The
    following `model_kwargs` are not used by the model: ['token_type_ids']" (signature
    hf-generate-unused-token-type-ids). generate() checks keys against the parameter *names* of forward(), so
    we keep input_ids, attention_mask and whatever else forward() names explicitly (a model that does use
    token_type_ids still gets them). A PEFT model's own forward() is a generic wrapper, so we read the base's.
    """
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    keep = {"input_ids", "attention_mask"}
    try:
        params = list(inspect.signature(inner.forward).parameters.values())
    except (AttributeError, TypeError, ValueError):  # no inspectable forward: the two inputs every LM takes
        params = []
    keep |= {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return {k: v for k, v in encoding.items() if k in keep}


def _generate_hf(target: str, adapter_dir: Path | None, cfg: EvalConfig, questions: list[str]) -> tuple[
        list[str], list[int], dict[str, float], str]:
    import torch

    from rlstack.payload.train.loading import load_base_transformers

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model, tokenizer, loader, device = load_base_transformers(
        target, ModelSpec(name=target, load_in_4bit=cfg.load_in_4bit))
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    load_s = time.perf_counter() - t0
    prompts = [prompt.render(tokenizer, q, cfg.chat_template_kwargs) for q in questions]
    outputs, lengths, gen_s, how = generate_batches(model, tokenizer, prompts, cfg)
    return outputs, lengths, {"load_s": load_s, "generate_s": gen_s}, f"{loader}@{device}{how}"


def generate_batches(model: Any, tokenizer: Any, prompts: list[str], cfg: EvalConfig) -> tuple[
        list[str], list[int], float, str]:
    """The hf backend's decoding of rendered prompts: batches of cfg.batch_size in order, left padding, greedy,
    cfg.max_new_tokens, through fastgen when cfg.fastgen. Returns texts, new-token counts, seconds, and '' or
    '+fastgen' ('+fastgen-reference' with its reference kernels; '+fastgen-fell-back (why)') for the engine label.
    bench/eval_throughput.py times this."""
    import torch

    tokenizer.padding_side = "left"
    outputs: list[str] = []
    lengths: list[int] = []
    fast = _FastEval(model, tokenizer, cfg.max_new_tokens, cfg.reference_kernels) if cfg.fastgen else None
    # fastgen compiles and captures one decode step per (batch, cache length): with each batch padded to its own
    # longest prompt, and a short last batch, an eval of 300 questions met several shapes, each a recompile of
    # the 4B model (tens of seconds). So for fastgen every batch is left-padded to the longest prompt of the whole
    # set and the last one filled up with copies of its last prompt (their outputs dropped): one shape, one
    # compile. transformers' generate keeps its per-batch padding (its cost does not depend on shapes).
    width = max((len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]), default=0) \
        if fast is not None else 0
    t1 = time.perf_counter()
    for i in range(0, len(prompts), cfg.batch_size):
        batch = prompts[i:i + cfg.batch_size]
        real = len(batch)
        if fast is not None and fast.failed is None:
            batch = batch + [batch[-1]] * (min(cfg.batch_size, len(prompts)) - real)
            pad: dict[str, Any] = {"padding": "max_length", "max_length": width}
        else:
            pad = {"padding": True}
        enc = tokenizer(batch, return_tensors="pt", add_special_tokens=False, **pad).to(model.device)
        out = fast.generate(enc) if fast is not None else None
        if out is None and len(batch) > real:  # fastgen fell back on this batch: the filler rows go
            batch = batch[:real]
            enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        if out is None:
            with torch.inference_mode():
                # eos comes from the model's generation_config (Qwen3 lists two stop tokens; the tokenizer knows
                # one).
                out = model.generate(**generate_inputs(model, enc), max_new_tokens=cfg.max_new_tokens,
                                     do_sample=False, pad_token_id=tokenizer.pad_token_id)
        new = out[:real, enc["input_ids"].shape[1]:]
        for row in new:
            ids = [int(t) for t in row if int(t) != tokenizer.pad_token_id]
            lengths.append(len(ids))
            outputs.append(tokenizer.decode(ids, skip_special_tokens=True))
        print(f"rlstack eval: {min(i + cfg.batch_size, len(prompts))}/{len(prompts)} generated",
              file=sys.stderr, flush=True)
    gen_s = time.perf_counter() - t1
    how = ""
    if fast is not None:
        how = ("+fastgen-reference" if cfg.reference_kernels else "+fastgen") if fast.failed is None \
            else f"+fastgen-fell-back ({fast.failed})"
    return outputs, lengths, gen_s, how


class _FastEval:
    """Greedy eval batches through rlstack's fastgen (static KV cache, LoRA merged into a bf16 shadow, CUDA graphs
    on a GPU), with transformers' generate's own stopping rules: the model's generation_config (eos ids, pad),
    do_sample off, max_new_tokens. Any failure of the fast path is said once and the rest of the run, that batch
    included, goes through transformers' generate (the training hook's rule). ``reference_kernels``: the engine's
    option of that name (transformers' own kernels, for generate's tokens), applied when the engine is created."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int, reference_kernels: bool = False) -> None:
        import copy

        from rlstack.payload.fastgen.options import FastgenOptions

        self.model = model
        self.options = FastgenOptions(reference_kernels=True) if reference_kernels else None
        self.failed: str | None = None
        self.config = copy.deepcopy(model.generation_config)
        self.config.do_sample = False
        self.config.max_new_tokens = max_new_tokens
        self.config.pad_token_id = tokenizer.pad_token_id

    def generate(self, enc: Any) -> Any:
        if self.failed is not None:
            return None
        from rlstack.payload import fastgen
        from rlstack.payload.fastgen.hook import say_how_once

        try:
            out = fastgen.generate(self.model, enc["input_ids"], enc["attention_mask"],
                                   generation_config=self.config, options=self.options)
            say_how_once(self.model, "rlstack eval: fastgen")  # which path the generations took, as train says it
            return out
        except Exception as exc:  # the fast path is an optimisation: never the reason an evaluation fails
            self.failed = fastgen.error_text(exc)
            fastgen.release(self.model)  # its shadow and graphs hold memory transformers' generate may need
            print(f"rlstack eval: fastgen failed ({self.failed}); transformers' generate does the rest",
                  file=sys.stderr, flush=True)
            return None


def _generate_vllm(target: str, adapter_dir: Path | None, manifest: adapters.Manifest | None, cfg: EvalConfig,
                   questions: list[str]) -> tuple[list[str], list[int], dict[str, float], str]:
    """vLLM with the LoRA adapter as a LoRARequest (the fp8 stack's path)."""
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError:
        raise EvalError("the vllm backend needs vllm, which is not installed in this stack",
                        "use --backend hf, or run in the fp8 stack: invoke eval --stack fp8") from None
    # Greedy decoding never reaches top-k/top-p sampling (vllm 0.21 v1/sample/sampler.py), yet vLLM's start-up
    # dummy sampler run makes FlashInfer JIT-compile its sampling module with nvcc when that sampler is on:
    # a cost on every cold start (measured: docs/archive/notes.md). Off unless the user chose otherwise.
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    t0 = time.perf_counter()
    rank = int((manifest.recipe.get("lora") or {}).get("r", 64)) if manifest else 64
    extra: dict[str, Any] = {"quantization": "fp8"} if cfg.load_in_fp8 else {}
    if cfg.vllm_gpu_memory_utilization is not None:
        extra["gpu_memory_utilization"] = cfg.vllm_gpu_memory_utilization
    if cfg.vllm_enforce_eager:
        extra["enforce_eager"] = True
    try:
        llm = LLM(model=target, enable_lora=adapter_dir is not None, max_lora_rank=max(rank, 8), seed=cfg.seed,
                  **extra)
    except ValueError as exc:
        if "memory utilization" not in str(exc):
            raise
        raise EvalError(f"vLLM could not take its share of the GPU: {str(exc)[:400]}",
                        "other processes hold GPU memory: set eval.vllm_gpu_memory_utilization in the recipe to a "
                        "share that is free (nvidia-smi shows what is used), or wait for them") from exc
    load_s = time.perf_counter() - t0
    tokenizer = llm.get_tokenizer()
    prompts = [prompt.render(tokenizer, q, cfg.chat_template_kwargs) for q in questions]
    params = SamplingParams(temperature=0.0, max_tokens=cfg.max_new_tokens, seed=cfg.seed)
    lora = LoRARequest("adapter", 1, str(adapter_dir)) if adapter_dir is not None else None
    t1 = time.perf_counter()
    results = llm.generate(prompts, params, lora_request=lora)
    gen_s = time.perf_counter() - t1
    texts = [r.outputs[0].text for r in results]
    lengths = [len(r.outputs[0].token_ids) for r in results]
    return texts, lengths, {"load_s": load_s, "generate_s": gen_s}, "vllm"


def default_runs_dir() -> Path:
    return Path(os.environ.get("RLSTACK_RUNS", "runs"))


def default_output(cfg: EvalConfig, base_id: str) -> Path:
    label = Path(cfg.adapter).name if cfg.adapter else base_id.replace("/", "_")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return default_runs_dir() / "eval" / f"{label}-{cfg.backend}-{stamp}"


def run(cfg: EvalConfig) -> dict[str, Any]:
    from rlstack.payload.data import load_problems

    target, base_id, adapter_dir, manifest, _ = _base_for(cfg)
    problems = load_problems(cfg.data, split=cfg.split, n=cfg.n, seed=cfg.seed, shuffle=False)
    out_dir = check_folder(cfg.output or default_output(cfg, base_id), "--output")
    out_dir.mkdir(parents=True, exist_ok=True)
    questions = [p.question for p in problems]
    if cfg.backend == "hf":
        texts, lengths, timings, engine = _generate_hf(target, adapter_dir, cfg, questions)
    elif cfg.backend == "vllm":
        texts, lengths, timings, engine = _generate_vllm(target, adapter_dir, manifest, cfg, questions)
    else:
        raise EvalError(f"unknown backend {cfg.backend!r}", "use --backend hf or --backend vllm")
    rows = [{"id": p.id, "question": p.question, "reference": p.answer, "generation": t, "new_tokens": n}
            for p, t, n in zip(problems, texts, lengths, strict=True)]
    scored = score(rows)
    gen_path = out_dir / "generations.jsonl"
    gen_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    total_tokens = sum(lengths)
    timings["new_tokens_per_s"] = total_tokens / timings["generate_s"] if timings["generate_s"] else 0.0
    result = {
        **{k: v for k, v in scored.items() if not k.startswith("per_question")},
        "config": {"model": base_id, "adapter": str(adapter_dir) if adapter_dir else None,
                   "adapter_name": manifest.name if manifest else None, "backend": cfg.backend, "engine": engine,
                   "data": cfg.data, "split": cfg.split, "n_requested": cfg.n, "seed": cfg.seed,
                   "batch_size": cfg.batch_size, "max_new_tokens": cfg.max_new_tokens, "greedy": True,
                   "load_in_4bit": cfg.load_in_4bit, "load_in_fp8": cfg.load_in_fp8,
                   **({"vllm_enforce_eager": True} if cfg.backend == "vllm" and cfg.vllm_enforce_eager else {}),
                   "chat_template_kwargs": cfg.chat_template_kwargs, "prompt_version": prompt.PROMPT_VERSION},
        "stack": os.environ.get("RLSTACK_STACK", "native"),
        "lock_hash": adapters.resolve_lock_hash(),
        "versions": versions(),
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "generations": gen_path.name,
        "per_question": scored["per_question"],
        "per_question_format": scored["per_question_format"],
        "per_question_identity": scored.get("per_question_identity"),
    }
    (out_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    result["output_dir"] = str(out_dir)
    print(f"rlstack eval: accuracy {result['accuracy']:.4f} ({result['correct']}/{result['n']}), Wilson 95% "
          f"[{result['wilson_95'][0]:.4f}, {result['wilson_95'][1]:.4f}]; format {result['format_rate']:.4f} "
          f"({result['format_ok']}/{result['n']}) -> {out_dir / 'results.json'}", file=sys.stderr)
    return result
