"""What a training call does with its run folder (runs/train/<name>/), decided before any model is loaded.

The rules a user can predict:
- One process writes a run folder at a time (core.locking): a second training of the same name stops at once
  and names the holder, so two runs never interleave one metrics.jsonl.
- A plain call on a folder that holds a run refuses, and says the one command that works: --resume when a
  sealed checkpoint exists, else --overwrite (nothing can be resumed from a run without a sealed checkpoint).
- --resume of a finished run (its last sealed checkpoint is at grpo.max_steps and its adapter is intact)
  says so and changes nothing; with a smaller max_steps it refuses; when the adapter write was interrupted
  it writes the adapter from the final checkpoint without training another step.
- recipe.json is the recipe the run started with, and a resume never rewrites it. A resume whose recipe
  differs in anything but the fields that may change between sessions (RESUMABLE) refuses before anything is
  touched, and names the fields.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from rlstack.core.errors import RlstackError
from rlstack.core.paths import shown
from rlstack.payload.recipes import Recipe
from rlstack.payload.train import checkpoints

RECIPE = "recipe.json"
METRICS = "metrics.jsonl"
DONE = "DONE"
CURVE = "reward_curve.png"
CHECKPOINTS = "checkpoints"
SCRATCH = "scratch"  # the training loop's working folder (in_scratch)
# Fields a resumed session may change: how long it trains, how it checkpoints, what evaluation uses later.
RESUMABLE = ("grpo.max_steps", "grpo.save_steps", "grpo.save_total_limit", "eval", "description", "adapter_name")


class RunStateError(RlstackError):
    """A run folder whose state does not allow what the call asked for."""


Action = Literal["new", "resume", "adapter-only", "finished"]


@dataclass(frozen=True)
class Plan:
    action: Action
    checkpoint: Path | None  # the sealed checkpoint to resume from or to take the adapter from
    step: int  # its global step (0 for a new run)


def checkpoint_step(ckpt: Path) -> int:
    """The global step a sealed checkpoint holds, from the trainer's own state file."""
    try:
        return int(json.loads((ckpt / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunStateError(f"{shown(ckpt)}: sealed, but its trainer_state.json is unreadable ({exc})",
                            "move that checkpoint folder aside: --resume then takes the one before it") from None


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def recipe_changes(run_dir: Path, recipe: Recipe) -> list[str]:
    """The fields where `recipe` differs from the run's recipe.json, outside RESUMABLE, as 'field: old -> new'."""
    path = run_dir / RECIPE
    try:
        stored = Recipe.model_validate(json.loads(path.read_text())).model_dump(mode="json")
    except FileNotFoundError:
        return []  # a run from before recipe.json was kept: nothing to compare against
    except (OSError, ValueError, ValidationError) as exc:
        raise RunStateError(f"--resume: {shown(path)} cannot be read as a recipe ({str(exc)[:200]})",
                            "restore it, or start a new run with another --adapter-name") from None
    old, new = _flat(stored), _flat(recipe.model_dump(mode="json"))
    changed = []
    for key in sorted(set(old) | set(new)):
        if any(key == r or key.startswith(r + ".") for r in RESUMABLE):
            continue
        if old.get(key) != new.get(key):
            changed.append(f"{key}: {json.dumps(old.get(key))} -> {json.dumps(new.get(key))}")
    return changed


def _has_history(run_dir: Path) -> bool:
    metrics = run_dir / METRICS
    return (metrics.is_file() and metrics.stat().st_size > 0) or (run_dir / CHECKPOINTS).is_dir()


def _no_checkpoint(run_dir: Path, recipe: Recipe, *, resume: bool) -> RunStateError:
    from rlstack.payload.train import metrics

    try:
        rows = metrics.read_rows(run_dir / METRICS)
    except RlstackError:
        rows = []
    last = f"metrics up to step {rows[-1].get('step')}" if rows else "no metrics"
    flags = "the same command without --resume, with --overwrite" if resume else "the same command with --overwrite"
    return RunStateError(
        f"{shown(run_dir)} holds a run that stopped before its first sealed checkpoint ({last}; checkpoints are "
        f"written every grpo.save_steps={recipe.grpo.save_steps} steps): there is nothing to resume",
        f"start it over: {flags} (it replaces that run's metrics and checkpoints)")


def clear(run_dir: Path) -> None:
    """Remove a run's own files (metrics, checkpoints, recipe, curve, DONE, scratch) for --overwrite; nothing else
    in the folder (it may be a folder the user chose with --output) and not the lock."""
    for name in (METRICS, RECIPE, DONE, CURVE):
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
    shutil.rmtree(run_dir / SCRATCH, ignore_errors=True)


@contextlib.contextmanager
def in_scratch(run_dir: Path) -> Iterator[Path]:
    """Run the training loop from run_dir/scratch. Why: libraries write relative paths while training (unsloth_zoo's
    load_lora saves the live LoRA config to 'grpo_trainer_lora_model' on every vLLM rollout), and an image's
    working folder is read-only ("Read-only file system" on the first step of the fp8 stack's image); the run
    folder is the one place a run may always write, and each run's own folder keeps two runs apart."""
    scratch = run_dir / SCRATCH
    scratch.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(scratch):
        yield scratch


def adapter_complete(adapter_dir: Path, step: int) -> bool:
    """The adapter of a finished run is there, intact, and was written from that step."""
    from rlstack.payload import adapters

    try:
        manifest = adapters.verify(adapter_dir)
    except RlstackError:
        return False
    return manifest.metrics.get("steps") == step


def plan(run_dir: Path, recipe: Recipe, adapter_dir: Path, *, resume: bool, overwrite: bool) -> Plan:
    """What this call does with the run folder (see the module's rules); raises when the answer is 'nothing it
    may do'. Reads only: the caller acts on the plan."""
    sealed = checkpoints.sealed_checkpoints(run_dir / CHECKPOINTS)
    if not resume:
        if _has_history(run_dir) and not overwrite:
            if not sealed:
                raise _no_checkpoint(run_dir, recipe, resume=False)
            raise RunStateError(
                f"{shown(run_dir)} already holds a run (sealed checkpoint at step {checkpoint_step(sealed[-1])})",
                "continue it: the same command with --resume (or --overwrite starts it over, replacing it)")
        return Plan("new", None, 0)
    if not sealed:
        if _has_history(run_dir):
            raise _no_checkpoint(run_dir, recipe, resume=True)
        raise RunStateError(f"--resume: {shown(run_dir)} holds no run to resume", "drop --resume to start it")
    changed = recipe_changes(run_dir, recipe)
    if changed:
        raise RunStateError(
            f"--resume: the recipe differs from the run's own ({shown(run_dir / RECIPE)}, left unchanged): "
            + "; ".join(changed),
            "resume with the run's recipe (a resume may change only " + ", ".join(RESUMABLE) + "), or train a "
            "new run with another --adapter-name")
    ckpt = sealed[-1]
    step = checkpoint_step(ckpt)
    wanted = recipe.grpo.max_steps
    if step > wanted:
        raise RunStateError(
            f"--resume: {run_dir.name} has trained {step} steps already; grpo.max_steps={wanted} asks for fewer. "
            "Nothing was changed",
            f"pass --max-steps {step} or more to use or continue it; a shorter run needs a new --adapter-name")
    if step == wanted:
        done = (run_dir / DONE).is_file() and adapter_complete(adapter_dir, step)
        return Plan("finished" if done else "adapter-only", ckpt, step)
    return Plan("resume", ckpt, step)
