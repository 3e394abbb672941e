"""Learning shown on a GPU (issue 40), one command per stack: evaluate the base model on held-out problems, GRPO-train
the recipe through `rlstack train`, evaluate the tuned adapter on the same problems, and pair the two the way
`rlstack compare` does (exact McNemar p, bootstrap interval), with the run's per-step reward and loss curve.

Each phase is the `rlstack` command itself in a subprocess (`python -m rlstack.cli eval|train`). Why: the stack's
default loader and rollout engine run exactly as a user meets them, and each phase gives its GPU memory back (an
Unsloth model, a vLLM engine inside it) before the next one starts. The results file is rewritten after every phase
and every training step, so a run that is killed keeps what it measured; SIGTERM and Ctrl-C also stop the phase's
process and mark the record.

    python bench/learning.py --stack-name portable --recipe smollm2-gpu [--engine fastgen|own] [--steps N]
    python bench/learning.py --stack-name fp8 --recipe smollm2-gpu --fp8                  Unsloth FP8 + vLLM rollouts
    python bench/learning.py --stack-name portable --adapter-from DIR --backend hf --unquantized    hand-off: one eval
    python bench/learning.py --stack-name fp8 --adapter-from DIR --backend vllm --unquantized --pair-with R.json
    python bench/learning.py --pair A/results.json B/results.json --stack-name portable     pair two evals, no model
    python bench/learning.py --close RECORD.json --why "cut off: the GPU lease ended"   a record a dead process left

Writes bench/results/learning-<stack>-<engine>-<date>.json (the one results schema, rlstack.core.results), the
reward curve beside it as .png, and the evaluations (results.json, generations.jsonl) under
bench/results/learning-<stack>-<engine>-<date>/; copies under $OUT when it is set (the device tool brings it back).
bench/learning_device.md has the GPU commands.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

# what a metrics.jsonl row (rlstack.payload.train.metrics) holds that the curve keeps, per step
CURVE_KEYS = (
    "step",
    "reward",
    "reward_std",
    "loss",
    "correctness_mean",
    "format_mean",
    "kl",
    "grad_norm",
    "frac_reward_zero_std",
    "completion_mean_length",
    "completion_clipped_ratio",
    "step_time_s",
    "generate_s",
    "train_s",
)
COLUMNS = [
    "stack",
    "path",
    "steps",
    "s_per_step",
    "n",
    "base_correct",
    "tuned_correct",
    "delta_points",
    "ci95",
    "p",
    "base_format",
    "tuned_format",
    "format_p",
]
PAIR_COLUMNS = [
    "stack",
    "a",
    "b",
    "n",
    "a_correct",
    "b_correct",
    "delta_points",
    "ci95",
    "p",
    "a_format",
    "b_format",
    "format_p",
    "identical_generations",
]
TAIL_LINES = 40
ROLLOUTS = {"fastgen": "fastgen rollouts", "own": "the loader's own generate", "vllm": "vLLM rollouts"}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def label(stack: str, engine: str, when: datetime) -> str:
    """learning-<stack>-<engine>-<date>: the file name of a run's record (date to the minute, UTC, so two runs of a
    day keep both)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{stack}-{engine}")
    return f"learning-{safe}-{when.strftime('%Y%m%d-%H%M')}"


def claim(out: Path, name: str, record_only: bool = False) -> str:
    """NAME, or NAME-2, NAME-3, ...: the first whose evaluation folder under OUT this process creates (with
    record_only, a record with no folder: the first whose NAME.json it creates). The image jobs start several runs of
    one stack and engine within a minute (the harder level beside another run), and one lease pairs several runs in
    a minute; without this they would share one folder or record, the later overwriting the earlier's."""
    out.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        candidate = name if i == 1 else f"{name}-{i}"
        try:
            if record_only:
                (out / f"{candidate}.json").open("x").close()  # Record.write replaces it whole
            else:
                (out / candidate).mkdir()
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


