"""Rollout engines side by side in one lease (issue 14): vLLM bf16 / bf16 + LoRA / fp8, rlstack's fastgen through
the stack's default loader, Unsloth's own generate, TRL's default generate, transformers' static cache + compile,
and TRL's paged (continuous batching) path. Same model shape (Qwen3-4B, random bf16 weights), same prompts, same
sampling (temperature 1, top_p 1, top_k 50, 512 new tokens fixed), batches of 8 and 64 sequences.

Why per stack and per process: vLLM is in the fp8 stack's lock, Unsloth in the portable stack's; each engine runs in
its own Python process (Unsloth patches transformers' classes at import; vLLM keeps its memory pools), so one
`run` per stack measures the engines it has and a `merge` joins the rows. One run id per lease: `prepare` writes it
next to the model, every row carries it, `merge` refuses rows of another lease.

Device side (PYTHONPATH with a stack's wheels:
`bash bench/transport/native_probe.sh py STACK bench/rollout_peers.py ...`):
    python3 bench/rollout_peers.py prepare                  model + LoRA adapter + merged model + ceilings + run id
    python3 bench/rollout_peers.py run --stack fp8 --engines vllm-bf16,vllm-bf16-lora,vllm-fp8
    python3 bench/rollout_peers.py run --stack portable --engines fastgen,unsloth-generate,trl-default,...
Host side:
    python bench/rollout_peers.py merge DIR_OR_FILE...      -> bench/results/rollout_peers.json, targets

Each engine process writes $OUT/rollout_peers/<stack>-<engine>.json after every batch (a timeout keeps what was
measured). Smoke mode (RLSTACK_BENCH_SMOKE=1): a tiny model on the CPU, 16 new tokens, batches 2 and 4; the engines
that cannot run there (vLLM, Unsloth) leave a row with the reason; results go to /tmp only.

Sampling: TRL 0.24's GenerationConfig with top_k=50 set explicitly, because TRL's default top_k=None means 50 under
transformers 5 and "no top-k" under 4.57 (see rlstack.payload.fastgen.resolve_generation_config). vLLM gets the same
numbers (SamplingParams top_k=50, min_tokens = max_tokens, ignore_eos). Tokens per second count the tokens each
engine returned, not the tokens asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

ENGINES = ("vllm-bf16", "vllm-bf16-lora", "vllm-fp8", "fastgen", "unsloth-generate", "trl-default",
           "hf-static-compile", "trl-paged")
VLLM_ENGINES = ("vllm-bf16", "vllm-bf16-lora", "vllm-fp8")
# eager generate: ~100 tok/s at batch 8 (issue 14's table), 42 s a call: measured at --slow-batches only, once each
# after a short warm-up call (the first 512-token call of TRL's default took 57 s against 42 s for the next on
# 2026-12-02: a first call's one-time costs, which a warm-up of a few tokens pays instead)
SLOW_ENGINES = ("trl-default", "unsloth-generate")
WARMUP_TOKENS = 8
NUM_GENERATIONS = 8  # sequences per prompt, as the default recipe's GRPO step
PROMPT_LENS = (150, 170, 190, 210)
TOP_K = 50
PEERS = Path(os.environ.get("RLSTACK_PEERS_DIR", "/tmp/rlstack-peers-smoke" if common.SMOKE else "/tmp/rlstack-peers"))
COLUMNS = ["engine", "loader", "quant", "options", "batch", "new_tokens", "tokens_per_s", "ms_per_step",
           "fraction_of_floor", "first_call_s", "median_s", "prompt_len", "peak_gib", "stack", "run_id", "error"]


def out_dir() -> Path:
    d = Path(os.environ.get("OUT", str(PEERS / "out"))) / "rollout_peers"
    d.mkdir(parents=True, exist_ok=True)
    return d


def recipe_shape() -> dict[str, Any]:
    """The default recipe's LoRA and quantization (recipes/gsm8k-grpo.toml through rlstack's recipe loader)."""
    from rlstack.payload import recipes

    r = recipes.load(common.ROOT / "recipes" / "gsm8k-grpo.toml")
    return {"lora_r": r.lora.r, "lora_alpha": r.lora.alpha, "target_modules": list(r.lora.target_modules),
            "load_in_4bit": r.model.load_in_4bit, "max_seq_length": r.model.max_seq_length}


# --- prepare -----------------------------------------------------------------------------------------------------


def cmd_prepare(a: argparse.Namespace) -> int:
    """Build once per lease: the random Qwen3-4B-shaped model (bf16, with the word tokenizer), a LoRA adapter of
    the recipe's rank with non-zero B (a trained adapter is not zero), the merged model (what TRL's colocate vLLM
    serves), the measured copy bandwidth, and the run id."""
    import torch

    from rlstack.payload import tokenizer_files

    PEERS.mkdir(parents=True, exist_ok=True)
    shape = recipe_shape()
    t0 = time.perf_counter()
    if not (PEERS / "base" / "config.json").exists():
        model = common.build_model()
        tok = common.build_tokenizer(model.config.vocab_size)
        model.save_pretrained(PEERS / "base")
        tokenizer_files.save(tok, PEERS / "base")
        del model
    else:
        tok = None
    if not (PEERS / "lora" / "adapter_config.json").exists() or not (PEERS / "merged" / "config.json").exists():
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        base = AutoModelForCausalLM.from_pretrained(PEERS / "base", dtype=torch.bfloat16,
                                                    device_map={"": common.DEVICE})
        pm = get_peft_model(base, LoraConfig(r=shape["lora_r"], lora_alpha=shape["lora_alpha"], lora_dropout=0.0,
                                             target_modules=shape["target_modules"], task_type="CAUSAL_LM"))
        torch.manual_seed(0)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
        pm.save_pretrained(PEERS / "lora")
        merged = pm.merge_and_unload()
        merged.save_pretrained(PEERS / "merged")
        tokenizer_files.save(tok or AutoTokenizer.from_pretrained(PEERS / "base"), PEERS / "merged")
        del pm, merged, base
    if not (PEERS / "ceilings.json").exists():
        (PEERS / "ceilings.json").write_text(json.dumps(common.measure_ceilings(), indent=2))
    run_id = PEERS / "run_id"
    if a.run_id or not run_id.exists():
        run_id.write_text((a.run_id or f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}") + "\n")
    print(f"prepared {PEERS} in {time.perf_counter() - t0:.1f} s, run id {run_id.read_text().strip()}", flush=True)
    return 0


def _prepared() -> tuple[str, dict[str, float]]:
    if not (PEERS / "run_id").exists():
        raise SystemExit(f"{PEERS} is not prepared: run `python3 bench/rollout_peers.py prepare` first")
    return (PEERS / "run_id").read_text().strip(), json.loads((PEERS / "ceilings.json").read_text())


# --- run: one process per engine ----------------------------------------------------------------------------------


def cmd_run(a: argparse.Namespace) -> int:
    """Each engine in its own process (isolation: Unsloth's class patches, vLLM's memory), one after another.
    --prepare prepares first where this machine has not (one background job on the device instead of two calls)."""
    if a.prepare and not (PEERS / "run_id").exists():
        cmd_prepare(argparse.Namespace(run_id=""))
    _prepared()
    engines = [e for e in a.engines.split(",") if e]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; known: {', '.join(ENGINES)}")
    status = 0
    for engine in engines:
        argv = [sys.executable, str(Path(__file__).resolve()), "one", engine, "--stack", a.stack,
                "--batches", a.batches, "--slow-batches", a.slow_batches, "--reps", str(a.reps),
                "--new-tokens", str(a.new_tokens),
                "--load-in-4bit", a.load_in_4bit, "--fastgen-loader", a.fastgen_loader,
                "--vllm-memory", str(a.vllm_memory), *(f"--engine-option={o}" for o in a.engine_option)]
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(argv, timeout=a.engine_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        print(f"=== {engine}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        status = status or rc
    return status


class Result:
    """The rows of one engine process, written after every batch."""

    def __init__(self, engine: str, stack: str, run_id: str, options: dict[str, Any] | None = None) -> None:
        self.engine, self.stack, self.run_id = engine, stack, run_id
        self.rows: list[dict[str, Any]] = []
        # a run with engine options is another file: it must not replace the default path's rows
        self.engine_options = dict(options or {})
        self.options = ",".join(f"{k}={v}" for k, v in sorted(self.engine_options.items())) or None
        # (a file-safe name: the device tool leaves out files whose names hold "=" or ":"; the row keeps the options)
        self.path = out_dir() / common.file_safe(f"{stack}-{engine}{'-' + self.options if self.options else ''}.json")
        self.meta: dict[str, Any] = {**common.header(), "engine_versions": engine_versions()}

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append({"engine": self.engine, "stack": self.stack, "run_id": self.run_id,
                          "options": self.options, **row})
        self.path.write_text(json.dumps({**self.meta, "rows": self.rows}, indent=2, default=str))
        print(json.dumps(self.rows[-1], default=str), flush=True)


def error_text(exc: BaseException) -> str:
    """One line (the Markdown table cannot hold a newline), at most 600 characters."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:600]


