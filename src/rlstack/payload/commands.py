"""The payload's commands: `rlstack train | eval | rescore | compare | adapters`, what runs inside a stack.

Each is a typed function whose parameters declare their own flag, help and default (typer's `Annotated`
options, read by rlstack.core.options): the `rlstack` command is built from them. The options the host's
`invoke train/eval/adapters` also take are the aliases below, declared once and named in both signatures; the
host forwards them into the stack's container (`argv_for`), so a flag named in a hint exists wherever the
user typed the command. Options of paths inside the container (--output, --root) are the payload's alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from rlstack.core.errors import RlstackError
from rlstack.payload import MAX_STEPS
from rlstack.payload.data.sources import GENERATED

DEFAULT_RECIPE = "gsm8k-grpo"

# --- options the host lends (invoke train, eval, adapters): each declared here once ---------------------------
Recipe = Annotated[str | None, typer.Option(help="recipe file or name in recipes/ (train: gsm8k-grpo, or under "
                                                 "invoke the stack's default_recipe; eval: the adapter's own "
                                                 "recipe)")]
Overrides = Annotated[list[str] | None, typer.Option(
    "--set", metavar="KEY=VALUE", help="override a recipe field, KEY=VALUE, e.g. grpo.max_steps=10 (repeatable)")]
Data = Annotated[str | None, typer.Option(help=f"problems: gsm8k, {', '.join(f'{k}:N' for k in GENERATED)} (the "
                                               "levels: rlstack.payload.data.generator) or a JSONL file")]
Model = Annotated[str | None, typer.Option(help="base model: a hub id, a local folder, 'tiny' (the recipe's tiny "
                                                "model) or 'embedded:smollm2-135m' (a small pretrained model from "
                                                "a pinned PyPI wheel)")]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output")]
# Counts a run needs at least one of: typer refuses 0 and below under the flag's own name, before any work.
MaxSteps = Annotated[int | None, typer.Option(min=1, max=MAX_STEPS, help="GRPO steps (overrides grpo.max_steps)")]
AdapterName = Annotated[str | None, typer.Option(help="adapter name in the store (default: <recipe>-<UTC time>)")]
Resume = Annotated[bool, typer.Option(help="continue the run from its last sealed checkpoint (a finished run: "
                                          "nothing to do; a larger --max-steps trains further)")]
Fp8 = Annotated[bool, typer.Option(help="Unsloth's FP8 RL path: load_in_fp8 + vLLM rollouts (the fp8 stack)")]
Overwrite = Annotated[bool, typer.Option(help="replace an adapter of the same name; without --resume, also start "
                                                "the run over (its metrics and checkpoints are replaced)")]
TrainJson = Annotated[bool, typer.Option("--json", help="print the adapter's manifest as JSON at the end")]

Adapter = Annotated[str | None, typer.Option(help="adapter name in the store, or its folder; checked against its "
                                                  "manifest first")]
EvalModel = Annotated[str | None, typer.Option("--model", help="base model (default: the adapter's base_model)")]
Backend = Annotated[Literal["hf", "vllm"] | None, typer.Option(help="generation backend (default: the recipe's, "
                                                                    "else hf)")]
Questions = Annotated[int | None, typer.Option("-n", min=1, help="number of questions, the first N in order "
                                                                 "(default 300)")]
Split = Annotated[str | None, typer.Option(help="dataset split (default: test)")]
BatchSize = Annotated[int | None, typer.Option(min=1, help="generation batch size (hf backend)")]
MaxNewTokens = Annotated[int | None, typer.Option(min=1, help="generation length limit")]
Seed = Annotated[int | None, typer.Option(help="seed (decoding is greedy; the seed fixes anything random)")]
LoadIn4bit = Annotated[bool, typer.Option(help="load the base in 4-bit (bitsandbytes, GPU)")]
Unquantized = Annotated[bool, typer.Option(help="load the base as its checkpoint stores it (bf16), even where the "
                                                "adapter's recipe loads it in 4-bit or FP8: the base vLLM's bf16 + "
                                                "LoRARequest runs, to compare two engines on one base")]
Fastgen = Annotated[bool, typer.Option(help="hf backend: greedy decoding through rlstack's fastgen (static cache, "
                                            "LoRA merged, fused CUDA-graph kernels) instead of transformers' "
                                            "generate; in bf16 a near-tie can flip a greedy token "
                                            "(docs/performance.md); falls back once on failure")]
ReferenceKernels = Annotated[bool, typer.Option(help="with --fastgen: transformers' own kernels (adapter unmerged) "
                                                     "replayed in a CUDA graph, for generate's tokens at graph "
                                                     "speed")]
EvalJson = Annotated[bool, typer.Option("--json", help="print the results as JSON")]
Verify = Annotated[bool, typer.Option(help="also check every file against the sha256 in its manifest")]

# --- the payload's own: paths inside the stack ----------------------------------------------------------------
StoreRoot = Annotated[Path | None, typer.Option(help="adapter store (default: $RLSTACK_ADAPTERS, /adapters, "
                                                     "./runs/adapters)")]


def train_overrides(overrides: list[str] | None, data: str | None = None, model: str | None = None,
                    max_steps: int | None = None) -> list[str]:
    """The recipe overrides a `train` call means: its --set items, then the shorthand flags. The host reads the
    same recipe through this (`invoke train --vllm-server` needs its model for the vLLM server), so both see one
    recipe."""
    extra = list(overrides or [])
    if data:
        extra.append(f"data.train={json.dumps(data)}")
    if model:
        extra.append(f"model.name={json.dumps(model)}")
    if max_steps is not None:
        extra.append(f"grpo.max_steps={max_steps}")
    return extra


def train(
    recipe: Recipe = None,
    overrides: Overrides = None,
    data: Data = None,
    model: Model = None,
    max_steps: MaxSteps = None,
    adapter_name: AdapterName = None,
    resume: Resume = False,
    fp8: Fp8 = False,
    overwrite: Overwrite = False,
    output: Annotated[Path | None, typer.Option(help="run folder for metrics and checkpoints (default: "
                                                     "runs/train/<name>)")] = None,
    adapters_root: StoreRoot = None,
    json_: TrainJson = False,
) -> int:
    """GRPO-train a LoRA adapter from a recipe (TRL; Unsloth where the stack has it); writes the adapter with
    its manifest.json, per-step metrics and a reward-curve PNG."""
    from rlstack.payload import recipes
    from rlstack.payload.train import grpo

    spec = recipes.load(recipe or DEFAULT_RECIPE, train_overrides(overrides, data, model, max_steps))
    res = grpo.run(spec, adapter_name=adapter_name, adapters_root=adapters_root, run_dir=output, resume=resume,
                   fp8=fp8, overwrite=overwrite)
    if res.manifest is None:  # not rank 0 of a multi-process run: rank 0 wrote the adapter and reports it
        return 0
    if json_:
        print(res.manifest.model_dump_json(indent=2))
    else:
        from rlstack.core.paths import shown

        print(f"adapter:  {shown(res.adapter_dir)}\nmetrics:  {shown(res.metrics_path)}\n"
              f"curve:    {shown(res.curve_png) if res.curve_png else '-'}\nwall:     {res.wall_s:.1f}s")
    return 0


def eval_config(*, recipe: str | None = None, adapter: str | None = None, **flags: Any) -> Any:
    """Flags over the recipe's [eval] section (the given recipe, else the adapter's own), over defaults."""
    from rlstack.payload import adapters, recipes
    from rlstack.payload.evaluate.gsm8k import EvalConfig

    data: dict[str, Any] = {}
    if recipe:
        data = recipes.load(recipe).model_dump(mode="json")
    elif adapter:
        data = adapters.read_manifest(adapters.find_adapter(adapter)).recipe
    section = dict(data.get("eval") or {})
    model = data.get("model") or {}
    if flags.get("unquantized") and flags.get("load_in_4bit"):
        raise RlstackError("--unquantized and --load-in-4bit contradict each other",
                           "pass one: --unquantized loads the base as its checkpoint stores it, --load-in-4bit in NF4")
    # --unquantized: the same base an engine that ignores the recipe's quantization runs (vLLM's bf16 +
    # LoRARequest), so two engines' generations compare token for token on one base, not NF4 against bf16
    quantize = not flags.get("unquantized")
    # the recipe's [eval] options as recipes.EvalSpec declares them (an older adapter's recipe may name one this
    # rlstack no longer has: it is left out, not an error), then the flags given
    cfg = EvalConfig(**{k: v for k, v in section.items() if k in recipes.EvalSpec.model_fields},
                     load_in_4bit=bool(flags.get("load_in_4bit")) or (quantize and bool(model.get("load_in_4bit"))),
                     load_in_fp8=quantize and bool(model.get("load_in_fp8")),
                     chat_template_kwargs=dict((data.get("prompt") or {}).get("chat_template_kwargs") or {}),
                     tiny=model.get("tiny"), adapter=adapter)
    given = {k: v for k, v in flags.items() if v is not None and k not in ("load_in_4bit", "unquantized")}
    unknown = sorted(set(given) - set(EvalConfig.model_fields))
    if unknown:
        raise RlstackError(f"eval_config got options it does not know: {', '.join(unknown)}",
                           "report it: a flag of rlstack eval has no EvalConfig field")
    return cfg.model_copy(update=given)


def eval_(
    adapter: Adapter = None,
    model: EvalModel = None,
    backend: Backend = None,
    n: Questions = None,
    data: Data = None,
    split: Split = None,
    recipe: Recipe = None,
    batch_size: BatchSize = None,
    max_new_tokens: MaxNewTokens = None,
    seed: Seed = None,
    load_in_4bit: LoadIn4bit = False,
    unquantized: Unquantized = False,
    fastgen: Fastgen = False,
    reference_kernels: ReferenceKernels = False,
    output: Annotated[Path | None, typer.Option(help="output folder (default: under runs/)")] = None,
    json_: EvalJson = False,
) -> int:
    """Evaluate a base model or an adapter on GSM8K-style problems: accuracy, format rate, every raw
    generation saved for `rlstack rescore`."""
    from rlstack.core.paths import shown
    from rlstack.payload.evaluate import gsm8k

    cfg = eval_config(recipe=recipe, adapter=adapter, model=model, backend=backend, n=n, data=data, split=split,
                      batch_size=batch_size, max_new_tokens=max_new_tokens, seed=seed, load_in_4bit=load_in_4bit,
                      unquantized=unquantized, fastgen=fastgen, reference_kernels=reference_kernels,
                      output=output)
    if cfg.reference_kernels and not cfg.fastgen:
        raise RlstackError("--reference-kernels chooses fastgen's kernels and needs --fastgen",
                           "add --fastgen, or drop --reference-kernels (transformers' generate is the default)")
    if cfg.fastgen and cfg.backend != "hf":
        raise RlstackError(f"--fastgen is for the hf backend, not {cfg.backend}",
                           "drop --fastgen (vLLM has its own fast decoding), or use --backend hf")
    result = gsm8k.run(cfg)
    if json_:
        print(json.dumps({k: v for k, v in result.items() if not k.startswith("per_question")}, indent=2))
    else:
        out = Path(result["output_dir"])
        print(f"accuracy: {result['accuracy']:.4f} ({result['correct']}/{result['n']})\n"
              f"format:   {result['format_rate']:.4f} ({result['format_ok']}/{result['n']} end in a '#### <number>' "
              f"line; format reward {result['format_reward_mean']:.3f})\n"
              f"results:  {shown(out / 'results.json')}\n"
              f"raw:      {shown(out / 'generations.jsonl')}")
    return 0


def rescore(
    generations: Annotated[Path, typer.Argument(help="a generations.jsonl written by rlstack eval")],
    output: Annotated[Path | None, typer.Option(help="where to write (default: results.rescored.json beside it)")]
    = None,
) -> int:
    """Re-score saved generations with the current answer extractor (no model needed)."""
    from rlstack.payload.evaluate import scoring

    scoring.rescore(generations, output)
    return 0


def format_compare(c: dict[str, Any], *, flips: bool = True, sentence: bool = True) -> str:
    """Both paired outcomes as one table (accuracy, then format), the flipped questions, and the one-sentence
    summary last."""
    from rlstack.core.tables import text_table
    from rlstack.payload.evaluate.compare import summary

    n = c["n"]
    acc = {**c, "base": c["base_correct"], "tuned": c["tuned_correct"]}
    outcomes = [("accuracy", acc)] + ([("format", c["format"])] if c.get("format") else [])
    rows = []
    for label, d in outcomes:
        lo, hi = d["bootstrap_95_points"]
        verdict = "significant" if d["significant_at_0.05"] else "not significant"
        rows.append([label, f"{d['base'] / n:.2%} ({d['base']}/{n})", f"{d['tuned'] / n:.2%} ({d['tuned']}/{n})",
                     f"{d['delta_points']:+.2f} pts [{lo:+.2f}, {hi:+.2f}]",
                     f"{d['discordant']['tuned_only']} / {d['discordant']['base_only']}",
                     f"p = {d['mcnemar_exact_p']:.4g} ({verdict} at 0.05)"])
    lines = [f"questions: {n} paired" + (f" ({c['unpaired_questions']} unpaired ignored)"
                                         if c["unpaired_questions"] else ""),
             text_table(["", "base", "tuned", "delta, bootstrap 95% CI", "fixed / broke", "McNemar exact"], rows)]
    if c.get("format") is None:
        lines.append("format: not recorded in one of the results (written before rlstack eval kept it, and no "
                     "generations.jsonl beside it)")
    else:
        lines.append("format: the answer ends with a '#### <number>' line, the format the reward trains")
    for label, d in outcomes if flips else []:
        for kind in ("fixed", "broken"):
            ids = d["flips"][kind]
            if ids:
                lines.append(f"{kind} ({label}): " + ", ".join(ids[:20]) + (" ..." if len(ids) > 20 else ""))
    if sentence:
        lines.append(summary(c))
    return "\n".join(lines)


def compare(
    base: Annotated[Path, typer.Argument(help="results.json of the base model (from rlstack eval)")],
    tuned: Annotated[Path, typer.Argument(help="results.json of the tuned adapter, on the same questions")],
    iters: Annotated[int, typer.Option(min=1, help="bootstrap resamples")] = 10_000,
    json_: AsJson = False,
) -> int:
    """Paired base-vs-tuned comparison of accuracy and format: delta, exact McNemar p-value, bootstrap interval,
    per-question flips, and one sentence of what changed."""
    from rlstack.payload.evaluate.compare import compare as paired

    c = paired(base, tuned, iters=iters)
    print(json.dumps(c, indent=2) if json_ else format_compare(c))
    return 0


def adapters(
    root: StoreRoot = None,
    verify: Verify = False,
    json_: AsJson = False,
) -> int:
    """List the adapters in the store: name, base model, stack, lock, date, metrics, and whether each can be
    used. Exits non-zero when any adapter is broken (all are checked either way)."""
    from rlstack.core.paths import shown
    from rlstack.core.tables import text_table
    from rlstack.payload import adapters as store

    root = root or store.default_root()
    if root.exists() and not root.is_dir():  # a file is no empty store: listing it as one hides the mistake
        raise store.AdapterError(f"adapter store {shown(root)} is a file, not a folder",
                                 "pass the store's folder (or set $RLSTACK_ADAPTERS to it)")
    entries = store.scan(root, check_files=verify)
    bad = [e for e in entries if not e.ok]
    if json_:
        print(json.dumps([{"folder": e.folder.name, "ok": e.ok, "problem": e.problem,
                           "hashes_checked": e.hashes_checked,
                           "manifest": e.manifest.model_dump(mode="json") if e.manifest else None}
                          for e in entries], indent=2))
    elif not entries:
        print(f"no adapters under {shown(root)}", file=sys.stderr)
    else:
        rows = []
        for e in entries:
            m = e.manifest
            metrics = (m.metrics if m else {}) or {}
            shown_metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in list(metrics.items())[:3])
            status = "ok, hashes checked" if e.hashes_checked else ("ok" if e.ok else f"BAD: {e.problem}")
            rows.append([e.folder.name, m.base_model if m else "?", m.stack if m else "?",
                         (m.lock_hash or "-")[:12] if m else "?", str(m.created)[:19] if m else "?",
                         shown_metrics or "-", status])
        print(text_table(["adapter", "base model", "stack", "lock", "created", "metrics", "status"], rows))
        what = "every file's sha256 checked against its manifest" if verify else \
            "manifests read; --verify also checks every file's sha256"
        print(f"\n{len(entries)} adapter(s) under {shown(root)}, {len(bad)} bad ({what})", file=sys.stderr)
    return store.IntegrityError.exit_code if bad else 0


COMMANDS: list[Callable[..., Any]] = [train, eval_, rescore, compare, adapters]
