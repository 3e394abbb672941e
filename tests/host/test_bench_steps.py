"""bench/transport/steps.py: steps run in turn, each with its own $OUT folder and log, a failed one does not stop
the rest, the record is on disk after every step, and a step past --stop-after is not started."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


def test_steps_run_in_turn_each_with_its_own_out_and_a_failure_does_not_stop_the_rest(
        tmp_path: Path, run_bench: Callable[..., subprocess.CompletedProcess]) -> None:
    write = ("import os, pathlib, sys; pathlib.Path(os.environ['OUT'], 'r.json').write_text(sys.argv[1]); "
             "print('wrote', sys.argv[1])")
    (tmp_path / "w.py").write_text(write)
    (tmp_path / "fail.py").write_text("import sys; print('no GPU here'); sys.exit(3)")
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    proc = run_bench("transport/steps", f"{tmp_path / 'w.py'} one", str(tmp_path / "fail.py"),
                     f"{tmp_path / 'w.py'} 'two words'", env=env)
    assert proc.returncode == 1, proc.stderr  # one step failed
    out = tmp_path / "out"
    records = json.loads((out / "steps.json").read_text())
    assert [(r["out"], r["rc"]) for r in records] == [("1-w", 0), ("2-fail", 3), ("3-w", 0)]
    assert (out / "1-w" / "r.json").read_text() == "one" and (out / "3-w" / "r.json").read_text() == "two words"
    assert "no GPU here" in (out / "2-fail.log").read_text()


def test_a_step_past_stop_after_is_not_started_and_counts_as_failed(
        tmp_path: Path, load_bench: Callable[[str], ModuleType]) -> None:
    steps = load_bench("transport/steps")
    (tmp_path / "slow.py").write_text("import time; time.sleep(0.3)")
    records = steps.run_steps([[str(tmp_path / "slow.py")], [str(tmp_path / "slow.py")]], tmp_path / "out",
                              stop_after=0.1)
    assert records[0]["rc"] == 0 and records[1]["rc"] is None and "--stop-after" in str(records[1]["note"])
    assert steps.step_name(["-m", "pytest", "-q"]) == "pytest"
    assert steps.step_name(["bench/fastgen_profile.py", "--batches", "8"]) == "fastgen_profile"


def test_an_empty_step_is_refused_saying_what_a_step_is(
        tmp_path: Path, run_bench: Callable[..., subprocess.CompletedProcess]) -> None:
    proc = run_bench("transport/steps", "bench/attention_sweep.py", "  ", env={**os.environ, "OUT": str(tmp_path)})
    assert proc.returncode == 2 and "each STEP is a script and its options" in proc.stderr
    assert not (tmp_path / "steps.json").exists()  # nothing ran