def curve(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step curve of a run's metrics rows: reward, loss and what explains them, nothing else."""
    return [{k: r[k] for k in CURVE_KEYS if k in r} for r in rows]


def median_step_s(rows: Sequence[dict[str, Any]]) -> float | None:
    """Median seconds a step after the first (the first compiles kernels and warms caches)."""
    times = [float(r["step_time_s"]) for r in rows[1:] if isinstance(r.get("step_time_s"), int | float)]
    return round(statistics.median(times), 3) if times else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def identical_generations(a: Path, b: Path, examples: int = 5) -> dict[str, Any]:
    """How many questions two evaluations (their generations.jsonl) answered with the very same text, by id; for
    the rest, where the texts part (characters in common from the start) and a few examples cut at that point,
    which is what tells a near-tie flipped by kernels from a different model."""
    ga = {str(r["id"]): str(r["generation"]) for r in read_jsonl(a)}
    gb = {str(r["id"]): str(r["generation"]) for r in read_jsonl(b)}
    common = [q for q in ga if q in gb]
    differ = [q for q in common if ga[q] != gb[q]]

    def prefix(x: str, y: str) -> int:
        return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))

    parts = {q: prefix(ga[q], gb[q]) for q in differ}
    return {
        "paired": len(common),
        "identical": len(common) - len(differ),
        "identical_ignoring_whitespace": sum(" ".join(ga[q].split()) == " ".join(gb[q].split()) for q in common),
        "differing": len(differ),
        "median_common_prefix_chars": statistics.median(parts.values()) if parts else None,
        "examples": [
            {
                "id": q,
                "common_prefix_chars": parts[q],
                "a": ga[q][max(0, parts[q] - 40) : parts[q] + 60],
                "b": gb[q][max(0, parts[q] - 40) : parts[q] + 60],
            }
            for q in differ[:examples]
        ],
    }


def pair(a: Path, b: Path, iters: int = 10_000) -> dict[str, Any]:
    """Two evaluations' results.json paired question by question (rlstack compare's function: a is 'base', b is
    'tuned'), and their identical generations when both generations.jsonl files are beside them."""
    from rlstack.payload.evaluate.compare import compare

    out = compare(a, b, iters=iters)
    ga, gb = (Path(p).with_name(_generations_name(Path(p))) for p in (a, b))
    out["identical_generations"] = identical_generations(ga, gb) if ga.is_file() and gb.is_file() else None
    return out


def _generations_name(results: Path) -> str:
    try:
        return str(json.loads(results.read_text()).get("generations") or "generations.jsonl")
    except (OSError, json.JSONDecodeError):
        return "generations.jsonl"


def eval_summary(results: dict[str, Any]) -> dict[str, Any]:
    """What the record keeps of one rlstack eval results.json: the scores, how it ran, every question's outcome
    (so two records pair without their folders)."""
    keep = (
        "n",
        "correct",
        "accuracy",
        "wilson_95",
        "format_ok",
        "format_rate",
        "timings",
        "stack",
        "lock_hash",
        "versions",
        "created",
        "per_question",
        "per_question_format",
    )
    return {**{k: results[k] for k in keep if k in results}, "config": results.get("config", {})}


def _ci(points: Sequence[float]) -> str:
    return f"[{points[0]:+.2f}, {points[1]:+.2f}]"


def learning_row(
    stack: str, path: str, steps: int | None, s_per_step: float | None, c: dict[str, Any]
) -> dict[str, Any]:
    """The table row the README's GPU section quotes: stack, path, steps, s/step, base -> tuned, p."""
    fmt = c.get("format") or {}
    return {
        "stack": stack,
        "path": path,
        "steps": steps,
        "s_per_step": s_per_step,
        "n": c["n"],
        "base_correct": c["base_correct"],
        "tuned_correct": c["tuned_correct"],
        "delta_points": round(c["delta_points"], 2),
        "ci95": _ci(c["bootstrap_95_points"]),
        "p": c["mcnemar_exact_p"],
        "base_format": fmt.get("base"),
        "tuned_format": fmt.get("tuned"),
        "format_p": fmt.get("mcnemar_exact_p"),
    }


def stopped_row(
    stack: str, loader: str | None, rollouts: str, why: str, steps: int, s_per_step: float | None, base: dict[str, Any]
) -> dict[str, Any]:
    """The row of a run whose training stopped: the base it measured, every other column empty (the status says
    why)."""
    return {
        **dict.fromkeys(COLUMNS),
        "stack": stack,
        "path": f"{loader or '?'}, {rollouts}: {why}, see status",
        "steps": steps,
        "s_per_step": s_per_step,
        "n": base.get("n"),
        "base_correct": base.get("correct"),
        "base_format": base.get("format_ok"),
    }


