"""`rlstack train`: GRPO with TRL's GRPOTrainer on the portable path (use_vllm=False), one recipe in, one
verified adapter out.

Layout of a run (runs/train/<adapter name>/): recipe.json, metrics.jsonl, reward_curve.png, checkpoints/, DONE once
the adapter is written, and .rlstack-lock (held while a process writes the folder). What a call may do with an
existing run folder (resume, finish, refuse) is train/runs.py's decision, made before the model loads.
The adapter itself goes to the adapter store (adapters.py): written atomically with its manifest.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlstack.core import locking
from rlstack.core.errors import RlstackError
from rlstack.core.fileio import check_folder, write_atomic
from rlstack.core.names import check_name
from rlstack.core.paths import shown
from rlstack.payload import adapters, prompt, tokenizer_files
from rlstack.payload.recipes import GrpoSpec, Recipe
from rlstack.payload.train import checkpoints, metrics, ranks, runs


@dataclass
class TrainResult:
    adapter_dir: Path
    manifest: adapters.Manifest | None  # None in the processes other than rank 0 of a multi-process run
    run_dir: Path
    metrics_path: Path
    curve_png: Path | None
    wall_s: float


def runs_root() -> Path:
    return Path(os.environ.get("RLSTACK_RUNS", "runs")) / "train"


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that was sealed after a complete save (see train/checkpoints.py)."""
    sealed = checkpoints.sealed_checkpoints(run_dir / "checkpoints")
    return sealed[-1] if sealed else None


def find_resumable(recipe: Recipe) -> Path | None:
    """The most recent run of this recipe that has a checkpoint (for --resume without --adapter-name)."""
    root = runs_root()
    runs = [d for d in root.glob(f"{recipe.name}-*") if d.is_dir() and last_checkpoint(d)]
    return max(runs, key=lambda d: d.stat().st_mtime, default=None)


def build_dataset(recipe: Recipe, tokenizer: Any, problems: list[Any]) -> Any:
    """The trainer's dataset: each problem's prompt rendered with the model's chat template."""
    from datasets import Dataset

    kwargs = recipe.prompt.chat_template_kwargs
    rows = [{"prompt": prompt.render(tokenizer, p.question, kwargs), "answer": p.answer, "id": p.id} for p in problems]
    return Dataset.from_list(rows)


def grpo_config(recipe: Recipe, output_dir: Path, *, use_vllm: bool, dtype_name: str, on_gpu: bool = False) -> Any:
    """TRL's GRPOConfig from the recipe. `use_vllm` is the --fp8 path (Unsloth runs vLLM in-process and picks
    its own mode); grpo.vllm_mode turns on TRL's own vLLM integration, server or colocate."""
    g = recipe.grpo
    vllm: dict[str, Any] = {}
    if g.vllm_mode != "off":
        import importlib.util

        if use_vllm:
            raise RlstackError(f"grpo.vllm_mode = {g.vllm_mode!r} and --fp8 both ask for vLLM rollouts",
                               "--fp8 runs vLLM inside Unsloth; for TRL's own vLLM drop --fp8, else set "
                               "grpo.vllm_mode=off")
        if importlib.util.find_spec("vllm") is None:
            raise RlstackError(f"grpo.vllm_mode = {g.vllm_mode!r} needs vllm in this environment, and it has none "
                               "(trl's GRPOTrainer imports it and syncs weights through it, in server mode too)",
                               "train in a stack whose lock holds vllm (invoke stacks lists them), or set "
                               "grpo.vllm_mode=off")
        vllm["vllm_mode"] = g.vllm_mode
        if g.vllm_mode == "server":
            vllm.update(vllm_server_host=g.vllm_server_host, vllm_server_port=g.vllm_server_port,
                        vllm_server_timeout=g.vllm_server_timeout)
        else:
            vllm["vllm_gpu_memory_utilization"] = g.vllm_gpu_memory_utilization
    from rlstack.payload.train.compat import patch_trl_availability_flags

    patch_trl_availability_flags()
    from trl import GRPOConfig

    config = GRPOConfig(
        output_dir=str(output_dir),
        use_vllm=use_vllm or g.vllm_mode != "off",
        **vllm,
        learning_rate=g.learning_rate,
        max_steps=g.max_steps,
        num_generations=g.num_generations,
        per_device_train_batch_size=g.per_device_train_batch_size,
        gradient_accumulation_steps=g.gradient_accumulation_steps,
        max_prompt_length=g.max_prompt_length,
        max_completion_length=g.max_completion_length,
        temperature=g.temperature,
        top_p=g.top_p,
        beta=g.beta,
        loss_type=g.loss_type,
        mask_truncated_completions=g.mask_truncated_completions,
        epsilon_high=g.epsilon_high,
        scale_rewards=g.scale_rewards,
        weight_decay=g.weight_decay,
        warmup_steps=int(g.warmup_ratio * g.max_steps),
        lr_scheduler_type=g.lr_scheduler_type,
        max_grad_norm=g.max_grad_norm,
        optim=g.optim,
        gradient_checkpointing=g.gradient_checkpointing,
        # Non-reentrant checkpointing works with a frozen base (LoRA): the reentrant kind needs inputs with grad.
        gradient_checkpointing_kwargs={"use_reentrant": False} if g.gradient_checkpointing else None,
        save_strategy="steps",
        save_steps=g.save_steps,
        save_total_limit=g.save_total_limit,
        logging_steps=1,
        seed=g.seed,
        data_seed=g.seed,
        reward_weights=recipe.reward_weights,
        bf16=dtype_name == "bfloat16",
        fp16=dtype_name == "float16",
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=on_gpu,
        # On the CPU, say so: under a multi-process launcher (torchrun, accelerate launch) transformers then sets
        # up CPU data parallelism (gloo); without it, a machine with a CUDA torch and no GPU trains every process
        # alone, each believing it is rank 0.
        use_cpu=not on_gpu,
        ddp_find_unused_parameters=False,  # every LoRA weight takes part in each forward: skip DDP's extra search
    )
    from rlstack.payload.train.compat import keep_recipe_loss_options

    keep_recipe_loss_options(config, g.mask_truncated_completions, g.epsilon_high)
    return config