def engine_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("vllm", "unsloth", "unsloth_zoo", "flash-attn", "kernels"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def prompts(tok: Any, batch: int, seed: int) -> list[list[int]]:
    """batch sequences: batch / 8 random prompts, each repeated num_generations times (TRL's RepeatSampler)."""
    n = max(1, batch // NUM_GENERATIONS)
    texts = common.random_prompts(n, PROMPT_LENS, seed=seed, high=min(150000, len(tok) - 1))
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [p for p in ids for _ in range(NUM_GENERATIONS)][:batch]


def left_pad(tok: Any, seqs: list[list[int]]) -> dict[str, Any]:
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    return {"input_ids": ids.to(common.DEVICE), "attention_mask": mask.to(common.DEVICE)}


def trl_generation_config(tok: Any, new_tokens: int, **extra: Any) -> Any:
    """TRL 0.24's GRPOTrainer GenerationConfig (use_vllm=False), top_k pinned to 50, fixed length."""
    from transformers import GenerationConfig

    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, pad_token_id=tok.pad_token_id,
              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, temperature=1.0, top_p=1.0, top_k=TOP_K,
              min_p=None, repetition_penalty=1.0, cache_implementation=None)
    kw.update(extra)
    return GenerationConfig(**kw)


def timed(fn: Any, reps: int) -> tuple[float, list[float], Any]:
    """(first call s, timed runs s, last output): the first call includes compilation / graph capture."""
    t = common.Timer()
    with t:
        out = fn()
    first, runs = t.s, []
    for _ in range(reps):
        t = common.Timer()
        with t:
            out = fn()
        runs.append(t.s)
    return first, runs or [first], out


def measure(res: Result, loader: str, quant: str, batches: list[int], reps: int, new_tokens: int,
            make: Any, ceilings: dict[str, float], cfg: Any, tok: Any, extra: Any = None, warmup: Any = None) -> None:
    """Time ``make(seqs)()`` per batch and add one row each. ``make`` returns the generate closure; the closure
    returns a list of generated-token counts (one per sequence). ``warmup(seqs)``, where given, runs a short
    generate first and the closure is then timed once (the slow engines): its first call is its measurement."""
    for batch in batches:
        seqs = prompts(tok, batch, seed=batch)
        row: dict[str, Any] = {"loader": loader, "quant": quant, "batch": batch, "new_tokens": new_tokens,
                               "prompt_len": max(len(s) for s in seqs)}
        try:
            common.reset_peak()
            fn = make(seqs)
            if warmup is not None:
                t = common.Timer()
                with t:
                    warmup(seqs)
                row["warmup_s"] = t.s
            first, runs, counts = timed(fn, 0 if warmup is not None else reps)
            med = statistics.median(runs)
            generated = sum(counts)
            steps = max(counts)
            floor = common.decode_floor(cfg, batch, row["prompt_len"], new_tokens, ceilings["copy_bandwidth_Bps"])
            tps = generated / med
            row.update(tokens_per_s=tps, ms_per_step=med / steps * 1e3, first_call_s=first, median_s=med,
                       runs_s=runs, new_tokens_mean=generated / len(counts), peak_gib=common.peak_gib(),
                       floor_tokens_per_s=floor["floor_tokens_per_s"],
                       fraction_of_floor=tps / floor["floor_tokens_per_s"])
            if extra is not None:
                row.update(extra())
        except Exception as exc:  # one engine's failure is a finding: record it, keep the others
            traceback.print_exc()
            row["error"] = error_text(exc)
        res.add(row)


def _randomize_lora(model: Any) -> None:
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)


