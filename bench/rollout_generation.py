"""Rollout generation tokens/s: TRL 0.24's default `generate` call vs rlstack's fastgen, against the bandwidth floor.

The shape is the default recipe's rollout: prompts x num_generations sequences, fixed completion length (random
weights never emit EOS reliably, so min_new_tokens = max_new_tokens). The TRL path is reproduced call for call
(GRPOTrainer._generate_single_turn with use_vllm=False): prompts tokenized with padding_side="left", a
GenerationConfig built from TRL's kwargs (do_sample, temperature 1, top_p 1, top_k None -> 50, min_p None,
repetition_penalty 1, cache_implementation None), the PEFT model in train mode with gradient checkpointing turned
off (TRL's unwrap_model_for_generation does that), `generate(**inputs, generation_config=gc, disable_compile=True)`.

    python bench/rollout_generation.py            # default recipe shape + larger generation batches
"""

from __future__ import annotations

import argparse
import statistics
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

RECIPE = common.ROOT / "recipes" / "gsm8k-grpo.toml"


def recipe_shape() -> dict[str, Any]:
    """The default recipe's rollout shape: recipes/gsm8k-grpo.toml through rlstack.payload.recipes when both exist, else
    rlstack.payload.recipes' defaults (the default recipe's values), else TRL 0.24's GRPOConfig defaults."""
    shape: dict[str, Any] = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
                             "num_generations": 8, "max_completion_length": 256, "max_prompt_length": 512,
                             "lora_r": 32, "lora_alpha": 64, "gradient_checkpointing": True,
                             "eval_batch_size": 16, "eval_max_new_tokens": 256, "source": "trl-0.24-defaults"}
    try:
        from rlstack.payload import recipes

        if RECIPE.exists():
            r = recipes.load(RECIPE)
            g, lora, ev = r.grpo, r.lora, r.eval
            source = str(RECIPE.relative_to(common.ROOT))
        else:
            g, lora, ev = recipes.GrpoSpec(), recipes.LoraSpec(), recipes.EvalSpec()
            source = "rlstack.payload.recipes defaults"
        shape.update(per_device_train_batch_size=g.per_device_train_batch_size,
                     gradient_accumulation_steps=g.gradient_accumulation_steps, num_generations=g.num_generations,
                     max_completion_length=g.max_completion_length, max_prompt_length=g.max_prompt_length,
                     gradient_checkpointing=g.gradient_checkpointing, lora_r=lora.r, lora_alpha=lora.alpha,
                     eval_batch_size=ev.batch_size, eval_max_new_tokens=ev.max_new_tokens, source=source)
    except Exception as exc:  # rlstack.payload.recipes absent or its deps (pydantic) missing: TRL defaults
        shape["source"] += f" (rlstack.payload.recipes unavailable: {type(exc).__name__}: {exc})"[:200]
    gen_batch = shape["per_device_train_batch_size"] * shape["gradient_accumulation_steps"]
    shape["generation_batch"] = gen_batch
    shape["prompts_per_step"] = gen_batch // shape["num_generations"]
    return shape


def trl_generation_config(tok: Any, max_new: int, **extra: Any) -> Any:
    """GenerationConfig exactly as GRPOTrainer.__init__ builds it (use_vllm=False), plus min_new_tokens."""
    from transformers import GenerationConfig

    kw = {"max_new_tokens": max_new, "do_sample": True, "pad_token_id": tok.pad_token_id,
          "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "temperature": 1.0, "top_p": 1.0,
          "top_k": None, "min_p": None, "repetition_penalty": 1.0, "cache_implementation": None}
    kw.update({"min_new_tokens": max_new})  # generation_kwargs: fixed completion length for timing
    kw.update(extra)
    return GenerationConfig(**kw)


def lora_model(model: Any, r: int, alpha: int) -> Any:
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    import torch

    with torch.no_grad():  # a trained adapter is not zero: give B values so merged != base
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    pm.train()  # TRL generates with the policy in train mode (gradient checkpointing off during generate)
    return pm