def trainer_config(recipe: Recipe, loaded: Any, checkpoints_dir: Path) -> Any:
    """The GRPOConfig for the loaded model, with the process state its trainer reads at the first loss.

    Gradient checkpointing stays what the recipe says under Unsloth too. Unsloth's generated GRPO trainer calls
    `model.for_training(use_gradient_checkpointing=args.gradient_checkpointing)` around every step (unsloth
    2026.6.1 models/rl.py:434-445, 542), which sets each layer's flag: False there would switch off the
    checkpointing get_peft_model(use_gradient_checkpointing="unsloth") set up. Unsloth's own GRPOConfig defaults it
    to True (as TRL's does). What kind of checkpointing then runs depends on the release: unsloth 2026.10.6's
    generated config turns use_reentrant back on (its offloading checkpoint); at 2026.6.1 with transformers 5.5 the
    trainer's gradient_checkpointing_enable() reaches unsloth_checkpoint (zoo gradient_checkpointing.py:917-923)
    non-reentrant, which recomputes without offloading (read from the source, docs/archive/notes.md; not measured)."""
    dtype_name = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    if loaded.device == "cpu":
        dtype_name = "float32"
    config = grpo_config(recipe, checkpoints_dir, use_vllm=loaded.loader == "unsloth-fp8",
                         dtype_name=dtype_name, on_gpu=loaded.device == "cuda")
    said = set_logit_chunking(config, recipe, loaded.loader)
    if said:
        print(f"rlstack train: {said}", file=sys.stderr)
    from rlstack.payload.train.compat import export_mixed_precision

    export_mixed_precision(bool(config.bf16), bool(config.fp16))
    return config


CHUNK_FIELD = "unsloth_logit_chunk_multiplier"  # Unsloth's GRPOConfig field, and the recipe's grpo.<same name>