def pair_row(stack: str, a: str, b: str, c: dict[str, Any]) -> dict[str, Any]:
    fmt = c.get("format") or {}
    same = c.get("identical_generations") or {}
    return {
        "stack": stack,
        "a": a,
        "b": b,
        "n": c["n"],
        "a_correct": c["base_correct"],
        "b_correct": c["tuned_correct"],
        "delta_points": round(c["delta_points"], 2),
        "ci95": _ci(c["bootstrap_95_points"]),
        "p": c["mcnemar_exact_p"],
        "a_format": fmt.get("base"),
        "b_format": fmt.get("tuned"),
        "format_p": fmt.get("mcnemar_exact_p"),
        "identical_generations": (f"{same['identical']}/{same['paired']}" if same else None),
    }


def environment(stack: str, lock_hash: str | None, gpu: str | None) -> str:
    """'image <tag>' inside one of the project's images (the tag the image declares in RLSTACK_IMAGE; images built
    before it say 'rlstack/<stack> (lock <hash>)'), 'native' for a lock's wheels on a GPU host, 'host' for this
    machine's own Python."""
    if os.environ.get("RLSTACK_ROOT") == "/opt/rlstack":
        tag = os.environ.get("RLSTACK_IMAGE", "").strip()
        return f"image {tag}" if ":" in tag else f"image rlstack/{stack} (lock {(lock_hash or '?')[:12]})"
    return "native" if gpu else "host"


class Record:
    """The run's results file, rewritten whole (atomically) whenever something new is known."""

    def __init__(
        self, args: argparse.Namespace, name: str, out: Path, engine: str | None, title: str, columns: list[str]
    ) -> None:
        from rlstack.core import results
        from rlstack.payload import adapters

        self.name, self.out, self.title, self.columns = name, out, title, columns
        with stack_env(args.stack_name):
            self.lock_hash = adapters.resolve_lock_hash()
        self.where = results.Where.detect(environment="host")
        self.where.environment = environment(args.stack_name, self.lock_hash, self.where.gpu)
        self.ran = results.Ran(
            command=" ".join(["python3", "bench/learning.py", *args.argv]),
            bench="learning",
            stack=args.stack_name,
            lock_hash=self.lock_hash,
            engine=engine,
            options={
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in vars(args).items()
                if v not in (None, False, []) and k != "argv"
            },
        )
        self.date = now_iso()
        self.rows: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {"status": "started", "phases": {}}
        # once the base is measured: the row of a run that stops before its pair (says why), so that every
        # record the README's table reads has one
        self.stopped_rows: Callable[[str], list[dict[str, Any]]] | None = None

    def write(self) -> Path:
        from rlstack.core import results

        result = results.Result.model_validate(
            {
                "question": "learning",
                "title": self.title,
                "ran": self.ran,
                "where": self.where,
                "date": self.date,
                "columns": self.columns,
                "rows": self.rows,
                "headline": self.rows[0] if self.rows else None,
                "extra": json.loads(json.dumps(self.extra, default=str)),
            }
        )
        path = results.write(result, self.name, self.out)
        if os.environ.get("OUT") and Path(os.environ["OUT"]).resolve() != self.out.resolve():
            results.write(result, self.name, Path(os.environ["OUT"]))
        return path


class Phase:
    """One `rlstack` command as a subprocess: its output printed as it comes (the per-step lines of training
    among it), its last lines kept for the record, `on_line` called on each."""

    current: subprocess.Popen[str] | None = None

    @classmethod
    def run(
        cls, argv: list[str], env: dict[str, str], on_line: Callable[[str], None] | None = None
    ) -> tuple[int, list[str], float]:
        t0 = time.perf_counter()
        tail: list[str] = []
        print("$ rlstack " + " ".join(argv), flush=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlstack.cli", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            errors="replace",
        )
        cls.current = proc
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            print(line, flush=True)
            tail = [*tail[-(TAIL_LINES - 1) :], line[-400:]]
            if on_line is not None:
                on_line(line)
        rc = proc.wait()
        cls.current = None
        return rc, tail, round(time.perf_counter() - t0, 2)


