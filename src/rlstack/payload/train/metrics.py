"""Per-step training metrics: one JSONL row per optimizer step, a live progress line, the reward-curve PNG.

The JSONL file is the run's history. On --resume, rows after the checkpoint's step are dropped before training
continues, so the history has each step exactly once, whether or not the run was interrupted.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from rlstack.core.fileio import write_atomic

KEEP = ("loss", "reward", "reward_std", "kl", "entropy", "grad_norm", "learning_rate", "frac_reward_zero_std",
        "completions/mean_length", "completions/clipped_ratio", "num_tokens")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The history. A kill can tear the last line mid-write: that line is dropped (its step is re-run on
    resume); a bad line anywhere else means the file was damaged, and the error names it."""
    if not path.is_file():
        return []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):
                break
            from rlstack.core.errors import RlstackError

            raise RlstackError(f"{path}:{n}: not a JSON metrics row", "restore the file or start a new run") from None
    return rows


def truncate_after(path: Path, step: int) -> int:
    """Keep rows with step <= `step` (the checkpoint we resume from); return how many were kept."""
    rows = [r for r in read_rows(path) if r["step"] <= step]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


GENERATE = "_generate"  # TRL 0.24 GRPOTrainer: prompts -> completion ids, through vLLM or model.generate
GENERATE_AND_SCORE = "_generate_and_score_completions"  # the rollout plus rewards and the log-prob passes


def _sync_cuda() -> None:
    """Wait for queued CUDA work where CUDA is in use, so a phase's time includes its kernels."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


# torch's own running counts (torch._dynamo.utils.counters, section -> name), as each metrics row names them
COMPILE_COUNTERS = {
    "compiled_graphs": ("stats", "unique_graphs"),  # every graph Dynamo handed to a backend: first compiles and
    # recompiles alike
    "fxgraph_cache_hits": ("inductor", "fxgraph_cache_hit"),  # Inductor's generated code, from TORCHINDUCTOR_CACHE_DIR
    "fxgraph_cache_misses": ("inductor", "fxgraph_cache_miss"),
    "aot_cache_hits": ("aot_autograd", "autograd_cache_hit"),  # AOTAutograd's forward/backward split, same folder
    "aot_cache_misses": ("aot_autograd", "autograd_cache_miss"),
}


def compile_counts() -> dict[str, int]:
    """torch.compile's counts so far in this process (COMPILE_COUNTERS); empty where Dynamo was never imported.

    Why: a step that compiles runs minutes of single-threaded Inductor work with the GPU idle, and nothing else in
    a row tells a compile from slow kernels. With the running counts in each row, a slow step shows whether it
    compiled a graph (a first compile or a recompile after a shape change), and a run on a carried kernel cache
    (RLSTACK_KERNEL_CACHE) shows whether Inductor's caches answered. Dynamo's tracing itself is never cached."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return {}
    return {name: int(counters[section][key]) for name, (section, key) in COMPILE_COUNTERS.items()}


