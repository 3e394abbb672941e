"""`rlstack train | eval | rescore | compare | adapters`: the payload that runs inside every stack's image.

The flags here are a stable interface: `invoke train/eval --stack` run exactly these commands in the container.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_RECIPE = "gsm8k-grpo"


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="GRPO-train a LoRA adapter from a recipe",
                       description="GRPO with TRL (use_vllm=False); writes the adapter with manifest.json.")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help="recipe path or name in recipes/ (default: gsm8k-grpo)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe field, e.g. --set grpo.max_steps=10 (repeatable)")
    p.add_argument("--data", help="training data: gsm8k, generated:N or a JSONL path (overrides data.train)")
    p.add_argument("--model", help="base model (overrides model.name)")
    p.add_argument("--max-steps", type=int, help="overrides grpo.max_steps")
    p.add_argument("--adapter-name", help="adapter name in the store (default: <recipe>-<UTC time>)")
    p.add_argument("--output", type=Path, help="run folder for metrics/checkpoints (default: runs/train/<name>)")
    p.add_argument("--adapters-root", type=Path, help="adapter store (default: $RLSTACK_ADAPTERS, /adapters, "
                   "./runs/adapters)")
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument("--fp8", action="store_true", help="Unsloth FP8 RL path (load_in_fp8 + vLLM rollouts)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing adapter of the same name")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON at the end")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a base model or an adapter on GSM8K-style problems")
    p.add_argument("--adapter", help="adapter name (in the store) or folder; verified against its manifest")
    p.add_argument("--model", help="base model (default: the adapter's base_model)")
    p.add_argument("--backend", choices=["hf", "vllm"], help="generation backend (default: recipe's, hf)")
    p.add_argument("-n", type=int, help="number of questions, the first N in order (default 300)")
    p.add_argument("--data", help="gsm8k, generated:N or a JSONL path (default: recipe's eval.data)")
    p.add_argument("--split", help="dataset split (default: test)")
    p.add_argument("--recipe", help="take eval defaults from this recipe (default: the adapter's recipe)")
    p.add_argument("--batch-size", type=int, help="generation batch size (hf backend)")
    p.add_argument("--max-new-tokens", type=int, help="generation length limit")
    p.add_argument("--seed", type=int, help="seed (decoding is greedy; the seed fixes anything random)")
    p.add_argument("--load-in-4bit", action="store_true", help="load the base in 4-bit (bitsandbytes, GPU)")
    p.add_argument("--output", type=Path, help="output folder (default: runs/eval/<label>-<backend>-<time>)")
    p.add_argument("--json", action="store_true", help="print results JSON")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("rescore", help="re-score a generations.jsonl offline with the current extractor")
    p.add_argument("generations", type=Path)
    p.add_argument("--output", type=Path, help="default: results.rescored.json beside the generations")
    p.set_defaults(func=cmd_rescore)

    p = sub.add_parser("compare", help="paired comparison of two results.json (McNemar + bootstrap)")
    p.add_argument("base", type=Path)
    p.add_argument("tuned", type=Path)
    p.add_argument("--iters", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("adapters", help="list the adapters in the store")
    p.add_argument("--root", type=Path, help="adapter store (default: $RLSTACK_ADAPTERS, /adapters, runs/adapters)")
    p.add_argument("--verify", action="store_true", help="also check every file's sha256")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_adapters)


def _recipe_overrides(args: argparse.Namespace) -> list[str]:
    extra = list(args.overrides)
    if args.data:
        extra.append(f"data.train={json.dumps(args.data)}")
    if args.model:
        extra.append(f"model.name={json.dumps(args.model)}")
    if args.max_steps is not None:
        extra.append(f"grpo.max_steps={args.max_steps}")
    return extra


def cmd_train(args: argparse.Namespace) -> int:
    from rlstack.payload import recipes
    from rlstack.payload.train import grpo

    recipe = recipes.load(args.recipe, _recipe_overrides(args))
    res = grpo.run(recipe, adapter_name=args.adapter_name, adapters_root=args.adapters_root, run_dir=args.output,
                   resume=args.resume, fp8=args.fp8, overwrite=args.overwrite)
    if args.json:
        print(res.manifest.model_dump_json(indent=2))
    else:
        print(f"adapter:  {res.adapter_dir}\nmetrics:  {res.metrics_path}\ncurve:    {res.curve_png}\n"
              f"wall:     {res.wall_s:.1f}s")
    return 0


def eval_config(args: argparse.Namespace) -> Any:
    """Flags over the recipe's [eval] section (the given recipe, else the adapter's own), over defaults."""
    from rlstack.payload import adapters, recipes
    from rlstack.payload.evaluate.gsm8k import EvalConfig

    recipe: dict[str, Any] = {}
    if args.recipe:
        recipe = recipes.load(args.recipe).model_dump(mode="json")
    elif args.adapter:
        recipe = adapters.read_manifest(adapters.find_adapter(args.adapter)).recipe
    section = dict(recipe.get("eval") or {})
    model = recipe.get("model") or {}
    cfg = EvalConfig(load_in_4bit=args.load_in_4bit or bool(model.get("load_in_4bit")),
                     load_in_fp8=bool(model.get("load_in_fp8")),
                     chat_template_kwargs=dict((recipe.get("prompt") or {}).get("chat_template_kwargs") or {}),
                     tiny=model.get("tiny"))
    for key in ("data", "split", "n", "seed", "batch_size", "max_new_tokens", "backend"):
        if key in section:
            setattr(cfg, key, section[key])
    for key in ("model", "adapter", "backend", "n", "data", "split", "batch_size", "max_new_tokens", "seed",
                "output"):
        val = getattr(args, key, None)
        if val is not None:
            setattr(cfg, key, val)
    return cfg


def cmd_eval(args: argparse.Namespace) -> int:
    from rlstack.payload.evaluate import gsm8k

    result = gsm8k.run(eval_config(args))
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "per_question"}, indent=2))
    else:
        print(f"accuracy: {result['accuracy']:.4f} ({result['correct']}/{result['n']}), "
              f"format reward {result['format_reward_mean']:.3f}\n"
              f"results:  {Path(result['output_dir']) / 'results.json'}\n"
              f"raw:      {Path(result['output_dir']) / 'generations.jsonl'}")
    return 0


def cmd_rescore(args: argparse.Namespace) -> int:
    from rlstack.payload.evaluate import gsm8k

    gsm8k.rescore(args.generations, args.output)
    return 0


def format_compare(c: dict[str, Any]) -> str:
    lo, hi = c["bootstrap_95_points"]
    verdict = "significant" if c["significant_at_0.05"] else "not significant"
    lines = [
        f"questions:      {c['n']} paired" + (f" ({c['unpaired_questions']} unpaired ignored)"
                                              if c["unpaired_questions"] else ""),
        f"base:           {c['base_accuracy']:.2%} ({c['base_correct']}/{c['n']})",
        f"tuned:          {c['tuned_accuracy']:.2%} ({c['tuned_correct']}/{c['n']})",
        f"delta:          {c['delta_points']:+.2f} pts, bootstrap 95% CI [{lo:+.2f}, {hi:+.2f}]",
        f"discordant:     tuned fixed {c['discordant']['tuned_only']}, broke {c['discordant']['base_only']}",
        f"McNemar exact:  p = {c['mcnemar_exact_p']:.4g} ({verdict} at 0.05)",
    ]
    for label, key in (("fixed:", "fixed"), ("broken:", "broken")):
        ids = c["flips"][key]
        if ids:
            lines.append(f"{label:16}" + ", ".join(ids[:20]) + (" ..." if len(ids) > 20 else ""))
    return "\n".join(lines)


def cmd_compare(args: argparse.Namespace) -> int:
    from rlstack.payload.evaluate import gsm8k

    c = gsm8k.compare(args.base, args.tuned, iters=args.iters)
    print(json.dumps(c, indent=2) if args.json else format_compare(c))
    return 0


def cmd_adapters(args: argparse.Namespace) -> int:
    from rlstack.payload import adapters

    root = args.root or adapters.default_root()
    manifests = adapters.list_adapters(root)
    if args.verify:
        for m in manifests:
            adapters.verify(root / m.name)
    if args.json:
        print(json.dumps([m.model_dump(mode="json") for m in manifests], indent=2))
        return 0
    if not manifests:
        print(f"no adapters under {root}", file=sys.stderr)
        return 0
    for m in manifests:
        reward = m.metrics.get("reward_last")
        print(f"{m.name:40} base={m.base_model} stack={m.stack} lock={(m.lock_hash or '-')[:12]} "
              f"created={m.created} reward_last={reward}")
    return 0
