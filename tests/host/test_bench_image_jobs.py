"""The GPU jobs that run from the images' trees (bench/transport/jobs), run here with a stand-in for the image run:
which commands they start, in what order, with which options (LEARN_STEPS, STEPS=learn), and the hand-off's
dependence on an adapter. The stand-in logs each call and writes the files the next step looks for."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "bench" / "transport" / "jobs"

# $RUN and run_in: log the call, take a second for the own-generation run, leave an adapter after the fastgen run
# (unless NO_ADAPTER) and an hf evaluation after the hand-off's first half
FAKE = r"""#!/usr/bin/env bash
echo "$*" >> "$O/calls"
RUNS=$STASH/vol/rlstack-runs
case "$*" in
  *"--engine own"*) sleep 1 ;;
  *"--engine fastgen"*) [ -n "${NO_ADAPTER:-}" ] || { mkdir -p "$RUNS/learning-portable-fastgen/r/adapters/tuned" \
      && echo '{}' > "$RUNS/learning-portable-fastgen/r/adapters/tuned/manifest.json"; } ;;
  *"--backend hf"*) mkdir -p "$RUNS/learning-out/learning-portable-handoff-hf-1/eval" \
      && echo '{}' > "$RUNS/learning-out/learning-portable-handoff-hf-1/eval/results.json" ;;