def set_logit_chunking(config: Any, recipe: Recipe, loader: str) -> str | None:
    """Put grpo.unsloth_logit_chunk_multiplier on Unsloth's GRPOConfig before the trainer is built; return what
    rlstack train says about it (None where there is nothing to say).

    Why (recipes.GrpoSpec has the user's side): Unsloth's GRPO loss computes log-probabilities with
    chunked_hidden_states_selective_log_softmax, compiled with dynamic=True, fullgraph=True, which unrolls a Python
    loop over `chunks = rows x multiplier` pieces of the flattened (rows x width) hidden states (unsloth_zoo
    2026.6.1 rl_replacements.py:73-115 and 1058-1070; 2026.10.6 rl_replacements.py:83-190 and 2221; the logprob
    pass in unsloth 2026.10.6 rl_replacements.py:2405-2422 and 2954). With Unsloth's default multiplier, max(4,
    width // 4096) (zoo 2026.6.1 rl_replacements.py:310-319), the graph has four pieces a sequence, and in zoo
    2026.6.1 torch.chunk makes ceil(n / ceil(n / chunks)) of them (64 rows at widths 128 to 131: 256, 251, 253,
    255), so Dynamo guards on the count and compiles the whole forward and backward again when a
    step's width (TRL pads to the longest completion, Unsloth adds the batch's prompt-length spread:
    rl_replacements.py:843-855 and 1111) lands on a new remainder. At 1 the pieces are exactly the rows, at every width:
    one graph for the run, a quarter the size. zoo 2026.10.6 cuts `chunks` fixed row ranges instead (no recompile, its
    comment at rl_replacements.py:137-139 names the torch.chunk one), but at 4 x rows pieces their symbolic bounds
    (i x n) // chunks make a graph four times as long to trace and lower as at 1, where each bound is i x width.
    Both releases read the field at every step (zoo 2026.6.1 rl_replacements.py:812-840; 2026.10.6
    rl_replacements.py:1572-1589), and TRL's own GRPOConfig has no such field: with the transformers loader the
    option does nothing, and says so only when the recipe changed it."""
    value = recipe.grpo.unsloth_logit_chunk_multiplier
    wanted = None if value == "auto" else value
    if not loader.startswith("unsloth"):
        if value != GrpoSpec.model_fields[CHUNK_FIELD].default:
            return (f"grpo.{CHUNK_FIELD} = {value!r} has no effect with the {loader} loader (it sets Unsloth's GRPO "
                    "loss, which this loader does not run)")
        return None
    if not hasattr(config, CHUNK_FIELD):
        return (f"grpo.{CHUNK_FIELD} = {value!r} could not be set: this Unsloth's GRPOConfig has no {CHUNK_FIELD} "
                "field, so its loss chunks logits its own way (and may compile again when the batch width changes)")
    setattr(config, CHUNK_FIELD, wanted)
    # and as the config class's default: unsloth_zoo 2026.6.1's grpo_accumulated_loss deletes the instance attribute
    # at each accumulation boundary (`del trainer.args.unsloth_logit_chunk_multiplier`, rl_replacements.py:827)
    # and sizes the next step from what the lookup then finds, the class's default (None: 4 pieces a row)
    setattr(type(config), CHUNK_FIELD, wanted)
    if wanted is None:
        return (f"{CHUNK_FIELD} = None (grpo.{CHUNK_FIELD} = 'auto': Unsloth's own choice, which can compile the "
                "GRPO loss again when the padded width changes)")
    return (f"{CHUNK_FIELD} = {wanted} (grpo.{CHUNK_FIELD}): Unsloth's GRPO loss cuts each sequence's logits into "
            f"{wanted} piece(s), so its compiled log-softmax keeps one shape plan across batch widths")


def use_fastgen(recipe: Recipe, trainer: Any, loaded: Any, *, use_vllm: bool) -> bool:
    """Put fastgen behind the trainer's generate call, with the recipe's grpo.fastgen_options, or say on stderr
    why not; True when installed.

    Why: at the recipe's shape with the transformers loader, generation is most of a GRPO step and fastgen's
    CUDA-graph decode cuts it (bench/results/grpo_step.json). Under Unsloth (the portable default) the shadow is
    built from transformers' own classes (Unsloth patches the model's), and TRL's generate call reaches fastgen
    before Unsloth's generate. Off where TRL never calls generate (vLLM rollouts) and on the CPU (the speed is CUDA
    graphs'). Whenever it is off, or falls back later (fastgen prints that once), the reason is on stderr."""
    if use_vllm:
        off = "vLLM generates the rollouts (--fp8 or grpo.vllm_mode)"
    elif loaded.device != "cuda":
        off = f"no CUDA device (the model is on {loaded.device}); TRL's generate is used"
    else:
        off = ""
    if off:
        print(f"rlstack train: grpo.fast_generation = true, but fastgen is off: {off}", file=sys.stderr)
        return False
    from rlstack.payload import fastgen

    options = recipe.grpo.fastgen_options
    fastgen.install_on_trainer(trainer, options)
    changed = options.changed()
    chosen = f", options {', '.join(f'{k}={v}' for k, v in changed.items())}" if changed else ""
    print(f"rlstack train: rollouts through rlstack.payload.fastgen (grpo.fast_generation = true, loader "
          f"{loaded.loader}{chosen}); on any failure it falls back to the model's generate for the rest of the run, "
          "saying why", file=sys.stderr)
    return True