def _stop_on_signal(record: Record) -> None:
    """SIGTERM (a device call's time limit) and Ctrl-C: stop the phase's process, say where the run stopped."""

    def handler(signum: int, frame: FrameType | None) -> None:
        proc = Phase.current
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        record.extra["status"] = f"killed ({signal.Signals(signum).name}) during {record.extra.get('phase')}"
        if record.stopped_rows is not None and not record.rows:
            record.rows = record.stopped_rows(record.extra["status"])
        record.write()
        print(
            f"learning: {record.extra['status']}; what was measured is in {record.out / record.name}.json", flush=True
        )
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def stack_env(stack: str) -> Iterator[dict[str, str]]:
    """RLSTACK_STACK=<stack> while inside, where it is unset and the stack has a lock in images/: a stack's locked
    wheels installed natively do not say which lock they are, and rlstack names the lock (in the record, the
    adapter's manifest, each evaluation) from that variable (rlstack.payload.adapters.resolve_lock_hash)."""
    extra = {} if "RLSTACK_STACK" in os.environ else {"RLSTACK_STACK": stack}
    if not (ROOT / "images" / stack / "requirements.lock").is_file():
        extra = {}
    os.environ.update(extra)
    try:
        yield extra
    finally:
        for key in extra:
            os.environ.pop(key, None)


def _phase_env(work: Path, stack: str) -> dict[str, str]:
    """The commands' environment: their runs and adapters under `work`, the stack's name, rlstack/src importable."""
    with stack_env(stack):
        env = dict(os.environ)
    env.update(RLSTACK_RUNS=str(work / "runs"), RLSTACK_ADAPTERS=str(work / "adapters"), PYTHONUNBUFFERED="1")
    src = str(ROOT / "src")
    if src not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), src) if p)
    return env


def _eval(record: Record, key: str, argv: list[str], folder: Path, env: dict[str, str]) -> dict[str, Any]:
    """One evaluation into `folder`; its summary goes into the record under `key`, the record is written."""
    from rlstack.core.errors import RlstackError

    record.extra["phase"] = key
    rc, tail, wall = Phase.run([*argv, "--output", str(folder)], env)
    record.extra["phases"][key] = {"rc": rc, "wall_s": wall, "folder": str(folder)}
    results_path = folder / "results.json"
    if rc != 0 or not results_path.is_file():
        record.extra["phases"][key]["log_tail"] = tail
        record.extra["status"] = f"failed in {key} (rc {rc})"
        record.write()
        raise RlstackError(
            f"learning: {key} failed (rc {rc}); its last lines are in the record",
            f"see {record.out / record.name}.json, phases.{key}.log_tail",
        )
    record.extra[key] = eval_summary(json.loads(results_path.read_text()))
    record.write()
    return record.extra[key]


def _quant_flags(load_in_4bit: bool, unquantized: bool) -> list[str]:
    """One explicit flag for both evaluations, so base and tuned load the base model the same way whatever the
    adapter's manifest or the recipe file say."""
    return ["--load-in-4bit"] if load_in_4bit and not unquantized else ["--unquantized"]


