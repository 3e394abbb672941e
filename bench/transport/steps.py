"""Several bench runs one after another in one detached job, for a device lease (docs/archive/notes.md's device plans).

Why: a lease is 30 minutes, and each background job (`native_probe.sh bg`) ends with the GPU idle until the next
call notices it ended and starts the next one; each start also costs a call. Here one job runs the steps back to
back, each in its own process, and keeps going when one fails (a failed step is a result too: its log says why).

Each STEP is the arguments of one `python3` command, quoted: a bench script and its options, or `-m pytest ...`.
Step N's output goes to $OUT/N-<name>.log and the results it writes to $OUT go to $OUT/N-<name>/ (each bench
writes $OUT/<bench>.json: two profiles in one job would otherwise overwrite each other). $OUT/steps.json lists
every step with its exit code and seconds, rewritten after each step, so `native_probe.sh wait` brings back what
finished even when the job is cut short.

    python3 bench/transport/steps.py [--stop-after S] STEP [STEP ...]
        e.g. "bench/attention_sweep.py" "bench/fastgen_profile.py --variant '' --variant prefill_once=false"
             "-m pytest -q -m gpu tests/payload/gpu/test_fastgen_gpu.py"
        --stop-after S: start no step after S seconds from the job's start (the lease's end)
    bash bench/transport/fastgen_fidelity_device.sh steps-bg STEP ...      on the device, on the fidelity libraries

Exit code: the number of steps that failed or were not started (0: all passed).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common
import common


def step_name(args: list[str]) -> str:
    """A file-safe name for a step: its script's stem (`fastgen_profile`), or the module's (`pytest`)."""
    head = args[1] if args[0] == "-m" and len(args) > 1 else args[0]
    return common.file_safe(Path(head).stem) or "step"


def run_steps(steps: list[list[str]], out: Path, stop_after: float | None = None) -> list[dict[str, object]]:
    """Run each step (python3 arguments) in turn with $OUT set to its own folder under ``out``; return (and keep
    writing to out/steps.json) one record a step."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    records: list[dict[str, object]] = []
    for i, args in enumerate(steps, 1):
        name = f"{i}-{step_name(args)}"
        record: dict[str, object] = {"step": i, "command": shlex.join(["python3", *args]), "out": name}
        if stop_after is not None and time.monotonic() - t0 > stop_after:
            record.update(rc=None, note=f"not started: past --stop-after {stop_after:g} s")
        else:
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            print(f"step {i}: {record['command']}", flush=True)
            with open(out / f"{name}.log", "w") as log:
                rc = subprocess.run([sys.executable, *args], env={**os.environ, "OUT": str(folder)},
                                    stdout=log, stderr=subprocess.STDOUT).returncode
            record.update(rc=rc, seconds=round(time.monotonic() - start, 1))
            print(f"step {i}: exit {rc} after {record['seconds']} s (log {name}.log)", flush=True)
        records.append(record)
        (out / "steps.json").write_text(json.dumps(records, indent=2) + "\n")
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--stop-after", type=float, default=None, metavar="S",
                    help="start no step after S seconds from the job's start")
    ap.add_argument("steps", nargs="+", metavar="STEP", help="one python3 command's arguments, quoted")
    a = ap.parse_args(argv)
    steps = [shlex.split(s) for s in a.steps]
    empty = [s for s, parsed in zip(a.steps, steps, strict=True) if not parsed]
    if empty:
        ap.error(f"a step is empty ({empty[0]!r}): each STEP is a script and its options, e.g. "
                 "'bench/attention_sweep.py --batches 8'")
    out = Path(os.environ.get("OUT") or "/tmp/out")
    records = run_steps(steps, out, a.stop_after)
    return sum(1 for r in records if r.get("rc") != 0)


if __name__ == "__main__":
    sys.exit(main())
