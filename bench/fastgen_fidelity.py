"""Does fastgen compute the policy's function on a real pretrained model? (issue 14, "same function")

On the embedded SmolLM2-135M-Instruct (a real model, from a pinned PyPI wheel: rlstack.payload.embedded) with a
LoRA adapter whose B is not zero (a trained adapter is not zero), in bf16 by default:

1. greedy: fastgen's tokens against transformers' generate on the same prompts (GSM8K-style problems rendered
   with rlstack's prompt), every sequence run to the same length (EOS held off, so every position is compared);
   target: equal on >= 95 % of positions. First divergences are reported too: greedy decoding copies one flipped
   token into everything after it, so a single near-tie ends a row's agreement.
2. sampling: fastgen samples the recipe's way (temperature, top-k 50); each step's logits come out through the
   engine's `on_logits` hook (an observation: nothing in the engine changes). The training model (the PEFT
   model) is then run teacher-forced on the sampled sequences, as GRPO's loss does, and the per-token KL between
   the two full distributions at the sampling temperature is reported, with the log-ratio of the sampled tokens.

What a difference does to the update: with TRL 0.24 and num_iterations = 1 the loss's log-probs and "old"
log-probs both come from the training model, so the sampler's log-probs never enter the loss; a sampler that
differs from the policy makes the rollouts slightly off-policy (by the KL measured here), which biases the
gradient estimate by that much, and nothing corrects for it (TRL's importance-sampling correction exists for
vLLM only). The log-ratio on sampled tokens is the importance weight such a correction would apply.

Runs where it is: CPU here (no compile, eager; minutes on 2 cores), CUDA on the device machine (compiled, CUDA
graphs), where the embedded model and portable's transformers travel: bench/transport/fastgen_fidelity_device.sh.
`--engine-option` switches one part of the engine (the LoRA merge, the decode attention, compile) to find
where a divergence comes from. Rows are keyed by device, model, dtype, LoRA rank and engine mode: a run replaces
its own rows in bench/results/fastgen_fidelity.json and keeps the others.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import common
from rlstack.core import results  # common puts src/ on the path

NAME = "fastgen_fidelity"
# the columns the pages show (every row keeps all it measured): the migrated table's, with the base and the
# control a KL is read against
COLUMNS = ["device", "model", "dtype", "base", "lora_r", "engine_mode", "greedy_equal_fraction",
           "greedy_rows_identical", "kl_mean", "control_generate_kl_mean", "generate_s", "fastgen_s"]
NOTES = ("`bench/fastgen_fidelity.py`: fastgen against transformers' generate (greedy, every position) and "
         "against the training model's teacher-forced distribution (sampled, per-token KL at the sampling "
         "temperature), on a real pretrained model with a non-zero LoRA adapter. Target: greedy tokens equal "
         "on >= 95 % of positions. The module docstring says what a KL does to GRPO's update. The header above "
         "is the last run's machine; each row names its own (`versions`).")


def load(model_name: str, dtype: str, device: str, lora_r: int, seed: int, four_bit: bool = False
         ) -> tuple[Any, Any, str]:
    """(PEFT model, tokenizer, folder): the base in `dtype` on `device`, LoRA on every projection with B drawn
    N(0, 0.02) (zero-B would make the adapter a no-op and the test of the merge empty). `four_bit`: the base in
    NF4 with double quantization, computing in `dtype` (QLoRA as rlstack's loaders ask bitsandbytes for it), which
    fastgen's shadow dequantizes once."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlstack.payload import embedded

    folder = str(embedded.ensure(model_name)) if embedded.is_embedded(model_name) else model_name
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if four_bit:
        from rlstack.payload.fastgen import shadow
        from rlstack.payload.train.loading import nf4_config

        quant = nf4_config(getattr(torch, dtype))
        base = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), quantization_config=quant,
                                                    device_map={"": device}).eval()
        shadow.keep_nf4_on_cpu(base)  # the path the training forward and a GPU take
    else:
        base = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
    if lora_r <= 0:
        return base, tok, folder
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(p.dtype))
    return model.eval(), tok, folder


def prompts(tok: Any, n: int, seed: int) -> list[str]:
    from rlstack.payload import prompt
    from rlstack.payload.data.generator import generate

    return [prompt.render(tok, p.question) for p in generate(n, seed=seed, level="easy")]


