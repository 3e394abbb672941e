"""The GPU stacks, proven through the real `rlstack` commands (issue 12): on a GPU host with a stack's locked wheels
installed natively (`invoke native-stage`, `bench/transport/native_probe.sh`), train the default recipe's shape on a
Qwen3-4B-shaped model saved locally, verify the adapter, evaluate it, and hand adapters between stacks. Nothing
here patches rlstack: every number comes from `python3 -m rlstack.cli ...` subprocesses and the files they write.

Device side (PYTHONPATH=/tmp/site-STACK:src), each step writes $OUT/gpu_stacks/<stack>-<step>.json:
    python3 bench/gpu_stacks.py model                               build the random Qwen3-4B-shaped model once
    python3 bench/gpu_stacks.py train --stack portable [--steps 10] rlstack train (the stack's default path)
    python3 bench/gpu_stacks.py eval --stack fp8 --adapter gpu-portable --backend vllm
  the hand-off on one base with an adapter that does something (a real model: the embedded one, its folder built
  by bench/transport/fastgen_fidelity_device.sh, RLSTACK_MODEL_CACHE pointing at it in both stacks):
    python3 bench/gpu_stacks.py train --stack portable --model embedded:smollm2-135m --name gpu-emb
    python3 bench/gpu_stacks.py eval --stack portable --adapter gpu-emb --backend hf --unquantized
    python3 bench/gpu_stacks.py eval --stack fp8 --adapter gpu-emb --backend vllm
A run longer than one device call (a cold fp8 train: ~600 s) goes through `bash bench/transport/native_probe.sh bg STACK
bench/gpu_stacks.py ...`, then `... wait STACK` calls back to back until it ends.
Host side:
    python bench/gpu_stacks.py summarize DIR...                     -> bench/results/gpu_stacks.json

Why a random model: no weights can be downloaded on the device machine; the shape fixes the cost of a step, not
its rewards. Accuracy on random weights is ~0 and says nothing about learning; it is recorded to show the path ran.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

MODEL_DIR = Path(os.environ.get("RLSTACK_GPU_MODEL", "/tmp/rlstack-qwen3-4b-random"))
ADAPTERS = Path("/tmp/rlstack-adapters")
RUNS = Path("/tmp/rlstack-runs")
EVALS = Path("/tmp/rlstack-evals")
RECIPE = "gsm8k-grpo"
# Evaluation questions: the same generated set in every stack, so the hand-off pairs question by question.
EVAL_DATA = "generated:64"
TRAIN_DATA = "generated:128"
# The stacks whose default training path is Unsloth's FP8 RL (load_in_fp8 + fast_inference).
FP8_STACKS = {"fp8", "fp8-report"}


def out_dir() -> Path:
    """Where each step's JSON goes ($OUT comes back from the device machine: at most 8 files a call)."""
    d = Path(os.environ.get("OUT", "/tmp/out")) / "gpu_stacks"
    d.mkdir(parents=True, exist_ok=True)
    return d


def log_dir() -> Path:
    """Full logs stay on the device machine (the JSON keeps their tails); pack them with tar when needed."""
    d = Path(os.environ.get("RLSTACK_GPU_LOGS", "/tmp/rlstack-gpu-logs"))
    d.mkdir(parents=True, exist_ok=True)
    return d