def check_prompt_pool(recipe: Recipe, problems: list[Any], data: str | None) -> None:
    """Refuse a prompt pool too small for one step: TRL's sampler drops an incomplete batch of prompts, so fewer
    prompts than a step takes would train 0 steps and still write an adapter (the untrained one)."""
    g = recipe.grpo
    needed = g.per_device_train_batch_size * g.gradient_accumulation_steps * ranks.world_size() // g.num_generations
    if len(problems) < needed:
        source = f"--data {data}" if data else f"data.train = {recipe.data.train!r}"
        capped = f" (data.n = {recipe.data.n})" if recipe.data.n is not None else ""
        raise RlstackError(
            f"{source} gives {len(problems)} prompt(s){capped}; one GRPO step takes {needed} (grpo."
            f"per_device_train_batch_size {g.per_device_train_batch_size} x gradient_accumulation_steps "
            f"{g.gradient_accumulation_steps} x {ranks.world_size()} process(es) / num_generations "
            f"{g.num_generations})",
            f"give at least {needed} problems (e.g. --data generated:{max(needed, 100)}), or fewer prompts per step")


def run(recipe: Recipe, *, data: str | None = None, adapter_name: str | None = None,
        adapters_root: Path | None = None, run_dir: Path | None = None, resume: bool = False,
        fp8: bool = False, overwrite: bool = False) -> TrainResult:
    """Train (or resume, or finish) one run. Everything a user gave is checked before the model loads: the name,
    the prompt pool, and the run folder's state (train/runs.py), under the run folder's lock."""
    t0 = time.perf_counter()
    if adapter_name is not None:
        check_name(adapter_name, "--adapter-name")
    if fp8:  # recorded in the manifest, so evaluation loads the base the same way
        recipe = recipe.model_copy(deep=True)
        recipe.model.load_in_fp8 = True
    name = adapter_name or recipe.adapter_name
    if run_dir is None:
        if resume and name is None:
            run_dir = find_resumable(recipe)
            if run_dir is None:
                raise RlstackError(f"--resume: no checkpointed run of recipe '{recipe.name}' under {runs_root()}",
                                   "pass --adapter-name NAME of the interrupted run")
            name = run_dir.name
        else:
            if name is None and ranks.world_size() > 1:  # each process would stamp its own time
                raise RlstackError("a multi-process run needs one run name for every process",
                                   "pass --adapter-name NAME")
            name = name or f"{recipe.name}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
            run_dir = runs_root() / name
    name = check_name(name or run_dir.name, "adapter name")
    # absolute: training runs from the run's scratch folder (runs.in_scratch), where a relative path would move
    run_dir, root = run_dir.absolute(), (adapters_root or adapters.default_root()).absolute()
    if ranks.is_main():  # a file in the place of either folder, or a read-only one, before any work
        check_folder(run_dir, "--output (the run folder)")
        check_folder(root, "--adapters-root (the adapter store)")
    from rlstack.payload.data import load_problems

    problems = load_problems(data or recipe.data.train, split=recipe.data.split, n=recipe.data.n,
                             seed=recipe.data.seed, shuffle=True)
    check_prompt_pool(recipe, problems, data)
    main = ranks.is_main()  # only rank 0 writes run files and the adapter (train/ranks.py)
    held = locking.exclusive(
        run_dir, f"run folder {shown(run_dir)}",
        "wait for that training to finish (the lock goes with its process), or train under another --adapter-name",
    ) if main else contextlib.nullcontext()
    with held:
        plan = runs.plan(run_dir, recipe, root / name, resume=resume, overwrite=overwrite)
        if plan.action == "new" and (root / name).exists() and not overwrite:
            raise adapters.AdapterError(f"adapter {root / name} already exists",
                                        "pick another --adapter-name, or --overwrite")
        if plan.action == "finished":
            manifest = adapters.verify(root / name) if main else None
            curve = run_dir / runs.CURVE
            print(f"rlstack train: {name} finished at step {plan.step} (grpo.max_steps {recipe.grpo.max_steps}): "
                  "--resume has nothing to do; adapter, checkpoints and metrics are unchanged (pass a larger "
                  "--max-steps to train further)", file=sys.stderr)
            return TrainResult(root / name, manifest, run_dir, run_dir / runs.METRICS,
                               curve if curve.is_file() else None, time.perf_counter() - t0)
        if not main and plan.action == "adapter-only":
            return TrainResult(root / name, None, run_dir, run_dir / runs.METRICS, None, time.perf_counter() - t0)
        if main:
            if plan.action == "new":
                runs.clear(run_dir)  # --overwrite of an earlier run; nothing there otherwise
                with checkpoints.disk_full_guard(run_dir, "writing the run's recipe.json",
                                                 "free disk space, then run the same command again"):
                    write_atomic(run_dir / runs.RECIPE, recipe.model_dump_json(indent=2) + "\n")
            (run_dir / runs.DONE).unlink(missing_ok=True)
        return _train(recipe, problems, plan, name=name, root=root, run_dir=run_dir, fp8=fp8,
                      overwrite=overwrite or resume, main=main, t0=t0)