def _load(loader: str, load_in_4bit: bool) -> Any:
    """The model as rlstack's trainer loads it (train/loading.py): the stack's default ("auto"), or a loader
    forced. Unsloth must be imported before transformers: nothing here imports transformers earlier."""
    from rlstack.payload.recipes import LoraSpec, ModelSpec
    from rlstack.payload.train.loading import load_for_training

    shape = recipe_shape()
    spec = ModelSpec(name=str(PEERS / "base"), load_in_4bit=load_in_4bit, loader=loader,
                     max_seq_length=shape["max_seq_length"])
    lora = LoraSpec(r=shape["lora_r"], alpha=shape["lora_alpha"], target_modules=shape["target_modules"])
    loaded = load_for_training(spec, lora, seed=0, gradient_checkpointing=False)
    _randomize_lora(loaded.model)
    return loaded


def run_hf(res: Result, a: argparse.Namespace, batches: list[int], ceilings: dict[str, float],
           loaded: Any = None) -> Any:
    """Measure an HF-side engine; returns the loaded model, which fastgen's next variant reuses (``loaded``)."""
    import torch

    engine = res.engine
    four_bit = a.load_in_4bit == "true" or (a.load_in_4bit == "recipe" and recipe_shape()["load_in_4bit"])
    loader = {"fastgen": a.fastgen_loader, "unsloth-generate": "unsloth"}.get(engine, "transformers")
    loaded = loaded if loaded is not None else _load(loader, four_bit)
    model, tok = loaded.model, loaded.tokenizer
    tok.padding_side = "left"
    quant = "nf4" if four_bit and common.DEVICE == "cuda" else str(next(model.parameters()).dtype).split(".")[-1]
    gc = trl_generation_config(tok, a.new_tokens)
    extra = None

    def counts(out: Any, prompt_width: int) -> list[int]:
        """Completion lengths of a generate output: min_new_tokens = max_new_tokens, so no row stops early and the
        rectangle is exact (counting non-pad tokens would miss pad ids a random model samples)."""
        return [out.shape[1] - prompt_width] * out.shape[0]

    if engine == "fastgen":
        from rlstack.payload import fastgen

        fastgen.install(model, **res.engine_options)

        def make(seqs: list[list[int]]) -> Any:
            inputs = left_pad(tok, seqs)

            def go() -> list[int]:
                model.train()  # TRL generates with the policy in train mode
                with torch.no_grad():
                    out = model.generate(**inputs, generation_config=gc, disable_compile=True)
                if fastgen.failure(model):
                    raise RuntimeError(f"fastgen fell back: {fastgen.failure(model)}")
                return counts(out, inputs["input_ids"].shape[1])

            return go

        def extra() -> dict[str, Any]:
            eng = fastgen.get_engine(model)
            plan = eng.last_plan
            return {"fastgen_plan_gib": plan.total / 2**30 if plan else None, "fastgen_patches": eng.patches[:3],
                    "fastgen_dtype": str(eng.dtype), "compile_error": eng.compile_error, "graph_error": eng.graph_error,
                    "fused_gemms_saved": eng.fused_gemms_saved,
                    "prefilled_rows": eng.prefilled_rows,  # fewer than the batch: prefill_once served repeats
                    "fastgen_describe": eng.describe()}
    elif engine in SLOW_ENGINES:  # at the batches cmd_one chose (--slow-batches)
        short_gc = trl_generation_config(tok, WARMUP_TOKENS)

        def warmup(seqs: list[list[int]]) -> None:
            make(seqs, short_gc)()

        def make(seqs: list[list[int]], gc: Any = gc) -> Any:
            inputs = left_pad(tok, seqs)

            def go() -> list[int]:
                if engine == "unsloth-generate":  # unsloth_unwrap_model_for_generation around TRL's call
                    from unsloth import FastLanguageModel

                    FastLanguageModel.for_inference(model)
                model.train() if engine == "trl-default" else None
                with torch.no_grad():
                    out = model.generate(**inputs, generation_config=gc, disable_compile=True)
                if engine == "unsloth-generate":
                    from unsloth import FastLanguageModel

                    FastLanguageModel.for_training(model)
                return counts(out, inputs["input_ids"].shape[1])

            return go
    elif engine == "hf-static-compile":
        static_gc = trl_generation_config(tok, a.new_tokens, cache_implementation="static")

        def make(seqs: list[list[int]]) -> Any:
            inputs = left_pad(tok, seqs)

            def go() -> list[int]:
                model.eval()
                with torch.no_grad():  # compile left on: generate compiles the static-cache decode step on CUDA
                    out = model.generate(**inputs, generation_config=static_gc)
                return counts(out, inputs["input_ids"].shape[1])

            return go
    elif engine == "trl-paged":
        import importlib.util

        flash = importlib.util.find_spec("flash_attn") is not None
        paged: dict[str, Any] = {"name": "paged_attention" if flash else "sdpa_paged"}  # TRL 0.24's choice

        def paged_generate(seqs: list[list[int]]) -> Any:
            previous = model.config._attn_implementation
            if paged["name"] is not None:
                model.config._attn_implementation = paged["name"]
            try:
                if next(model.parameters()).dtype != torch.float32:
                    model.to(torch.bfloat16)  # TRL casts to the training dtype (bf16=True)
                with torch.inference_mode():
                    outs = model.generate_batch(seqs, generation_config=gc, progress_bar=False)
                    model.train()
            finally:
                model.config._attn_implementation = previous
            return outs

        def extra() -> dict[str, Any]:
            return {"attn_implementation": paged["name"] or f"paged|{model.config._attn_implementation} (5.x)",
                    "trl_attn_error": paged.get("trl_error")}

        def make(seqs: list[list[int]]) -> Any:
            def go() -> list[int]:  # GRPOTrainer._generate_single_turn, use_transformers_paged=True (TRL 0.24)
                try:
                    outs = paged_generate(seqs)
                except ValueError as exc:
                    # transformers 5's generate_batch prefixes "paged|" to the model's attention itself and
                    # rejects TRL 0.24's names ("paged|sdpa_paged"): record that, then measure the library path
                    # the 5.x way (the model's own attention name left as it is)
                    if paged["name"] is None or "is not supported" not in str(exc):
                        raise
                    paged["trl_error"] = f"{type(exc).__name__}: {exc}"[:300]
                    paged["name"] = None
                    outs = paged_generate(seqs)
                return [len(o.generated_tokens) for o in outs.values()]

            return go
    else:
        raise SystemExit(f"not an HF engine: {engine}")
    measure(res, loaded.loader, quant, batches, a.reps, a.new_tokens, make, ceilings, model.config, tok, extra,
            warmup if engine in SLOW_ENGINES else None)
    return loaded