class GpuMemoryPoll:
    """Peak device memory of the whole GPU (nvidia-smi, every 0.5 s) while a command runs: vLLM's pools, the
    trainer and the CUDA context together, which torch's own counters do not see across processes."""

    def __init__(self) -> None:
        self.peak_mib = 0
        self.base_mib = self._read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read() -> int:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
            return int(out.split()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return 0

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.peak_mib = max(self.peak_mib, self._read())

    def __enter__(self) -> GpuMemoryPoll:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_cli(args: list[str], log: Path, timeout: int) -> dict[str, Any]:
    """One `python3 -m rlstack.cli ...` run: exit code, wall time, GPU memory peak, log tail."""
    cmd = [sys.executable, "-m", "rlstack.cli", *args]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with GpuMemoryPoll() as mem, log.open("w") as fh:
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = round(time.perf_counter() - t0, 2)
    text = log.read_text(errors="replace")
    print(text[-3000:], flush=True)
    return {"argv": ["rlstack", *args], "rc": rc, "wall_s": wall, "gpu_peak_gib": round(mem.peak_mib / 1024, 2),
            "gpu_base_gib": round(mem.base_mib / 1024, 2), "log_tail": text[-2500:]}


def environment(stack: str) -> dict[str, Any]:
    """The stack's lock hash and how this Python departs from the lock (the probes' own record)."""
    from rlstack.probes import environment as env
    from rlstack.stacks.locks import lock_hash, locked_packages
    from rlstack.stacks.model import load_stack

    st = load_stack(stack)
    captured = env.capture(st, locked_packages(st))
    return {"stack": stack, "lock_hash": lock_hash(st), "environment": captured.model_dump(mode="json")}


def cmd_model(_: argparse.Namespace) -> int:
    if (MODEL_DIR / "config.json").exists():
        print(f"model exists: {MODEL_DIR}")
        return 0
    from rlstack.payload import tokenizer_files

    t0 = time.perf_counter()
    common.build_model().save_pretrained(MODEL_DIR)
    tokenizer_files.save(common.build_tokenizer(), MODEL_DIR)
    print(f"model saved: {MODEL_DIR} in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_train(a: argparse.Namespace) -> int:
    name = a.name or f"gpu-{a.stack}"
    argv = ["train", "--recipe", RECIPE, "--model", a.model, "--data", TRAIN_DATA, "--max-steps",
            str(a.steps), "--adapter-name", name, "--adapters-root", str(ADAPTERS), "--output", str(RUNS / name),
            "--overwrite", "--set", "grpo.save_steps=1000"]
    for item in a.set or []:
        argv += ["--set", item]
    if a.stack in FP8_STACKS:
        argv.append("--fp8")
    tag = a.stack if name == f"gpu-{a.stack}" else f"{a.stack}-{name}"  # the default run keeps its file names
    run = run_cli(argv, log_dir() / f"{tag}-train.log", a.timeout)
    rows = [json.loads(line) for line in (RUNS / name / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (RUNS / name / "metrics.jsonl").exists() else []
    record: dict[str, Any] = {**common.header(), **environment(a.stack), "step": "train", "run": run,
                              "metrics": rows, "adapter": name, "model": a.model}
    verify = run_cli(["adapters", "--root", str(ADAPTERS), "--verify", "--json"],
                     log_dir() / f"{a.stack}-adapters.log", 120)
    record["verify"] = {"rc": verify["rc"]}
    manifest = ADAPTERS / name / "manifest.json"
    if manifest.exists():
        record["manifest"] = json.loads(manifest.read_text())
    weights = ADAPTERS / name / "adapter_model.safetensors"
    if weights.exists():
        from rlstack.core.fileio import sha256_file

        record["adapter_sha256"] = sha256_file(weights)
    (out_dir() / f"{tag}-train.json").write_text(json.dumps(record, indent=2, default=str))
    print(json.dumps({k: record.get(k) for k in ("adapter_sha256",)} | {"rc": run["rc"], "steps": len(rows)}))
    return run["rc"]


def cmd_eval(a: argparse.Namespace) -> int:
    tag = (f"{a.stack}-{a.adapter}-{a.backend}" + ("-fastgen" if a.fastgen else "")
           + ("-reference" if a.reference_kernels else "") + ("-unquantized" if a.unquantized else "")
           + (f"-n{a.n}" if a.n != 32 else "") + (f"-b{a.batch_size}" if a.batch_size else ""))
    out = EVALS / tag
    argv = ["eval", "--adapter", str(ADAPTERS / a.adapter), "--backend", a.backend, "-n", str(a.n), "--data",
            a.data, "--max-new-tokens", str(a.max_new_tokens), "--output", str(out), "--json"]
    if a.fastgen:
        argv.append("--fastgen")
    if a.reference_kernels:
        argv.append("--reference-kernels")
    if a.batch_size:
        argv += ["--batch-size", str(a.batch_size)]
    if a.unquantized:
        argv.append("--unquantized")
    run = run_cli(argv, log_dir() / f"{tag}-eval.log", a.timeout)
    record: dict[str, Any] = {**common.header(), **environment(a.stack), "step": "eval", "tag": tag,
                              "adapter": a.adapter, "backend": a.backend, "run": run}
    if (out / "results.json").exists():
        res = json.loads((out / "results.json").read_text())
        record["results"] = {k: v for k, v in res.items() if k != "per_question"}
    if (out / "results.json").exists():
        # whole, per-question outcomes included: `rlstack compare` pairs two engines' results on the host
        (out_dir() / f"{tag}-results.json").write_text((out / "results.json").read_text())
    if (out / "generations.jsonl").exists():
        # the raw generations travel back whole: the hand-off compares them text by text
        (out_dir() / f"{tag}-generations.jsonl").write_text((out / "generations.jsonl").read_text())
    (out_dir() / f"{tag}-eval.json").write_text(json.dumps(record, indent=2, default=str))
    return run["rc"]


# ---------------------------------------------------------------- host side


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def _per_s(count: Any, seconds: Any) -> float | None:
    return round(count / seconds, 3) if count and seconds else None


def with_masking(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's metrics rows, each saying whether its loss dropped truncated completions. Rows written before
    rlstack train recorded it (loss_masks_truncated) get it from the run: the recipe's masking, or, for a recipe
    from before the option, what Unsloth's GRPOConfig forced for loss_type dapo; then whether the loss that ran
    honours it (compat.truncation_mask_applies: unsloth_zoo 2026.6.1's does not, 2026.10.6's does)."""
    from rlstack.payload.train.compat import truncation_mask_applies

    man = rec.get("manifest") or {}
    grpo = (man.get("recipe") or {}).get("grpo") or {}
    loader = str((man.get("metrics") or {}).get("loader") or "")
    asked = grpo["mask_truncated_completions"] if "mask_truncated_completions" in grpo \
        else loader.startswith("unsloth") and grpo.get("loss_type") == "dapo"
    zoo = ((rec.get("environment") or {}).get("versions") or {}).get("unsloth-zoo")
    masks = truncation_mask_applies(bool(asked), loader, zoo)
    return [r if "loss_masks_truncated" in r else {**r, "loss_masks_truncated": masks}
            for r in rec.get("metrics") or []]


def train_row(rec: dict[str, Any]) -> dict[str, Any]:
    from rlstack.payload.train.metrics import masked_out, tied

    rows = with_masking(rec)
    times = [r["step_time_s"] for r in rows if r.get("step_time_s") is not None]
    rollout = [r["completion_tokens_per_s"] for r in rows[1:] if r.get("completion_tokens_per_s") is not None]
    env = rec.get("environment") or {}
    man = rec.get("manifest") or {}
    return {
        "stack": rec["stack"], "lock_hash": rec["lock_hash"][:12], "gpu": (rec.get("gpu") or {}).get("name"),
        "date": rec.get("date"), "loader": (man.get("metrics") or {}).get("loader"),
        "environment": env.get("deviations"), "train_rc": rec["run"]["rc"], "steps": len(rows),
        "first_step_s": times[0] if times else None,
        # the first step pays compilation / CUDA graph capture / vLLM warmup: the median is over the rest
        "s_per_step_median": _median(times[1:]) if len(times) > 1 else None,
        "rollout_tokens_per_s": _median(rollout),
        # where the step goes (rlstack train's phase split; runs before 2026-12-04 15:00 lack it): the rollout
        # (TRL's _generate, with vLLM's weight sync), rewards + log-prob passes, and loss + backward + optimizer
        **{f"{k}_median": _median([r[k] for r in rows[1:] if r.get(k) is not None])
           for k in ("generate_s", "score_s", "train_s")},
        "train_wall_s": rec["run"]["wall_s"], "peak_gib": rec["run"]["gpu_peak_gib"],
        "adapter_sha256": rec.get("adapter_sha256"),
        "adapter_verified": bool(rec.get("adapter_sha256")) and rec.get("verify", {}).get("rc") == 0,
        "reward_first": rows[0].get("reward") if rows else None,
        "reward_last": rows[-1].get("reward") if rows else None,
        # whether the run could learn at all: a step where every group's rewards are equal has zero advantages,
        # so its loss and gradients are exactly 0 (random weights score 0 on correctness and format); so has a
        # step whose completions were all truncated when the loss drops truncated ones
        "steps_with_signal": sum(1 for r in rows if tied(r) is not True and not masked_out(r)),
        "steps_masked_out": sum(1 for r in rows if masked_out(r)),
        "grad_norm_max": max((r["grad_norm"] for r in rows if r.get("grad_norm") is not None), default=None),
    }


def handoff(a: Path, b: Path) -> dict[str, Any]:
    """How many of two evaluations' generations are the same text, question by question."""
    def load(p: Path) -> dict[str, str]:
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        return {str(r.get("id", i)): r.get("completion", r.get("generation", "")) for i, r in enumerate(rows)}

    ga, gb = load(a), load(b)
    common_ids = sorted(set(ga) & set(gb))
    same = [i for i in common_ids if ga[i] == gb[i]]

    def prefix(x: str, y: str) -> int:
        n = 0
        for cx, cy in zip(x.split(), y.split(), strict=False):
            if cx != cy:
                break
            n += 1
        return n

    prefixes = [prefix(ga[i], gb[i]) for i in common_ids]
    return {"a": a.name, "b": b.name, "paired": len(common_ids), "identical": len(same),
            "median_common_prefix_words": _median([float(p) for p in prefixes]),
            "first_divergence_words": prefixes[:16]}


def compare(base: Path, other: Path) -> dict[str, Any]:
    """`rlstack compare` of two evaluations' results (the real command), paired question by question."""
    src = str(Path(__file__).resolve().parents[1] / "src")  # rlstack itself, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "rlstack.cli", "compare", str(base), str(other), "--json"],
                          capture_output=True, text=True, check=False, env=env)
    if proc.returncode == 0:
        out: dict[str, Any] = json.loads(proc.stdout)
        return out
    return {"rc": proc.returncode, "error": proc.stderr[-800:]}


def _when(stamp: str | None) -> _dt.datetime | None:
    """A record's ISO date as an aware datetime (records without a zone are UTC, as common.now() writes them)."""
    if not stamp:
        return None
    t = _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=_dt.UTC)


def results_only_evals(dirs: list[str], have: dict[str, str | None]) -> list[dict[str, Any]]:
    """Eval records rebuilt from `rlstack eval`'s own results.json (copied back as TAG-results.json) where the
    bench's TAG-eval.json never came back (the device call ended before the bench wrote it), or where the one
    that did is of an older run of the same tag (`have`: tag -> the results date its record holds): the accuracy
    and timings are rlstack's; what only the bench measures (exit code, wall, GPU peak) stays None."""
    out = []
    for d in dirs:
        for p in sorted(Path(d).rglob("*-results.json")):
            tag = p.name.removesuffix("-results.json")
            res = json.loads(p.read_text())
            recorded = _when(have.get(tag)) if tag in have else None
            if tag in have and (recorded is None or (_when(res.get("created")) or recorded) <= recorded):
                continue
            cfg = res.get("config") or {}
            out.append({"step": "eval", "tag": tag, "stack": tag.split("-", 1)[0], "date": res.get("created"),
                        "adapter": cfg.get("adapter_name"), "backend": cfg.get("backend"),
                        "run": {"rc": None, "wall_s": None, "gpu_peak_gib": None},
                        "results": {k: v for k, v in res.items() if k != "per_question"},
                        "source": f"{p.name} (rlstack eval's results; the bench record did not come back)"})
    return out


def row_eval(stack: str, train_date: str | None, evals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The evaluation of a stack's table run: its own adapter (gpu-STACK) on either backend, without --fastgen or
    --unquantized; the default size (n=32) first, else the largest, the newest of equals. An evaluation older
    than the train that wrote the adapter evaluated an earlier adapter of the same name, so it never counts for
    this row, nor does one without a date (it cannot be shown newer)."""
    started = _when(train_date)

    def fresh(e: dict[str, Any]) -> bool:
        done = _when(e.get("date"))
        return done is not None and (started is None or done >= started)

    own = [e for e in evals if fresh(e)
           and re.fullmatch(rf"{re.escape(stack)}-gpu-{re.escape(stack)}-(hf|vllm)(-n\d+)?", e.get("tag") or "")]
    own.sort(key=lambda e: (not re.search(r"-n\d+$", e["tag"]), (e.get("results") or {}).get("n") or 0,
                            _when(e.get("date"))))
    return own[-1] if own else None


def cmd_summarize(a: argparse.Namespace) -> int:
    """Merge the device steps' JSON into bench/results/gpu_stacks.json; --note says what a run's numbers
    cannot (a failure's wall, what was not run)."""
    records = []
    for d in a.dirs:
        for p in sorted(Path(d).rglob("*.json")):
            if p.name.endswith(("-train.json", "-eval.json")):
                records.append(json.loads(p.read_text()))
    records += results_only_evals(a.dirs, {r["tag"]: (r.get("results") or {}).get("created") for r in records
                                           if r.get("step") == "eval" and r.get("tag")})
    # the table: each stack's default run (the 4B shape, adapter gpu-STACK); other runs feed the hand-offs only
    trains = {r["stack"]: r for r in records
              if r.get("step") == "train" and r.get("adapter", f"gpu-{r['stack']}") == f"gpu-{r['stack']}"}
    evals = [r for r in records if r.get("step") == "eval"]
    table = [train_row(r) for r in trains.values()]
    for row in table:
        e = row_eval(row["stack"], trains[row["stack"]].get("date"), evals)
        if e is not None:
            res = e.get("results") or {}
            row["eval_backend"] = e["backend"]
            row["eval_rc"] = e["run"]["rc"]
            row["eval_accuracy"] = res.get("accuracy")
            row["eval_n"] = res.get("n")
    data: dict[str, Any] = {"date": common.now(), "gpu": next((r.get("gpu") for r in records if r.get("gpu")), {}),
                            "recipe": RECIPE, "model": "Qwen3-4B shape, random bf16 weights",
                            "train_data": TRAIN_DATA, "eval_data": EVAL_DATA, "evals": [
                                {k: e.get(k) for k in ("stack", "adapter", "backend", "tag", "date")}
                                | {"rc": e["run"]["rc"], "wall_s": e["run"]["wall_s"],
                                   "accuracy": (e.get("results") or {}).get("accuracy"),
                                   "format_rate": (e.get("results") or {}).get("format_reward_mean"),
                                   "gpu_peak_gib": e["run"]["gpu_peak_gib"],
                                   "load_s": ((e.get("results") or {}).get("timings") or {}).get("load_s"),
                                   "engine": ((e.get("results") or {}).get("config") or {}).get("engine"),
                                   "questions_per_s": _per_s((e.get("results") or {}).get("n"),
                                                             ((e.get("results") or {}).get("timings") or {})
                                                             .get("generate_s")),
                                   "new_tokens_per_s": ((e.get("results") or {}).get("timings") or {})
                                   .get("new_tokens_per_s")} for e in evals]}
    t = {r["stack"]: r for r in table}
    if t.get("fp8", {}).get("s_per_step_median") and t.get("portable", {}).get("s_per_step_median"):
        # portable's step time over fp8's: above 1, fp8 trains faster (Unsloth's claim is ~1.4x faster FP8 RL)
        data["fp8_step_speedup_vs_portable"] = round(
            t["portable"]["s_per_step_median"] / t["fp8"]["s_per_step_median"], 3)
    # issue 14's step target: the default path's step against the same stack's own generation (a run of the same
    # recipe with --set grpo.fast_generation=false: Unsloth's generate on portable): that run's median step time
    # over the table run's
    for r in records:
        if r.get("step") != "train" or "grpo.fast_generation=false" not in " ".join(r.get("argv") or []):
            continue
        own, default = train_row(r), t.get(r["stack"], {})
        if own.get("gpu") != default.get("gpu"):
            # a ratio across two cards measures the cards as much as the generation (the device lends an H200 or
            # an H100 from one lease to the next): said, not computed
            data.setdefault("fastgen_step_speedup_not_shown", {})[r["stack"]] = (
                f"own generation on {own.get('gpu')}, the default on {default.get('gpu')}: not one card")
            continue
        if own.get("s_per_step_median") and default.get("s_per_step_median"):
            data.setdefault("fastgen_step_speedup", {})[r["stack"]] = {
                "speedup": round(own["s_per_step_median"] / default["s_per_step_median"], 2),
                "own_generation": {k: own.get(k) for k in ("date", "steps", "s_per_step_median", "generate_s_median",
                                                           "train_s_median")},
                "default": {k: default.get(k) for k in ("date", "steps", "s_per_step_median", "generate_s_median",
                                                        "train_s_median")}}
    gens = {p.name.removesuffix("-generations.jsonl"): p for d in a.dirs for p in Path(d).rglob("*-generations.jsonl")}
    res = {p.name.removesuffix("-results.json"): p for d in a.dirs for p in Path(d).rglob("*-results.json")}
    hf, vl = gens.get("portable-gpu-portable-hf"), gens.get("fp8-gpu-portable-vllm")
    if hf and vl:
        data["handoff"] = handoff(hf, vl)
    rh, rv = res.get("portable-gpu-portable-hf"), res.get("fp8-gpu-portable-vllm")
    if rh and rv:
        data["handoff_compare"] = compare(rh, rv)
    # like for like: an adapter evaluated by portable on the unquantized base and by fp8's vLLM (bf16 + LoRARequest)
    suffix = "-hf-unquantized"
    for tag in sorted(t for t in gens if t.startswith("portable-") and t.endswith(suffix)):
        adapter = tag.removeprefix("portable-").removesuffix(suffix)
        other = f"fp8-{adapter}-vllm"
        if other in gens:
            pair = handoff(gens[tag], gens[other])
            if tag in res and other in res:
                pair["compare"] = compare(res[tag], res[other])
            data.setdefault("handoffs_unquantized", {})[adapter] = pair
    cols = ["stack", "lock_hash", "loader", "train_rc", "steps", "first_step_s", "s_per_step_median",
            "rollout_tokens_per_s", "generate_s_median", "score_s_median", "train_s_median", "steps_with_signal",
            "steps_masked_out",
            "grad_norm_max", "peak_gib", "adapter_verified", "eval_backend", "eval_accuracy", "environment"]
    notes = ("`bench/gpu_stacks.py train|eval` on the device machine, natively from each stack's lock "
             "(`invoke native-stage`; deviations from the lock in `environment`). rollout_tokens_per_s: completion "
             "tokens per second of whole GRPO step (rollout + loss), median over steps 2..N.")
    if data["evals"]:
        ecols = ["tag", "date", "rc", "engine", "accuracy", "load_s", "questions_per_s", "new_tokens_per_s",
                 "gpu_peak_gib"]
        notes += "\n\nEvaluations (`rlstack eval`, greedy, 256 new tokens):\n\n" + "\n".join(
            ["| " + " | ".join(ecols) + " |", "|" + "---|" * len(ecols)]
            + ["| " + " | ".join(str(e.get(c)) for c in ecols) + " |" for e in data["evals"]])
    if "fp8_step_speedup_vs_portable" in data:
        notes += (f"\n\nfp8_step_speedup_vs_portable: {data['fp8_step_speedup_vs_portable']} (portable's median step "
                  "time over fp8's; above 1 means fp8 is faster).")
    if "handoff" in data:
        h = data["handoff"]
        notes += (f"\n\nHand-off (the portable adapter, portable `--backend hf` vs fp8 `--backend vllm`): "
                  f"{h['identical']} of {h['paired']} generations identical, median common prefix "
                  f"{h['median_common_prefix_words']} words.")
    for stack, f in (data.get("fastgen_step_speedup") or {}).items():
        own, default = f["own_generation"], f["default"]
        notes += (f"\n\n{stack}'s GRPO step with fastgen (the default) against the stack's own generation "
                  f"(`--set grpo.fast_generation=false`): {f['speedup']}x ({default['s_per_step_median']} s against "
                  f"{own['s_per_step_median']} s median; generate {default['generate_s_median']} s against "
                  f"{own['generate_s_median']} s).")
    for stack, why in (data.get("fastgen_step_speedup_not_shown") or {}).items():
        notes += f"\n\n{stack}'s GRPO step against the stack's own generation: not shown ({why})."
    for adapter, h in (data.get("handoffs_unquantized") or {}).items():
        notes += (f"\n\nHand-off on one base ({adapter}: portable `--backend hf --unquantized` vs fp8 "
                  f"`--backend vllm`, both bf16 + the adapter): {h['identical']} of {h['paired']} generations "
                  f"identical, median common prefix {h['median_common_prefix_words']} words.")
    if a.note:
        notes += "\n\n" + "\n\n".join(a.note)
        data["notes"] = a.note
    common.write_results("gpu_stacks", data, table, cols, notes, question="learning",
                         title="rlstack train, then rlstack eval, per stack (Qwen3-4B shape, random weights)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("model")
    t = sub.add_parser("train")
    t.add_argument("--stack", required=True)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--model", default=str(MODEL_DIR),
                   help="base model: the 4B-shaped random one (default), or e.g. embedded:smollm2-135m (a real "
                        "model: its adapter learns, so a hand-off compares an adapter that does something)")
    t.add_argument("--name", help="adapter name (default gpu-STACK, the table's run)")
    t.add_argument("--set", action="append", help="extra recipe override KEY=VALUE (recorded in the argv)")
    t.add_argument("--timeout", type=int, default=1500, help="seconds; a cold fp8 run takes ~600 (bg mode)")
    e = sub.add_parser("eval")
    e.add_argument("--stack", required=True)
    e.add_argument("--adapter", required=True)
    e.add_argument("--backend", choices=["hf", "vllm"], required=True)
    e.add_argument("-n", type=int, default=32)
    e.add_argument("--data", default=EVAL_DATA, help="e.g. generated:300 for issue 14's eval throughput at n=300")
    e.add_argument("--fastgen", action="store_true", help="rlstack eval --fastgen (hf backend)")
    e.add_argument("--reference-kernels", action="store_true",
                   help="rlstack eval --fastgen --reference-kernels (transformers' kernels in a CUDA graph)")
    e.add_argument("--batch-size", type=int, default=0, help="rlstack eval --batch-size (0: the recipe's, 16)")
    e.add_argument("--unquantized", action="store_true",
                   help="rlstack eval --unquantized: the bf16 base vLLM's LoRARequest runs (hand-off like for like)")
    e.add_argument("--max-new-tokens", type=int, default=256)
    e.add_argument("--timeout", type=int, default=900)
    s = sub.add_parser("summarize")
    s.add_argument("dirs", nargs="+")
    s.add_argument("--note", action="append", help="a sentence for the results (repeatable)")
    a = ap.parse_args(argv)
    return {"model": cmd_model, "train": cmd_train, "eval": cmd_eval, "summarize": cmd_summarize}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