def train_and_pair(args: argparse.Namespace) -> int:
    from rlstack.payload import recipes

    engine = "vllm" if args.fp8 else args.engine
    when = datetime.now(UTC)
    name = claim(args.out, label(args.stack_name, engine, when))
    work = (args.work or Path("/tmp/rlstack-learning")) / name
    evals = args.out / name
    overrides = [*args.set, f"grpo.fast_generation={'false' if args.engine == 'own' else 'true'}"]
    recipe = recipes.load(args.recipe, [*overrides, *([f"grpo.max_steps={args.steps}"] if args.steps else [])])
    unquantized = args.unquantized
    notes = []
    if args.fp8 and not unquantized:
        # FP8 training's base is the checkpoint in FP8; the nearest base an evaluation of both sides can load is
        # the checkpoint itself (bf16): the recipe's 4-bit would be another model, and the base evaluation has no
        # flag for vLLM's FP8 (only an adapter's manifest turns it on, for the tuned side alone)
        unquantized = True
        notes.append("--fp8: both evaluations --unquantized (the bf16 base), so they pair on one base")
    quant = _quant_flags(recipe.model.load_in_4bit, unquantized)
    n = args.eval_n or recipe.eval.n
    tokens = args.max_new_tokens or recipe.eval.max_new_tokens
    common = [
        "-n",
        str(n),
        "--data",
        recipe.eval.data,
        "--split",
        recipe.eval.split,
        "--max-new-tokens",
        str(tokens),
        "--batch-size",
        str(args.eval_batch_size or recipe.eval.batch_size),
        "--backend",
        args.backend or recipe.eval.backend,
        "--seed",
        str(recipe.eval.seed),
        *quant,
    ]
    rollouts = ROLLOUTS[engine]
    four_bit = recipe.model.load_in_4bit and not args.fp8  # the FP8 path does not use the recipe's 4-bit base
    path = f"{'--fp8' if args.fp8 else 'default loader'}{', 4-bit' if four_bit else ''}, {rollouts}"
    record = Record(
        args,
        name,
        args.out,
        engine,
        f"{recipe.name}: base vs tuned on {n} held-out "
        f"{recipe.eval.data.partition(':')[0]} problems, {args.stack_name}, {path}",
        list(COLUMNS),
    )
    record.extra.update(recipe=recipe.model_dump(mode="json"), notes=notes, work=str(work))
    record.write()
    _stop_on_signal(record)
    env = _phase_env(work, args.stack_name)
    print(
        f"learning: {name}: {recipe.name}, {recipe.grpo.max_steps} steps, eval {n} x {tokens} tokens; "
        f"record {args.out / name}.json",
        flush=True,
    )

    _eval(
        record,
        "base",
        ["eval", "--model", recipe.model.name, "--recipe", str(args.recipe), *common],
        evals / "base",
        env,
    )

    run_dir, adapters_root = work / "runs" / "train" / "tuned", work / "adapters"
    metrics_path = run_dir / "metrics.jsonl"
    said: dict[str, str] = {}

    def stopped_rows(why: str) -> list[dict[str, Any]]:
        from rlstack.payload.train.metrics import read_rows

        done = read_rows(metrics_path)
        return [
            stopped_row(
                args.stack_name,
                said.get("loader"),
                rollouts,
                why,
                len(done),
                median_step_s(done),
                record.extra["base"],
            )
        ]

    record.stopped_rows = stopped_rows

    def on_train_line(line: str) -> None:
        if m := re.search(r"rlstack train: \S+: \S+ via (\S+) on (\S+),", line):
            said["loader"], said["device"] = m[1], m[2]
        if "rollouts through rlstack.payload.fastgen" in line:
            said["rollouts"] = "fastgen"
        elif "fastgen is off" in line:
            said["rollouts"] = "not fastgen: " + line.split("fastgen is off: ", 1)[-1][:160]
        if "rlstack fastgen: falling back" in line:
            said["fastgen_fell_back"] = line[:300]
        if line.startswith("rlstack train: step "):
            from rlstack.payload.train.metrics import read_rows

            rows = read_rows(metrics_path)
            record.extra["curve"] = curve(rows)
            record.extra["train"] = {**said, "steps_done": len(rows), "s_per_step": median_step_s(rows)}
            record.write()

    record.extra["phase"] = "train"
    train_argv = [
        "train",
        "--recipe",
        str(args.recipe),
        *[x for o in overrides for x in ("--set", o)],
        "--adapter-name",
        "tuned",
        "--output",
        str(run_dir),
        "--adapters-root",
        str(adapters_root),
        "--overwrite",
        *(["--max-steps", str(args.steps)] if args.steps else []),
        *(["--fp8"] if args.fp8 else []),
    ]
    rc, tail, wall = Phase.run(train_argv, env, on_train_line)
    from rlstack.payload.train.metrics import read_rows

    rows = read_rows(metrics_path)
    manifest_path = adapters_root / "tuned" / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    record.extra["curve"] = curve(rows)
    record.extra["train"] = {
        **said,
        "rc": rc,
        "wall_s": wall,
        "steps_done": len(rows),
        "s_per_step": median_step_s(rows),
        "adapter": str(adapters_root / "tuned"),
        "loader": (manifest.get("metrics") or {}).get("loader", said.get("loader")),
        "summary": manifest.get("metrics"),
    }
    record.extra["phases"]["train"] = {"rc": rc, "wall_s": wall}
    if rc != 0 or not manifest:
        record.extra["train"]["log_tail"] = tail
        record.extra["status"] = f"failed in train (rc {rc})"
        record.rows = stopped_rows("training failed")
        record.write()
        print(f"learning: training failed (rc {rc}); the record keeps its last lines: {args.out / name}.json")
        return rc or 1
    record.extra["png"] = _png(
        metrics_path, args.out / f"{name}.png", list(recipe.rewards), f"{recipe.name}: {args.stack_name}, {path}"
    )
    record.write()

    _eval(record, "tuned", ["eval", "--adapter", str(adapters_root / "tuned"), *common], evals / "tuned", env)
    record.extra["phase"] = "pair"
    c = pair(evals / "base" / "results.json", evals / "tuned" / "results.json")
    record.extra["compare"] = {k: v for k, v in c.items() if k != "identical_generations"}
    ran = rollouts_ran(engine, said)
    record.rows = [
        learning_row(
            args.stack_name, f"{record.extra['train']['loader'] or '?'}, {ran}", len(rows), median_step_s(rows), c
        )
    ]
    record.extra["status"] = "done"
    _copy_to_out(evals, args.out / f"{name}.png")
    out = record.write()
    from rlstack.payload.evaluate.compare import summary

    print(f"learning: {summary(c, lead=f'After {len(rows)} GRPO steps, on')}\nlearning: record {out}", flush=True)
    return 0