esac
"""


def run_job(tmp_path: Path, job: str, **env: str) -> tuple[list[str], list[str]]:
    """(the stand-in's calls, the job's timeline steps) of bench/transport/jobs/<job>.sh."""
    bin_dir, out, stash = tmp_path / "bin", tmp_path / "out", tmp_path / "stash"
    for d in (bin_dir, out, stash / "vol" / "rlstack-runs"):
        d.mkdir(parents=True, exist_ok=True)
    if not env.pop("NO_FP8", ""):
        (stash / "spec-fp8.json").write_text("{}")  # the fp8 image, assembled
    for name in ("fake_run", "run_in"):
        (bin_dir / name).write_text(FAKE)
        (bin_dir / name).chmod(0o755)
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RUN": "fake_run", "O": str(out),
               "STASH": str(stash), "STAGGER": "0", **env}
    proc = subprocess.run(["bash", str(JOBS / f"{job}.sh")], env=environ, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    calls = (out / "calls").read_text().splitlines() if (out / "calls").exists() else []
    steps = [line.split(" ", 1)[1] for line in (out / "timeline").read_text().splitlines()]
    return calls, steps


@pytest.mark.parametrize("job", ["fp8_image", "portable_image"])
def test_learn_steps_reach_every_learning_run_and_steps_learn_leaves_the_probes_out(tmp_path: Path, job: str) -> None:
    calls, _ = run_job(tmp_path, job, LEARN_STEPS="7", STEPS="learn")
    training = [c for c in calls if "bench/learning.py" in c and "--adapter-from" not in c]
    assert training and all("--steps 7" in c for c in training)
    assert not any(" probe " in f" {c} " for c in calls)
    calls, _ = run_job(tmp_path / "again", job)
    assert not any("--steps" in c for c in calls)  # the recipe's steps
    assert any(" probe " in f" {c} " for c in calls)


def test_the_hand_off_starts_when_the_fastgen_run_ends_not_the_own_run(tmp_path: Path) -> None:
    calls, steps = run_job(tmp_path, "portable_image", STEPS="learn")
    assert steps.index("handoff-fp8 rc 0") < steps.index("learning-portable-own rc 0") < steps.index("end-portable")
    hf, vllm = (next(c for c in calls if f"--backend {b}" in c) for b in ("hf", "vllm"))
    assert "--adapter-from /opt/rlstack/runs/learning-portable-fastgen/r/adapters/tuned" in hf
    assert "--pair-with /opt/rlstack/runs/learning-out/learning-portable-handoff-hf-1/eval/results.json" in vllm


def test_no_adapter_skips_the_hand_off_and_still_waits_for_the_own_run(tmp_path: Path) -> None:
    calls, steps = run_job(tmp_path, "portable_image", STEPS="learn", NO_ADAPTER="1")
    assert "handoff skipped: the fastgen run left no adapter" in steps
    assert "learning-portable-own rc 0" in steps  # waited: the own run's step is logged before the job ends
    assert not any("--adapter-from" in c for c in calls)


def test_harder_runs_the_fastgen_path_at_the_two_step_level_once_the_fastgen_run_ends(tmp_path: Path) -> None:
    calls, steps = run_job(tmp_path, "portable_image", STEPS="learn", HARDER="1", LEARN_STEPS="5")
    first, harder = (next(i for i, c in enumerate(calls) if k in c) for k in ("--engine fastgen", "generated-two-step"))
    assert first < harder < next(i for i, c in enumerate(calls) if "--adapter-from" in c)
    assert steps.index("learning-portable-fastgen rc 0") < steps.index("learning-portable-fastgen-two-step rc 0")
    harder = [c for c in calls if "generated-two-step" in c]
    assert len(harder) == 1 and "--engine fastgen" in harder[0] and "--steps 5" in harder[0]
    assert "--set data.train=generated-two-step:4000 --set eval.data=generated-two-step:256" in harder[0]
    assert "kernel-cache-fastgen-two-step" in harder[0] and "learning-portable-fastgen-two-step" in harder[0]
    calls, steps = run_job(tmp_path / "plain", "portable_image", STEPS="learn")
    assert not any("two-step" in c for c in calls) and "end-portable" in steps


def test_harder_runs_even_when_the_fastgen_run_left_no_adapter(tmp_path: Path) -> None:
    calls, steps = run_job(tmp_path, "portable_image", STEPS="learn", HARDER="1", NO_ADAPTER="1")
    assert not any("--adapter-from" in c for c in calls)
    assert "handoff skipped: the fastgen run left no adapter" in steps
    assert "learning-portable-fastgen-two-step rc 0" in steps


def test_seed4bit_runs_the_4bit_fastgen_path_with_that_seed_beside_the_harder_run(tmp_path: Path) -> None:
    calls, steps = run_job(tmp_path, "portable_image", STEPS="learn", HARDER="1", SEED4BIT="3")
    [run] = [c for c in calls if "model.load_in_4bit=true" in c]
    assert "--engine fastgen" in run and "--set grpo.seed=3" in run and "kernel-cache-fastgen-4bit-seed3" in run
    assert calls.index(run) < next(i for i, c in enumerate(calls) if "--adapter-from" in c)
    assert "learning-portable-fastgen-4bit-seed3 rc 0" in steps and steps[-1] == "end-portable"
    calls, _ = run_job(tmp_path / "without", "portable_image", STEPS="learn", HARDER="1")
    assert not any("load_in_4bit" in c for c in calls)


def test_the_hand_off_waits_for_the_fp8_image_and_skips_only_its_half_without_it(tmp_path: Path) -> None:
    calls, steps = run_job(tmp_path, "portable_image", STEPS="learn", NO_FP8="1", FP8_WAIT="0")
    assert "handoff-portable rc 0" in steps and "handoff-fp8 skipped: the fp8 image was not assembled" in steps
    assert not any("--backend vllm" in c for c in calls) and steps[-1] == "end-portable"


def test_seeds_run_both_engines_at_each_seed_and_the_job_waits_for_them(tmp_path: Path) -> None:
    calls, steps = run_job(tmp_path, "portable_image", STEPS="learn", SEEDS="1 2", LEARN_STEPS="5")
    seeded = [c for c in calls if "grpo.seed=" in c]
    assert len(seeded) == 4 and all("--steps 5" in c and "load_in_4bit" not in c for c in seeded)
    for seed in (1, 2):
        for engine in ("own", "fastgen"):
            [run] = [c for c in seeded if f"--set grpo.seed={seed}" in c and f"--engine {engine} " in c]
            assert f"kernel-cache-{engine}-seed{seed}" in run and f"learning-portable-{engine}-seed{seed} " in run
            assert f"learning-portable-{engine}-seed{seed} rc 0" in steps
    assert steps[-1] == "end-portable"  # waited for: each seeded run's step is logged before the job ends
    calls, _ = run_job(tmp_path / "without", "portable_image", STEPS="learn")
    assert not any("grpo.seed" in c for c in calls)