def run_vllm(res: Result, a: argparse.Namespace, batches: list[int], ceilings: dict[str, float]) -> None:
    """vLLM as TRL's colocate mode builds it (one engine in the process), generating from token ids."""
    from transformers import AutoConfig, AutoTokenizer
    from vllm import LLM, SamplingParams

    engine = res.engine
    lora = engine == "vllm-bf16-lora"
    folder = PEERS / ("base" if lora else "merged")
    shape = recipe_shape()
    kwargs: dict[str, Any] = dict(model=str(folder), dtype="bfloat16", gpu_memory_utilization=a.vllm_memory,
                                  max_model_len=shape["max_seq_length"], seed=0, max_num_batched_tokens=4096)
    if lora:
        kwargs.update(enable_lora=True, max_lora_rank=shape["lora_r"], max_loras=1)
    if engine == "vllm-fp8":
        kwargs["quantization"] = "fp8"
    llm = LLM(**kwargs)
    tok = AutoTokenizer.from_pretrained(folder)
    request = None
    if lora:
        from vllm.lora.request import LoRARequest

        request = LoRARequest("rollout-peers", 1, str(PEERS / "lora"))
    sp = SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=TOP_K, max_tokens=a.new_tokens,
                        min_tokens=a.new_tokens, ignore_eos=True)

    def make(seqs: list[list[int]]) -> Any:
        reqs = [{"prompt_token_ids": s} for s in seqs]

        def go() -> list[int]:
            outs = llm.generate(reqs, sp, use_tqdm=False, lora_request=request)
            return [len(o.outputs[0].token_ids) for o in outs]

        return go

    quant = "fp8" if engine == "vllm-fp8" else "bf16"
    measure(res, "vllm", quant, batches, a.reps, a.new_tokens, make, ceilings, AutoConfig.from_pretrained(folder),
            tok, lambda: {"vllm_gpu_memory_utilization": a.vllm_memory})