def make_callback(path: Path, reward_names: list[str], completions_per_step: int, *,
                  mask_truncated: bool = False) -> Any:
    """A transformers TrainerCallback writing `path` (built here so transformers is imported lazily).
    `mask_truncated`: the loss really drops truncated completions (compat.truncation_mask_applies); each row
    records it, and a step where all were truncated says it learned nothing (a one-step probe's short
    completions, all cut, give loss 0 and grad norm 0)."""
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        def __init__(self) -> None:
            self.step_start: float | None = None
            self.step_time: float | None = None
            self.last_tokens: float | None = None
            self.timed: set[str] = set()  # the trainer methods time_phases wrapped
            self.spent: dict[str, float] = {}  # seconds in each of them during this step
            self.calls: dict[str, int] = {}
            self.last_graphs = 0  # compile_counts()["compiled_graphs"] at the last row

        def time_phases(self, trainer: Any) -> list[str]:
            """Time the trainer's rollout (TRL's ``_generate``: the generation engine, whichever it is) and its
            whole generate-and-score phase (rollout, reward functions, old/reference log-prob passes), so each row
            splits the step into generate_s, score_s and train_s (loss forward, backward, optimizer). Why: a
            step time alone cannot say where an FP8 step's extra seconds go (an FP8 run's steps fell into a fast
            and a slow group: docs/archive/notes.md). Wrapped on the instance, so Unsloth's generated subclass
            is timed too; a method the trainer does not have, or never calls, leaves its field out."""
            import functools

            def wrap(name: str) -> None:
                inner = getattr(trainer, name, None)
                if not callable(inner):
                    return

                @functools.wraps(inner)
                def timed(*a: Any, **k: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return inner(*a, **k)
                    finally:
                        _sync_cuda()  # the engine's kernels, not just their launches
                        self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t
                        self.calls[name] = self.calls.get(name, 0) + 1

                setattr(trainer, name, timed)
                self.timed.add(name)

            for name in (GENERATE, GENERATE_AND_SCORE):
                wrap(name)
            return sorted(self.timed)

        def phases(self) -> dict[str, float]:
            """This step's split (see time_phases): only what was measured."""
            out: dict[str, float] = {}
            if GENERATE_AND_SCORE not in self.timed:
                return out
            whole = self.spent.get(GENERATE_AND_SCORE, 0.0)
            generated = self.calls.get(GENERATE, 0) > 0
            if generated or not self.calls.get(GENERATE_AND_SCORE):  # no rollout this step: 0 is the truth
                out["generate_s"] = round(self.spent.get(GENERATE, 0.0), 4)
                out["score_s"] = round(max(whole - self.spent.get(GENERATE, 0.0), 0.0), 4)
            if self.step_time:
                out["train_s"] = round(max(self.step_time - whole, 0.0), 4)
            return out

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.step_start = time.perf_counter()
            self.spent, self.calls = {}, {}

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.step_start is not None:
                _sync_cuda()  # the backward and optimizer kernels still queued belong to this step
                self.step_time = time.perf_counter() - self.step_start

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kw: Any) -> None:
            if not logs or "reward" not in logs or not state.is_world_process_zero:
                return
            row: dict[str, Any] = {"step": state.global_step, "time": round(time.time(), 3),
                                   "loss_masks_truncated": mask_truncated}
            for k in KEEP:
                if k in logs:
                    row[k.replace("completions/", "completion_")] = logs[k]
            for name in reward_names:
                for stat in ("mean", "std"):
                    key = f"rewards/{name}_reward/{stat}"
                    if key in logs:
                        row[f"{name}_{stat}"] = logs[key]
            if self.step_time:
                row["step_time_s"] = round(self.step_time, 4)
                tokens = logs.get("num_tokens")
                if tokens is not None and self.last_tokens is not None:
                    row["tokens_per_s"] = round((tokens - self.last_tokens) / self.step_time, 2)
                if "completions/mean_length" in logs:  # per process: every one of world_size made as many
                    row["completion_tokens_per_s"] = round(logs["completions/mean_length"] * completions_per_step
                                                           * getattr(args, "world_size", 1) / self.step_time, 2)
                row.update(self.phases())
            self.last_tokens = logs.get("num_tokens")
            row.update(compile_counts())
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            parts = [f"step {state.global_step}/{state.max_steps}", f"reward {row['reward']:.3f}"]
            parts += [f"{n} {row[n + '_mean']:.3f}" for n in reward_names if n + "_mean" in row]
            if "kl" in row:
                parts.append(f"kl {row['kl']:.4f}")
            if "step_time_s" in row:
                split = ", ".join(f"{k.removesuffix('_s')} {row[k]:.2f}s" for k in ("generate_s", "score_s", "train_s")
                                  if k in row)
                parts.append(f"{row['step_time_s']:.2f}s/step" + (f" ({split})" if split else ""))
            compiled = row.get("compiled_graphs", self.last_graphs) - self.last_graphs
            self.last_graphs = row.get("compiled_graphs", self.last_graphs)
            if compiled > 0:
                parts.append(f"torch.compile built {compiled} graph(s) this step")
            if masked_out(row):
                parts.append(f"every completion reached max_completion_length ({args.max_completion_length}) and "
                             "grpo.mask_truncated_completions dropped it from the loss: nothing learned this step")
            print("rlstack train: " + " | ".join(parts), file=sys.stderr, flush=True)

    return MetricsCallback()


STYLES = [("tab:orange", "--", "o"), ("tab:green", ":", "s"), ("tab:red", "-.", "^"), ("tab:purple", "--", "D")]