def rollouts_ran(engine: str, said: dict[str, str]) -> str:
    """The rollout engine as `rlstack train` said it ran, for the row: fastgen asked for but off (no CUDA device)
    or fallen back mid-run is not a fastgen row."""
    if engine == "fastgen" and said.get("rollouts") != "fastgen":
        return said.get("rollouts") or "fastgen asked for; rlstack train did not say it ran"
    return ROLLOUTS[engine] + (" (fell back to generate mid-run)" if said.get("fastgen_fell_back") else "")


def _png(metrics_path: Path, png: Path, rewards: list[str], title: str) -> dict[str, Any]:
    """The reward curve through the run's own plotter (rlstack.payload.train.metrics), or why there is none."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return {"path": None, "why": "matplotlib is not installed in this Python: the curve is in extra.curve"}
    from rlstack.payload.train.metrics import plot_rewards

    got = plot_rewards(metrics_path, png, rewards, title)
    return {"path": str(got) if got else None, "why": None if got else "no metrics rows"}


def _copy_to_out(evals: Path, png: Path | None = None) -> None:
    """The evaluations' folder and the PNG under $OUT too (the record itself is written there by Record)."""
    if not os.environ.get("OUT"):
        return
    out = Path(os.environ["OUT"])
    if out.resolve() == evals.parent.resolve():
        return
    if evals.is_dir():
        shutil.copytree(evals, out / evals.name, dirs_exist_ok=True)
    if png is not None and png.is_file():
        shutil.copy2(png, out / png.name)