def greedy(model: Any, tok: Any, texts: list[str], new: int, batch: int, device: str,
           control: bool = True) -> dict[str, Any]:
    """fastgen vs generate, greedy, `new` tokens each (EOS held off on both sides). The control: transformers'
    static-cache generate against its default dynamic cache, the same question asked of transformers itself
    (in bf16 a different kernel or reduction order alone flips near-ties; in float32 neither should); on CUDA
    also its compiled static-cache path, the library's own fused engine (on the H200 the uncompiled static
    cache ran the very kernels of the dynamic one and agreed on every position, a control too close to tell)."""
    import torch

    from rlstack.payload import fastgen

    engine = fastgen.get_engine(model)
    eos = int(tok.eos_token_id)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else eos)
    equal = total = 0
    prefixes: list[int] = []
    margins: list[float] = []
    ctrl_equal = ctrl_compiled_equal = 0
    t_fast = t_ref = 0.0
    for i in range(0, len(texts), batch):
        enc = tok(texts[i:i + batch], return_tensors="pt", padding=True).to(device)
        P = enc["input_ids"].shape[1]
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=pad, eos_token_id=eos, output_scores=True,
                                 return_dict_in_generate=True)
        ref = out.sequences[:, P:]
        t_ref += time.perf_counter() - t0
        t0 = time.perf_counter()
        got = engine.generate(enc["input_ids"], enc["attention_mask"], new,
                              fastgen.Sampling(do_sample=False, min_new_tokens=new, eos_token_ids=(eos,),
                                               pad_token_id=pad))[:, P:]
        t_fast += time.perf_counter() - t0
        if control:
            # transformers' own other path on the same weights: a static cache instead of the dynamic one
            with torch.no_grad():
                alt = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                     pad_token_id=pad, eos_token_id=eos, cache_implementation="static",
                                     disable_compile=True)[:, P:]
            ctrl_equal += int((alt == ref).sum())
            if device == "cuda":
                # transformers' compiled path (static cache, generate's own auto-compile on CUDA): fused kernels
                # like fastgen's, so it says whether a compiled engine can meet the target in this dtype at all
                with torch.no_grad():
                    alt = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                         pad_token_id=pad, eos_token_id=eos, cache_implementation="static")[:, P:]
                ctrl_compiled_equal += int((alt == ref).sum())
        same = (ref == got).int()
        equal += int(same.sum())
        total += same.numel()
        prefixes += [int(x) for x in same.cumprod(1).sum(1)]
        # at a row's first divergence both engines saw the same prefix: generate's own logit gap between its
        # token and fastgen's says whether the flip was a near-tie (rounding-sized) or a real difference
        margins += [d.gap for d in fastgen.divergences(ref, got, out.scores)]
    return {"greedy_positions": total, "greedy_equal_fraction": round(equal / total, 4),
            "greedy_rows_identical": sum(p == new for p in prefixes), "greedy_rows": len(prefixes),
            "first_divergence_median": statistics.median(prefixes), "first_divergence_min": min(prefixes),
            "divergence_logit_gap_max": round(max(margins), 4) if margins else None,
            "divergence_logit_gap_median": round(statistics.median(margins), 4) if margins else None,
            "control_static_cache_equal_fraction": round(ctrl_equal / total, 4) if control else None,
            "control_static_compiled_equal_fraction":
                round(ctrl_compiled_equal / total, 4) if control and device == "cuda" else None,
            "generate_s": round(t_ref, 2), "fastgen_s": round(t_fast, 2)}


def sampled_kl(model: Any, tok: Any, texts: list[str], new: int, batch: int, device: str, temperature: float,
               top_k: int, seed: int) -> dict[str, Any]:
    """Sample with fastgen, recording its logits; score the same tokens with the training model's forward."""
    import torch

    from rlstack.payload import fastgen

    engine = fastgen.get_engine(model)
    eos = int(tok.eos_token_id)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else eos)
    kls: list[float] = []
    ratios: list[float] = []
    ctrl: list[float] = []
    for i in range(0, len(texts), batch):
        enc = tok(texts[i:i + batch], return_tensors="pt", padding=True).to(device)
        steps: list[Any] = []
        gen = torch.Generator(device=device).manual_seed(seed + i)
        seq = engine.generate(enc["input_ids"], enc["attention_mask"], new,
                              fastgen.Sampling(do_sample=True, temperature=temperature, top_k=top_k,
                                               min_new_tokens=new, eos_token_ids=(eos,), pad_token_id=pad),
                              generator=gen, on_logits=lambda k, logits, out=steps: out.append(logits.detach().clone()))
        kl, ratio = _against_policy(model, enc, seq, torch.stack(steps, 1), temperature)
        kls += kl
        ratios += ratio
        # the control: transformers' generate sampling from the same PEFT model (TRL's default rollout), its raw
        # logits scored the same way: the KL every TRL user's rollouts already carry in this dtype
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=True,
                                 temperature=temperature, top_k=top_k, top_p=1.0, pad_token_id=pad,
                                 eos_token_id=eos, output_logits=True, return_dict_in_generate=True)
        kl, _ = _against_policy(model, enc, out.sequences, torch.stack(out.logits, 1).float(), temperature)
        ctrl += kl
    kls.sort()
    ratios.sort()
    ctrl.sort()
    return {"kl_tokens": len(kls), "kl_mean": statistics.fmean(kls), "kl_p99": kls[int(0.99 * (len(kls) - 1))],
            "kl_max": kls[-1], "abs_log_ratio_mean": statistics.fmean(ratios),
            "abs_log_ratio_max": ratios[-1], "control_generate_kl_mean": statistics.fmean(ctrl),
            "control_generate_kl_p99": ctrl[int(0.99 * (len(ctrl) - 1))]}