def cmd_one(a: argparse.Namespace) -> int:
    from rlstack.payload import kernelcache

    # before torch, vLLM or Unsloth are imported: with RLSTACK_KERNEL_CACHE set (native_probe.sh sets it), vLLM's
    # second and third engine reuse the first's FlashInfer JIT modules and torch.compile artifacts (~100 s each)
    kernelcache.apply()
    options = common.engine_options(a.engine_option)
    if (options or a.variant) and a.engine != "fastgen":
        raise SystemExit(f"--engine-option and --variant set FastGenerator options: they apply to the fastgen "
                         f"engine, not {a.engine}")
    # --variant: each one a fresh engine on the model loaded once (the load and the stack's imports are a minute
    # or more of device time a process); each variant's rows go to their own file, as --engine-option's do
    variants = common.variants(a.variant, options).values()
    run_id, ceilings = _prepared()
    batches = [int(b) for b in (a.slow_batches if a.engine in SLOW_ENGINES else a.batches).split(",") if b]
    loaded, failed = None, False
    for opts in variants:
        res = Result(a.engine, a.stack, run_id, opts)
        try:
            if a.engine in VLLM_ENGINES:
                run_vllm(res, a, batches, ceilings)
            else:
                if loaded is not None:  # the last variant's engine, its graphs and compiled code go first
                    import torch

                    from rlstack.payload import fastgen

                    torch._dynamo.reset()  # the compiled code, which refers to the engine's step
                    # uninstall releases the engine (collecting its reference cycles); it used to drop it
                    # uncollected, leaving release() nothing to free: a second variant peaked at 25.2 GiB at 8
                    # sequences against the first's 10.6 (H100, run ids 20261205T114508-01aa62, -132029-c23955)
                    fastgen.uninstall(loaded.model)
                    fastgen.release(loaded.model)  # where the variant ran without the hook
                loaded = run_hf(res, a, batches, ceilings, loaded)
        except Exception as exc:  # could not even load (or this variant failed): one row per batch says why
            traceback.print_exc()
            failed = True
            for batch in batches:
                if not any(r.get("batch") == batch for r in res.rows):
                    res.add({"loader": None, "batch": batch, "new_tokens": a.new_tokens,
                             "error": error_text(exc)})
    return 1 if failed else 0