def tokenize(tok: Any, prompts: list[str], max_prompt: int) -> dict[str, Any]:
    enc = tok(text=prompts, return_tensors="pt", padding=True, padding_side="left", max_length=max_prompt,
              truncation=True, add_special_tokens=False)
    return {k: v.to(common.DEVICE) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


def time_runs(fn: Any, reps: int) -> tuple[float, list[float]]:
    first = common.Timer()
    with first:
        fn()
    runs = []
    for _ in range(reps):
        t = common.Timer()
        with t:
            fn()
        runs.append(t.s)
    return first.s, runs


def check_same_function(pm: Any, engine: Any, inputs: dict[str, Any], n_tokens: int = 64) -> dict[str, Any]:
    """fastgen (merged shadow, compiled) must compute the policy's function: greedy-decode with fastgen, then run
    the PEFT model's own full forward on that sequence and compare its argmax (teacher-forced) with fastgen's
    tokens, and its logits' relative error on the last position."""
    import torch

    from rlstack.payload import fastgen

    seq = engine.generate(inputs["input_ids"], inputs["attention_mask"], n_tokens,
                          fastgen.Sampling(do_sample=False, pad_token_id=common.PAD_ID))
    P = inputs["input_ids"].shape[1]
    mask = torch.cat([inputs["attention_mask"], torch.ones_like(seq[:, P:])], dim=1)
    pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    was = pm.training
    pm.eval()
    with torch.no_grad():
        logits = pm(input_ids=seq, attention_mask=mask, position_ids=pos).logits.float()
    if was:
        pm.train()
    pred = logits[:, P - 1:-1].argmax(-1)
    agree = (pred == seq[:, P:]).float().mean().item()
    # HF greedy generate on the same prompts, first divergence
    with torch.no_grad():
        ref = pm.generate(**inputs, max_new_tokens=n_tokens, do_sample=False, min_new_tokens=n_tokens,
                          pad_token_id=common.PAD_ID, disable_compile=True)
    same = (ref[:, P:] == seq[:, P:]).int()
    prefix = same.cumprod(1).sum(1).float().mean().item()
    return {"teacher_forced_argmax_agreement": agree, "greedy_tokens_equal_to_hf_generate": float(same.float().mean()),
            "mean_identical_prefix_tokens": prefix, "n_tokens": n_tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2, help="timed runs after the first (compiling) call")
    ap.add_argument("--slow-reps", type=int, default=1, help="timed runs for the slow eager variants")
    ap.add_argument("--prompt-lens", default="150,170,190,210", help="prompt token lengths, cycled per prompt")
    ap.add_argument("--big-batches", default="64,256", help="extra generation batch sizes (sequences) for fastgen")
    ap.add_argument("--skip", default="", help="comma-separated variant names to skip")
    ap.add_argument("--variants", default="trl_default,fastgen",
                    help="recipe-shape variants in order: trl_default, fastgen (merged shadow + GQA decode attention"
                         " + manual CUDA graph), fastgen_trees, fastgen_trees_sdpa, fastgen_nograph, "
                         "fastgen_unmerged_trees, fastgen_merged_eager, hf_static_cache_compiled")
    ap.add_argument("--completion", type=int, default=0, help="override the completion length")
    args = ap.parse_args(argv)

    import torch

    from rlstack.payload import fastgen

    torch.backends.cuda.matmul.allow_tf32 = True
    shape = recipe_shape()
    T = args.completion or shape["max_completion_length"]
    G = shape["num_generations"]
    lens = [int(x) for x in args.prompt_lens.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    data: dict[str, Any] = {**common.header(), "shape": shape, "completion_tokens": T}
    data["ceilings"] = ceil = common.measure_ceilings()
    print("ceilings", ceil, flush=True)
    tok = common.build_tokenizer()
    base = common.build_model()
    pm = lora_model(base, shape["lora_r"], shape["lora_alpha"])
    gc = trl_generation_config(tok, T)
    rows: list[dict[str, Any]] = []

    def batch_inputs(n_seq: int, seed: int) -> dict[str, Any]:
        prompts = common.random_prompts(max(1, n_seq // G), lens, seed=seed)
        repeated = [p for p in prompts for _ in range(G)][:n_seq]  # TRL's RepeatSampler: each prompt G times
        return tokenize(tok, repeated, shape["max_prompt_length"])

    def reps_for(name: str) -> int:
        return args.slow_reps if name in ("trl_default", "fastgen_merged_eager") else args.reps

    def run_variant(name: str, n_seq: int, fn: Any, inputs: dict[str, Any]) -> None:
        if name in skip:
            return
        common.reset_peak()
        try:
            first, runs = time_runs(lambda: fn(inputs), reps_for(name))
        except Exception as exc:  # record the failure, keep the other variants
            traceback.print_exc()
            rows.append({"variant": name, "batch": n_seq, "error": f"{type(exc).__name__}: {exc}"[:300]})
            return
        P = inputs["input_ids"].shape[1]
        floor = common.decode_floor(base.config, n_seq, P, T, ceil["copy_bandwidth_Bps"])
        med = statistics.median(runs)
        tps = n_seq * T / med
        rows.append({"variant": name, "batch": n_seq, "prompt_len": P, "new_tokens": T, "first_call_s": first,
                     "median_s": med, "runs_s": runs, "tokens_per_s": tps, "ms_per_step": med / T * 1e3,
                     "floor_tokens_per_s": floor["floor_tokens_per_s"],
                     "floor_ms_per_step": floor["floor_step_s"] * 1e3,
                     "fraction_of_floor": tps / floor["floor_tokens_per_s"], "peak_gib": common.peak_gib()})
        eng = getattr(fn, "engine", None)
        if eng is not None and (eng.compile_error or eng.graph_error):
            rows[-1]["error"] = f"compile: {eng.compile_error} graph: {eng.graph_error}"[:300]
        print(rows[-1], flush=True)
        common.write_results("rollout_generation", {**data, "partial": True}, rows, ["variant"], quiet=True,
                             question="rollouts",
                              title="GRPO rollout tokens/s (partial)")

    B = shape["generation_batch"]
    recipe_inputs = batch_inputs(B, seed=1)

    def trl_default(inp: dict[str, Any]) -> Any:
        with torch.no_grad():
            return pm.generate(**inp, generation_config=gc, disable_compile=True)

    def hf_static_compiled(inp: dict[str, Any]) -> Any:
        with torch.no_grad():
            return pm.generate(**inp, generation_config=trl_generation_config(tok, T, cache_implementation="static"))

    def fast(**opts: Any) -> Any:
        opts.setdefault("compile", common.DEVICE == "cuda")
        eng = fastgen.FastGenerator(pm, **opts)
        sampling, max_new = fastgen.sampling_from_generation_config(gc, pm)

        def f(inp: dict[str, Any]) -> Any:
            return eng.generate(inp["input_ids"], inp["attention_mask"], max_new, sampling)

        f.engine = eng  # type: ignore[attr-defined]
        return f

    want = [v for v in args.variants.split(",") if v]
    engines: dict[str, Any] = {}
    options = {  # name -> FastGenerator options
        "fastgen": dict(merge_lora=True, graph="manual"),
        "fastgen_trees": dict(merge_lora=True, graph="trees"),
        "fastgen_trees_sdpa": dict(merge_lora=True, graph="trees", gqa_attention=False),
        "fastgen_nograph": dict(merge_lora=True, graph="none"),
        "fastgen_unmerged_trees": dict(merge_lora=False, graph="trees"),
        "fastgen_merged_eager": dict(merge_lora=True, compile=False),
    }
    for name in want:
        if name == "trl_default":
            with torch.no_grad():  # warm-up (CUDA/cuBLAS init) on a short generation, then the timed run
                pm.generate(**recipe_inputs, generation_config=trl_generation_config(tok, 16),
                            disable_compile=True)
            run_variant("trl_default", B, trl_default, recipe_inputs)
        elif name == "hf_static_cache_compiled":
            run_variant(name, B, hf_static_compiled, recipe_inputs)
        elif name in options:
            engines[name] = fast(**options[name])
            run_variant(name, B, engines[name], recipe_inputs)
        else:
            raise SystemExit(f"unknown variant {name}")
    main_engine = engines.get("fastgen") or fast(**options["fastgen"])
    for nb in [int(x) for x in args.big_batches.split(",") if x]:
        inp = batch_inputs(nb, seed=2)
        run_variant("fastgen", nb, main_engine, inp)
    try:
        data["same_function_check"] = check_same_function(pm, main_engine.engine, recipe_inputs)
    except Exception as exc:
        traceback.print_exc()
        data["same_function_check"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    base_row = next((r for r in rows if r["variant"] == "trl_default" and r["batch"] == B and "tokens_per_s" in r),
                    None)
    for r in rows:
        if base_row and "tokens_per_s" in r:
            r[f"speedup_vs_trl_default_b{B}"] = r["tokens_per_s"] / base_row["tokens_per_s"]
    data["floor_recipe_shape"] = common.decode_floor(base.config, B, recipe_inputs["input_ids"].shape[1], T,
                                                     ceil["copy_bandwidth_Bps"])
    cols = ["variant", "batch", "prompt_len", "new_tokens", "first_call_s", "median_s", "ms_per_step",
            "tokens_per_s", "floor_tokens_per_s", "fraction_of_floor", f"speedup_vs_trl_default_b{B}", "peak_gib",
            "error"]
    notes = (f"Qwen3-4B-shaped random bf16 model, LoRA r={shape['lora_r']} all-linear; shape from {shape['source']}"
             f" ({shape['prompts_per_step']} prompt(s) x {G} generations, {T} new tokens). Copy bandwidth "
             f"{ceil['copy_bandwidth_TBps']:.2f} TB/s, bf16 matmul {ceil['bf16_matmul_TFLOPs']:.0f} TFLOP/s. "
             f"Same-function check: {data['same_function_check']}")
    common.write_results("rollout_generation", data, rows, cols, notes, question="rollouts",
                         title="GRPO rollout tokens/s, Qwen3-4B shape: TRL's default against fastgen",
                         metric="tokens_per_s", baseline={"variant": "trl_default", "batch": 8},
                         headline={"variant": "fastgen", "batch": 8})
    return 0


if __name__ == "__main__":
    sys.exit(main())