def handoff(args: argparse.Namespace) -> int:
    """An adapter trained elsewhere, evaluated here (--backend), and paired with --pair-with's evaluation."""
    from rlstack.core.errors import RlstackError

    adapter = Path(args.adapter_from)
    if not (adapter / "manifest.json").is_file():
        raise RlstackError(
            f"--adapter-from {adapter}: no manifest.json there (not an adapter folder)",
            "pass the folder rlstack train wrote, e.g. /tmp/rlstack-learning/<run>/adapters/tuned",
        )
    if args.pair_with and not Path(args.pair_with).is_file():
        raise RlstackError(
            f"--pair-with {args.pair_with}: no such results.json",
            "pass the other stack's hand-off evaluation: <out>/learning-<stack>-handoff-*/eval/results.json",
        )
    when = datetime.now(UTC)
    name = claim(args.out, label(args.stack_name, f"handoff-{args.backend or 'hf'}", when))
    evals = args.out / name
    record = Record(
        args,
        name,
        args.out,
        args.backend or "hf",
        f"hand-off: adapter {adapter.name} evaluated in {args.stack_name} ({args.backend or 'hf'})",
        list(PAIR_COLUMNS),
    )
    record.write()
    _stop_on_signal(record)
    manifest = json.loads((adapter / "manifest.json").read_text())
    ev = (manifest.get("recipe") or {}).get("eval") or {}
    model = (manifest.get("recipe") or {}).get("model") or {}
    # the problems the adapter's own recipe evaluates on, named here so that both sides of the pair ask for them
    problems = [x for k in ("data", "split") if ev.get(k) for x in (f"--{k}", str(ev[k]))]
    argv = [
        "eval",
        "--adapter",
        str(adapter),
        *problems,
        "-n",
        str(args.eval_n or ev.get("n", 256)),
        "--max-new-tokens",
        str(args.max_new_tokens or ev.get("max_new_tokens", 128)),
        "--backend",
        args.backend or "hf",
        *(["--batch-size", str(args.eval_batch_size)] if args.eval_batch_size else []),
        *_quant_flags(bool(model.get("load_in_4bit")), args.unquantized),
    ]
    _eval(
        record,
        "eval",
        argv,
        evals / "eval",
        _phase_env((args.work or Path("/tmp/rlstack-learning")) / name, args.stack_name),
    )
    if args.pair_with:
        c = pair(Path(args.pair_with), evals / "eval" / "results.json")
        record.extra["compare"] = c
        a = f"{(json.loads(Path(args.pair_with).read_text()).get('config') or {}).get('engine', '?')}"
        b = str(record.extra["eval"]["config"].get("engine", "?"))
        record.rows = [pair_row(args.stack_name, a, b, c)]
    else:  # the pair's first half: its one side, paired by the other stack's run (--pair-with this results.json)
        got = record.extra["eval"]
        record.columns = ["stack", "a", "n", "a_correct", "a_format"]
        record.rows = [{"stack": args.stack_name, "a": str(got["config"].get("engine", "?")), "n": got.get("n"),
                        "a_correct": got.get("correct"), "a_format": got.get("format_ok")}]
    record.extra["status"] = "done"
    _copy_to_out(evals)
    print(f"learning: record {record.write()}", flush=True)
    return 0


def run_curves(*evals: Path) -> dict[str, list[dict[str, Any]]]:
    """The reward curves of the runs whose evaluations these are (a run's evaluation folder sits in
    learning-<...>/<base|tuned>/, its record beside as learning-<...>.json), by run; {} where any is missing."""
    out: dict[str, list[dict[str, Any]]] = {}
    for results_json in evals:
        record = results_json.parent.parent.with_suffix(".json")
        try:
            got = (json.loads(record.read_text()).get("extra") or {}).get("curve")
        except (OSError, json.JSONDecodeError):
            return {}
        if not got:
            return {}
        out[record.stem] = got
    return out