def _against_policy(model: Any, enc: Any, seq: Any, sampler_logits: Any, temperature: float
                    ) -> tuple[list[float], list[float]]:
    """Per-token KL(policy || sampler) and |log-ratio| of the sampled tokens, the policy being the training
    model's teacher-forced forward over the sampled sequence at the sampling temperature (GRPO's log-probs)."""
    import torch

    P = enc["input_ids"].shape[1]
    q = torch.log_softmax(sampler_logits / temperature, -1)  # [B, T, V]
    mask = torch.cat([enc["attention_mask"], torch.ones_like(seq[:, P:])], 1)
    pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=mask, position_ids=pos).logits.float()[:, P - 1:-1]
    p = torch.log_softmax(logits / temperature, -1)
    kl = (p.exp() * (p - q)).sum(-1)
    tokens = seq[:, P:]
    ratio = (p.gather(-1, tokens[..., None]) - q.gather(-1, tokens[..., None]))[..., 0]
    return kl.flatten().tolist(), ratio.abs().flatten().tolist()


def merge_rows(path: Path, rows: list[dict[str, Any]], key: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows already in the results file, with this run's replacing those of the same key."""
    old = results.read(path).rows if path.exists() else []
    mine = {tuple(r.get(k) for k in key) for r in rows}
    return [r for r in old if tuple(r.get(k) for k in key) not in mine] + rows


def main(argv: list[str] | None = None) -> int:
    from rlstack.payload import kernelcache

    kernelcache.apply()  # before torch: with RLSTACK_KERNEL_CACHE set, compiled kernels can go to the next lease
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded:smollm2-135m", help="embedded:<key> or a model folder")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("-n", type=int, default=16, help="prompts (generated-easy problems, held-out seed)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lora-r", type=int, default=16, help="0: no adapter (the base alone)")
    ap.add_argument("--load-in-4bit", action="store_true", help="the base in NF4 (QLoRA), computing in --dtype")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7)
    common.add_engine_option(ap, "to find which part of the engine a divergence comes from: merge_lora=false "
                                 "(decode through the PEFT modules, as the training model does), gqa_attention=false "
                                 "(transformers' sdpa), compile=false")
    a = ap.parse_args(argv)
    options = common.engine_options(a.engine_option)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    model, tok, folder = load(a.model, a.dtype, device, a.lora_r, a.seed, a.load_in_4bit)
    texts = prompts(tok, a.n, seed=a.seed + 1000)
    print(f"fastgen_fidelity: {a.model} ({folder}) {a.dtype} on {device}, LoRA r={a.lora_r}, {a.n} prompts x "
          f"{a.new_tokens} tokens", file=sys.stderr, flush=True)
    from rlstack.payload import fastgen

    engine = fastgen.get_engine(model, **options)  # built here with the options; greedy and sampled reuse it
    g = greedy(model, tok, texts, a.new_tokens, a.batch, device)
    print(f"greedy: {g}", file=sys.stderr, flush=True)
    s = sampled_kl(model, tok, texts, a.new_tokens, a.batch, device, a.temperature, a.top_k, a.seed)
    print(f"sampled: {s}", file=sys.stderr, flush=True)
    import transformers

    # the file's header holds the last run's versions; rows from other machines keep their own here
    where = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    # base: only a quantized one is named, so dense rows keep the key of the rows written before the column
    row = {"device": device, "model": a.model, "dtype": a.dtype, **({"base": "nf4"} if a.load_in_4bit else {}),
           "lora_r": a.lora_r,
           "versions": f"torch {torch.__version__}, transformers {transformers.__version__} on {where}",
           # fused=N: fuse_projections (the default since 2026-12-04) fused N GEMMs of a step away
           "engine_mode": " ".join([f"compile={engine.compile} graph={engine.graph}",
                                    *(f"{k}={v}" for k, v in sorted(options.items())
                                      if k not in ("compile", "graph")),
                                    *([f"fused={engine.fused_gemms_saved}"] if engine.fused_gemms_saved else [])]),
           "prompts": a.n,
           "new_tokens": a.new_tokens, "temperature": a.temperature, "top_k": a.top_k, **g,
           **{k: (round(v, 6) + 0.0 if isinstance(v, float) else v) for k, v in s.items()},  # + 0.0: no "-0"
           "target_greedy_95": g["greedy_equal_fraction"] >= 0.95, "wall_s": round(time.perf_counter() - t0, 1),
           "command": "python bench/fastgen_fidelity.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    table = merge_rows(common.RESULTS / f"{NAME}.json", [row],
                       ("device", "model", "dtype", "base", "lora_r", "engine_mode"))
    common.write_results(NAME, common.header(), table, COLUMNS, NOTES, question="fidelity", engine="fastgen",
                         title="fastgen against transformers' generate: greedy agreement, sampled KL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