# --- merge -------------------------------------------------------------------------------------------------------


def load_rows(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    files = [f for p in paths for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    rows, metas = [], []
    for f in files:
        data = json.loads(f.read_text())
        rows.extend(data.get("rows", []))
        metas.append({k: data.get(k) for k in ("date", "gpu", "versions", "engine_versions", "host")} |
                     {"file": f.name, "run_ids": sorted({str(r.get("run_id")) for r in data.get("rows", [])})})
    return rows, metas


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 14's rollout targets, each met / not met / not measured, from the rows of one run id: the default
    path's, so rows measured with engine options (`options`) do not count."""
    rows = [r for r in rows if not r.get("options")]

    def tps(engine: str, batch: int, loader: str | None = None) -> float | None:
        for r in rows:
            if r["engine"] == engine and r.get("batch") == batch and r.get("tokens_per_s") and \
                    (loader is None or r.get("loader") == loader):
                return float(r["tokens_per_s"])
        return None

    def row(engine: str, batch: int, loader: str | None = None) -> dict[str, Any] | None:
        return next((r for r in rows if r["engine"] == engine and r.get("batch") == batch and
                     r.get("tokens_per_s") and (loader is None or r.get("loader") == loader)), None)

    out = []
    for batch, want in ((8, 1.0), (64, 0.9)):
        fast, vllm = tps("fastgen", batch, "unsloth"), tps("vllm-bf16", batch)
        ratio = fast / vllm if fast and vllm else None
        out.append({"target": f"portable default path (fastgen, unsloth loader) >= {want}x vLLM bf16 at {batch}",
                    "value": ratio, "met": None if ratio is None else ratio >= want})
    r8 = row("fastgen", 8, "unsloth")
    frac = r8.get("fraction_of_floor") if r8 else None
    out.append({"target": "portable default path >= 60 % of the floor at 8", "value": frac,
                "met": None if frac is None else frac >= 0.6})
    return out


def batches_measured(rows: list[dict[str, Any]]) -> str:
    """Per engine (and loader/quant where it has several), the batches with a measurement: an engine timed at 8
    only (the eager ones by design, one cut by the lease) must not read as measured at 64."""
    seen: dict[str, list[str]] = {}
    for r in rows:
        if r.get("tokens_per_s"):
            seen.setdefault(f"{r['engine']} ({r.get('loader')}, {r.get('quant')})", []).append(str(r["batch"]))
    return ", ".join(f"{k} {'/'.join(v)}" for k, v in seen.items())


def cmd_merge(a: argparse.Namespace) -> int:
    rows, metas = load_rows([Path(p) for p in a.paths])
    if not rows:
        raise SystemExit("no rows in " + " ".join(a.paths))
    run_ids = sorted({r["run_id"] for r in rows})
    run_id = a.run_id or (run_ids[0] if len(run_ids) == 1 else None)
    if run_id is None:
        raise SystemExit(f"rows of several run ids {run_ids}: pick one with --run-id (one lease, one comparison)")
    rows = [r for r in rows if r["run_id"] == run_id]
    # the header and engine_files are the files of this run id only (another lease's file in the same folder
    # would lend its date and machine to a table it has no row in)
    metas = [{k: v for k, v in m.items() if k != "run_ids"} for m in metas if run_id in m["run_ids"]]
    for r in rows:
        if r.get("loader") == "vllm":
            # vLLM allocates in its EngineCore process: this process's torch counter read 0 there, which says
            # nothing about vLLM's memory (its share is the row's vllm_gpu_memory_utilization)
            r["peak_gib"] = None
    have = {r["engine"] for r in rows if r.get("tokens_per_s")}
    missing = [e for e in ENGINES if e not in have]
    order = {e: i for i, e in enumerate(ENGINES)}
    rows.sort(key=lambda r: (order.get(r["engine"], 99), str(r.get("loader")), str(r.get("quant")), r.get("batch", 0)))
    goals = targets(rows)
    # the machine and the date are the engine files' (merge runs on the host, whose versions say nothing: each
    # engine file keeps its stack's in engine_files); the GPU from a file measured on one
    measured = [m for m in metas if (m.get("gpu") or {}).get("cuda")] or metas
    header = {"date": max((str(m["date"]) for m in measured if m.get("date")), default=None),
              "gpu": measured[0].get("gpu") if measured else None, "merged": {"date": common.now(), "argv": sys.argv}}
    data = {**header, "run_id": run_id, "engine_files": metas, "missing_engines": missing,
            "targets": goals, "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": TOP_K, "fixed_length": True}}

    def outcome(g: dict[str, Any]) -> str:
        said = "not measured" if g["met"] is None else ("met" if g["met"] else "NOT met")
        return f"{g['target']}: {said}" + ("" if g["value"] is None else f" ({g['value']:.3g})")

    model = "SMOKE: tiny model on the CPU, numbers say nothing" if common.SMOKE else "Qwen3-4B shape"
    notes = (f"run id {run_id}; {model}, random bf16 weights; floor = bf16 weight + KV bytes / measured copy "
             f"bandwidth (vllm-fp8 reads half the weight bytes: its fraction is against the bf16 floor); prompts of "
             f"{'/'.join(map(str, PROMPT_LENS))} "
             f"tokens x {NUM_GENERATIONS} generations; T=1, top_p 1, top_k {TOP_K}. Engines without a measurement: "
             f"{', '.join(missing) or 'none'}; measured at: {batches_measured(rows)}. Targets: "
             + "; ".join(outcome(g) for g in goals) + ("" if not a.note else ". " + " ".join(a.note)))
    common.write_results(a.name, data, rows, COLUMNS, notes, question="rollouts", metric="tokens_per_s",
                         title="Rollout engines side by side in one run: tokens/s at 512 new tokens",
                         baseline={"engine": "vllm-bf16"}, group_by="batch",
                         headline={"engine": "fastgen", "batch": 64})
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="model, adapter, merged model, ceilings, run id (once per lease)")
    p.add_argument("--run-id", default="")
    smoke_batches, smoke_tokens = ("2,4", 16) if common.SMOKE else ("8,64", 512)

    def engine_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--stack", required=True, help="the stack whose wheels this runs on (recorded in each row)")
        q.add_argument("--batches", default=smoke_batches)
        q.add_argument("--slow-batches", default=smoke_batches.split(",")[0],
                       help=f"the batches of the eager engines ({', '.join(SLOW_ENGINES)}), each timed once")
        q.add_argument("--reps", type=int, default=2, help="timed runs after the first call (slow engines: 1)")
        q.add_argument("--new-tokens", type=int, default=smoke_tokens)
        q.add_argument("--load-in-4bit", choices=("recipe", "true", "false"), default="recipe",
                       help="the HF engines' base: the default recipe's (4-bit NF4 QLoRA), or forced")
        q.add_argument("--fastgen-loader", choices=("auto", "unsloth", "transformers"), default="auto",
                       help="auto: the stack's default loader (Unsloth where it imports on CUDA)")
        q.add_argument("--vllm-memory", type=float, default=0.5, help="vLLM gpu_memory_utilization")
        common.add_engine_option(q, "fastgen's only (e.g. attend_bucket=256): its rows say so in `options`, go to "
                                    "their own file, and the targets count only the rows without (the default path)")

    p = sub.add_parser("run", help="measure engines, each in its own process")
    engine_args(p)
    p.add_argument("--engines", required=True, help=",".join(ENGINES))
    p.add_argument("--engine-timeout", type=int, default=540, help="seconds per engine process")
    p.add_argument("--prepare", action="store_true", help="prepare first if this machine has not")
    p = sub.add_parser("one", help="measure one engine in this process (what run starts)")
    p.add_argument("engine", choices=ENGINES)
    engine_args(p)
    common.add_variant(p, "fastgen measured once per variant, each a fresh engine on the model loaded once, rows "
                          "in their own files as --engine-option's")
    p = sub.add_parser("merge", help="join the engine files of one run id into bench/results/rollout_peers")
    p.add_argument("paths", nargs="+")
    p.add_argument("--run-id", default="")
    p.add_argument("--note", action="append", default=[], help="a sentence for the table's notes (repeatable)")
    p.add_argument("--name", default="rollout_peers",
                   help="the results name, bench/results/NAME.{json,md}: a lease that measured only some engines "
                        "(the targets' pair, vllm-bf16 and fastgen) writes its own table and leaves the full one")
    a = ap.parse_args(argv)
    return {"prepare": cmd_prepare, "run": cmd_run, "one": cmd_one, "merge": cmd_merge}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