def overlay_png(curves: dict[str, list[dict[str, Any]]], png: Path, title: str) -> dict[str, Any]:
    """Several runs' total reward per step on one plot (the fastgen vs own-generation pair), or why not."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return {"path": None, "why": "matplotlib is not installed in this Python: the curves are in extra.curves"}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run, rows in curves.items():
        steps = [r for r in rows if isinstance(r.get("reward"), int | float)]
        ax.plot([r["step"] for r in steps], [float(r["reward"]) for r in steps], marker="o", markersize=2, label=run)
    ax.set_xlabel("step")
    ax.set_ylabel("total reward")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return {"path": str(png), "why": None}


def pair_files(args: argparse.Namespace) -> int:
    """Two evaluations already on disk, paired (no model, no GPU): the fastgen vs own-generation pair of two runs'
    tuned evaluations, or a hand-off pair brought back from two stacks."""
    a, b = (Path(p) for p in args.pair)
    name = claim(args.out, label(args.stack_name, "pair", datetime.now(UTC)), record_only=True)
    record = Record(args, name, args.out, None, f"paired: {a.parent.name} vs {b.parent.name}", list(PAIR_COLUMNS))
    c = pair(a, b)
    engines = [str((json.loads(p.read_text()).get("config") or {}).get("engine", p.parent.name)) for p in (a, b)]
    record.rows = [pair_row(args.stack_name, f"{engines[0]} ({a})", f"{engines[1]} ({b})", c)]
    record.extra.update(compare=c, status="done")
    curves = run_curves(a, b)
    if curves:
        record.extra["curves"] = curves
        record.extra["png"] = overlay_png(curves, args.out / f"{name}.png", f"reward per step: {args.stack_name}")
    print(
        f"learning: {c['base_correct']} vs {c['tuned_correct']} of {c['n']}, p = {c['mcnemar_exact_p']:.4g}; "
        f"identical generations: {pair_row('', '', '', c)['identical_generations']}\n"
        f"learning: record {record.write()}",
        flush=True,
    )
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--stack-name",
        default=os.environ.get("RLSTACK_STACK", "native"),
        help="the stack's name in the record and the file name (default: $RLSTACK_STACK)",
    )
    ap.add_argument("--recipe", default="smollm2-gpu", help="recipe name or file (default smollm2-gpu)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override for training, as rlstack train --set (repeatable); the evaluations "
        "take the data, split, n, tokens and batch size it resolves to",
    )
    ap.add_argument("--steps", type=int, help="GRPO steps (default: the recipe's grpo.max_steps)")
    ap.add_argument("--eval-n", type=int, help="held-out problems per evaluation (default: the recipe's eval.n)")
    ap.add_argument("--max-new-tokens", type=int, help="evaluation tokens (default: the recipe's)")
    ap.add_argument("--eval-batch-size", type=int, help="evaluation batch size, hf backend (default: the recipe's)")
    ap.add_argument(
        "--engine",
        choices=["fastgen", "own"],
        default="fastgen",
        help="rollouts: fastgen, or the loader's own generate (grpo.fast_generation=false)",
    )
    ap.add_argument("--fp8", action="store_true", help="Unsloth's FP8 RL path with vLLM rollouts (rlstack train --fp8)")
    ap.add_argument("--backend", choices=["hf", "vllm"], help="evaluation backend (default: the recipe's)")
    ap.add_argument(
        "--unquantized",
        action="store_true",
        help="evaluate on the base as its checkpoint stores it (rlstack eval --unquantized), both sides",
    )
    ap.add_argument(
        "--adapter-from",
        type=Path,
        metavar="DIR",
        help="hand-off: evaluate this adapter folder here instead of training",
    )
    ap.add_argument(
        "--pair-with",
        type=Path,
        metavar="RESULTS_JSON",
        help="with --adapter-from: pair its evaluation with this one (another stack's, same problems)",
    )
    ap.add_argument(
        "--pair",
        nargs=2,
        type=Path,
        metavar=("A_RESULTS_JSON", "B_RESULTS_JSON"),
        help="pair two evaluations on disk (no model): accuracy, format, identical generations",
    )
    ap.add_argument(
        "--close",
        type=Path,
        metavar="RECORD_JSON",
        help="give a record a dead process left at \"started\" its row (no model): what it measured, --why as status",
    )
    ap.add_argument("--why", default="cut off", help="with --close: why the run stopped (default: cut off)")
    ap.add_argument("--work", type=Path, help="runs and adapters (default /tmp/rlstack-learning/<record name>)")
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results",
        help="where the record, PNG and evaluations go (default bench/results)",
    )
    return ap


def close_record(path: Path, why: str) -> int:
    """A run's record left at "started" because its process died without its signal handler (the machine went
    back, SIGKILL): the row it would have written then, from what the record holds (the base evaluation, the steps
    of the curve), and WHY as its status. A record that has rows is left as it is."""
    from rlstack.core import results
    from rlstack.core.errors import RlstackError

    got = results.read(path)
    if got.rows:
        raise RlstackError(f"{path}: the record has its rows already (status {got.extra.get('status')!r})",
                           "close only a record a dead process left at \"started\"")
    base = got.extra.get("base")
    if not isinstance(base, dict):
        raise RlstackError(f"{path}: the run stopped before its base evaluation: there is no row to make",
                           "keep the record as it is, or delete it")
    train = got.extra.get("train") or {}
    rollouts = ROLLOUTS.get(got.ran.engine or "", got.ran.engine or "?")
    status = f"{why} during {got.extra.get('phase')}"
    got.extra["status"] = status
    got.rows = [stopped_row(got.ran.stack or "?", train.get("loader"), rollouts, status,
                            int(train.get("steps_done") or 0), train.get("s_per_step"), base)]
    got.headline = got.rows[0]
    results.write(got, path.stem, path.parent)
    print(f"learning: {path}: {status}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from rlstack.core.errors import RlstackError

    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if args.close:
            return close_record(args.close, args.why)
        if args.pair:
            return pair_files(args)
        if args.adapter_from:
            return handoff(args)
        if args.pair_with:
            raise RlstackError("--pair-with pairs a hand-off evaluation", "add --adapter-from DIR, or use --pair A B")
        return train_and_pair(args)
    except RlstackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