def plot_rewards(metrics_path: Path, png: Path, reward_names: list[str], title: str) -> Path | None:
    """Write the reward curve (reward_figure) of a run's history to `png`; None when there is no history."""
    rows = read_rows(metrics_path)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = reward_figure(rows, reward_names, title)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def reward_figure(rows: list[dict[str, Any]], reward_names: list[str], title: str) -> Any:
    """The total reward on its own panel, each reward below it in its own colour, dash and marker.

    Two panels because the total is the sum of the rewards: when one of them stays at 0 the total lies exactly
    on the other and, drawn on one axis, hides it. Each legend entry carries the reward's mean over the first
    and the last steps (summarize's window), so the change reads without the axis."""
    import matplotlib.pyplot as plt

    summary = summarize(rows, reward_names)

    def label(name: str, key: str) -> str:
        first, last = summary.get(f"{key}_first"), summary.get(f"{key}_last")
        return f"{name}: {first:.2f} -> {last:.2f}" if first is not None and last is not None else name

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.6), sharex=True)
    steps = [r["step"] for r in rows]
    top.plot(steps, [r["reward"] for r in rows], color="tab:blue", linewidth=2, marker="o", markersize=3,
             label=label("total reward", "reward"))
    top.set_ylabel("total reward")
    for i, name in enumerate(reward_names):
        if all(name + "_mean" in r for r in rows):
            color, dash, marker = STYLES[i % len(STYLES)]
            bottom.plot(steps, [r[name + "_mean"] for r in rows], color=color, linestyle=dash, marker=marker,
                        markersize=4, linewidth=1.6, label=label(name, name + "_mean"))
    bottom.set_ylabel("mean reward")
    bottom.set_xlabel("step")
    top.set_title(f"{title}\n(legend: mean of the first -> the last {summary.get('window', 1)} steps)", fontsize=10)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    return fig


def summarize(rows: list[dict[str, Any]], reward_names: list[str], window: int = 5) -> dict[str, Any]:
    """First/last rewards (each a mean over `window` steps, so one lucky batch does not decide) and timings; the
    steps that could not learn (every group tied, or every completion masked out of the loss)."""
    if not rows:
        return {}
    w = max(1, min(window, len(rows) // 2 or 1))

    def avg(key: str, part: list[dict[str, Any]]) -> float | None:
        vals = [r[key] for r in part if key in r]
        return round(sum(vals) / len(vals), 4) if vals else None

    out: dict[str, Any] = {"steps": rows[-1]["step"], "window": w}
    for key in ["reward", *[n + "_mean" for n in reward_names]]:
        out[f"{key}_first"] = avg(key, rows[:w])
        out[f"{key}_last"] = avg(key, rows[-w:])
    out["step_time_s_mean"] = avg("step_time_s", rows)
    for phase in ("generate_s", "score_s", "train_s"):
        if any(phase in r for r in rows):
            out[f"{phase}_mean"] = avg(phase, rows)
    out["tokens_per_s_mean"] = avg("tokens_per_s", rows)
    out["kl_last"] = rows[-1].get("kl")
    logged = [tied(r) for r in rows if tied(r) is not None]
    if logged:
        out["steps_without_signal"] = sum(logged)
    masked = [m for m in (masked_out(r) for r in rows) if m is not None]
    if masked:
        out["steps_masked_out"] = sum(masked)
    return out


def masked_out(row: dict[str, Any]) -> bool | None:
    """Whether a step's loss was empty because every completion was truncated and its loss dropped truncated
    ones (the row's loss_masks_truncated): its loss and gradients are then exactly 0 whatever the rewards. None
    where the row does not say (no clipped ratio logged, or written before rows recorded the masking)."""
    ratio, masks = row.get("completion_clipped_ratio"), row.get("loss_masks_truncated")
    return None if ratio is None or masks is None else bool(masks and float(ratio) >= 1.0)


def tied(row: dict[str, Any]) -> bool | None:
    """Whether every group of a step got equal rewards, so its advantages, loss and gradients are exactly 0 (TRL
    logs the share of such groups as frac_reward_zero_std); None where the trainer did not log it."""
    frac = row.get("frac_reward_zero_std")
    return None if frac is None else float(frac) >= 1.0


def no_signal_warning(summary: dict[str, Any], reward_names: list[str]) -> str | None:
    """What to say when no step of a run could learn: every group's completions got equal rewards, so the adapter
    is the one it started as. None when some step had a signal, or the trainer did not log it."""
    steps, without = summary.get("steps"), summary.get("steps_without_signal")
    if steps and summary.get("steps_masked_out") == steps:
        return (f"nothing learned in any of {steps} steps: every completion reached grpo.max_completion_length and "
                "grpo.mask_truncated_completions dropped it from the loss, so the loss and gradients were 0 and "
                "the adapter did not change. Next: a longer grpo.max_completion_length, a prompt that asks for a "
                "short answer, or grpo.mask_truncated_completions=false")
    if not steps or without != steps:
        return None
    reward = summary.get("reward_last")
    from rlstack.payload.recipes import WITH_REPETITION, rewards_override

    hint = (f"add the repetition reward (--set '{rewards_override(WITH_REPETITION)}'), "
            if "repetition" not in reward_names else "")
    return (f"no learning signal in any of {steps} steps: within every group the completions got equal rewards "
            f"(mean reward {reward}), so GRPO's advantages, loss and gradients were 0 and the adapter did not "
            f"change. Next: a model that can already score sometimes, more generations per prompt "
            f"(grpo.num_generations), or a denser reward: {hint}or a format reward the model can reach")