def _adapter_from_checkpoint(model: Any, checkpoint: Path) -> None:
    """Load a sealed checkpoint's LoRA weights into the freshly loaded model (the adapter-only path: the run
    finished training, its adapter write did not)."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    weights = load_peft_weights(str(checkpoint), device="cpu")
    result = set_peft_model_state_dict(model, weights)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if not weights or unexpected:
        raise RlstackError(f"{shown(checkpoint)}: its LoRA weights do not fit the model the recipe loads "
                           f"({len(weights)} tensors, unexpected: {unexpected[:3]})",
                           "resume with the run's own recipe, or start a new run")


def _train(recipe: Recipe, problems: list[Any], plan: runs.Plan, *, name: str, root: Path, run_dir: Path,
           fp8: bool, overwrite: bool, main: bool, t0: float) -> TrainResult:
    metrics_path = run_dir / runs.METRICS
    checkpoint = plan.checkpoint if plan.action == "resume" else None
    # Load the model first: unsloth must be imported before trl/transformers patch-sensitive modules.
    from rlstack.payload.train.loading import load_for_training

    loaded = load_for_training(recipe.model, recipe.lora, fp8=fp8, seed=recipe.grpo.seed,
                               gradient_checkpointing=recipe.grpo.gradient_checkpointing)
    if plan.action == "adapter-only":
        assert plan.checkpoint is not None
        _adapter_from_checkpoint(loaded.model, plan.checkpoint)
        kept = metrics.truncate_after(metrics_path, plan.step)
        print(f"rlstack train: {name} finished training at step {plan.step} but its adapter was not written: "
              f"writing it from {plan.checkpoint.name} ({kept} metric rows), no step trained", file=sys.stderr)
        return _write_adapter(recipe, loaded, loaded.model, name=name, root=root, run_dir=run_dir,
                              overwrite=True, t0=t0)
    import torch

    from rlstack.payload.train.compat import alias_guided_decoding_params, patch_trl_availability_flags

    patch_trl_availability_flags()
    alias_guided_decoding_params()  # the transformers loader never imports unsloth, which sets the same alias
    from trl import GRPOTrainer

    from rlstack.payload import rewards

    dataset = build_dataset(recipe, loaded.tokenizer, problems)
    config = trainer_config(recipe, loaded, run_dir / runs.CHECKPOINTS)
    completions_per_step = recipe.grpo.per_device_train_batch_size * recipe.grpo.gradient_accumulation_steps
    from rlstack.core.pkgnames import installed_versions
    from rlstack.payload.train.compat import ZOO_HONOURS_TRUNCATION_MASK, truncation_mask_applies

    # whether truncated completions really leave the loss (unsloth_zoo 2026.6.1's loss ignores the mask): each
    # metrics row records it, so a step with an empty loss can be told from a broken backward pass
    zoo = installed_versions().get("unsloth-zoo")
    masks = truncation_mask_applies(recipe.grpo.mask_truncated_completions, loaded.loader, zoo)
    if recipe.grpo.mask_truncated_completions and not masks:
        print(f"rlstack train: grpo.mask_truncated_completions = true has no effect here: unsloth_zoo {zoo}'s GRPO "
              "loss rebuilds the completion mask and keeps truncated completions (it honours the mask from "
              f"unsloth_zoo {ZOO_HONOURS_TRUNCATION_MASK})", file=sys.stderr)
    callback = metrics.make_callback(metrics_path, list(recipe.rewards), completions_per_step,
                                     mask_truncated=masks)
    if checkpoint is not None and main:
        kept = metrics.truncate_after(metrics_path, plan.step)
        print(f"rlstack train: resuming {run_dir.name} from {checkpoint.name} ({kept} metric rows kept)",
              file=sys.stderr)
    torch.manual_seed(recipe.grpo.seed)
    from rlstack.payload.train.compat import ensure_warnings_issued

    ensure_warnings_issued(loaded.model)
    reward_funcs: Any = rewards.get(recipe.rewards)
    trainer: Any = GRPOTrainer(
        model=loaded.model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=loaded.tokenizer,
        callbacks=[callback, checkpoints.make_seal_callback()],
    )
    if recipe.grpo.fast_generation:
        use_fastgen(recipe, trainer, loaded, use_vllm=config.use_vllm)
    callback.time_phases(trainer)  # after fastgen's hook: the rollout it times is the one that runs
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # our progress line replaces the raw log dicts
    print(f"rlstack train: {recipe.name}: {loaded.base_model} via {loaded.loader} on {loaded.device}, "
          f"{recipe.grpo.max_steps} steps, {len(dataset)} prompts -> {run_dir}", file=sys.stderr, flush=True)
    if main:
        checkpoints.quarantine_torn(run_dir / runs.CHECKPOINTS)
    with checkpoints.disk_full_guard(
        run_dir, "training (writing a checkpoint or metrics)",
        "free disk space, then run the same command with --resume: it continues from the last sealed checkpoint",
    ), runs.in_scratch(run_dir):
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if not main:
        return TrainResult(root / name, None, run_dir, metrics_path, None, time.perf_counter() - t0)
    return _write_adapter(recipe, loaded, trainer.model, name=name, root=root, run_dir=run_dir,
                          overwrite=overwrite, t0=t0)


def _write_adapter(recipe: Recipe, loaded: Any, model: Any, *, name: str, root: Path, run_dir: Path,
                   overwrite: bool, t0: float) -> TrainResult:
    """The run's adapter into the store (atomically, with its manifest), its curve, then DONE."""
    metrics_path = run_dir / runs.METRICS
    rows = metrics.read_rows(metrics_path)
    png = metrics.plot_rewards(metrics_path, run_dir / runs.CURVE, list(recipe.rewards),
                               f"{recipe.name}: {loaded.base_model}")
    summary = metrics.summarize(rows, list(recipe.rewards))
    summary["loader"] = loaded.loader
    summary["device"] = loaded.device
    summary["train_wall_s"] = round(time.perf_counter() - t0, 2)

    def fill(folder: Path) -> None:
        model.save_pretrained(str(folder))
        tokenizer_files.save(loaded.tokenizer, folder)

    with checkpoints.disk_full_guard(root, f"writing adapter {name}",
                                     "free disk space, then --resume: only the adapter is written again"):
        manifest = adapters.write_adapter(
            root, name, fill, base_model=loaded.base_model,
            recipe={**recipe.model_dump(mode="json"), "prompt_version": prompt.PROMPT_VERSION},
            metrics=summary, overwrite=overwrite,
        )
        write_atomic(run_dir / runs.DONE, str(root / name) + "\n")
    wall = time.perf_counter() - t0
    print(f"rlstack train: adapter {root / name} (reward {summary.get('reward_first')} -> "
          f"{summary.get('reward_last')}), metrics {metrics_path}, curve {png}", file=sys.stderr)
    warning = metrics.no_signal_warning(summary, list(recipe.rewards))
    if warning:
        print(f"rlstack train: warning: {warning}", file=sys.stderr)
    return TrainResult(root / name, manifest, run_dir, metrics_path, png, wall)
