"""What a lease's `steps-bg` job says, in a few lines, with the plan's decisions applied (docs/archive/notes.md's device
plans).

Why: inside a lease the machine is let go after 30 s without a call, and the plan's second step is a decision
(whether a launch shape becomes `split_attention.TUNING`) that has to be made between two calls, from a sweep of
~90 rows and a profile of several variants. This reads the folder `bench/transport/fastgen_fidelity_device.sh
profile-wait` brought back (bench/transport/steps.py's layout: `steps.json`, `N-<name>/`, `N-<name>.log`) and prints:
each step's exit; the profile's wall time a token per variant and batch against the first variant's, with the
parts the variants move (prefill_ms, refresh_ms, prefilled_rows, attention_filled_ms, sampling_ms, loop_ms,
kernels_per_step) and the pick's parts once a batch (draw="triton"'s kernels against what they replace); the
GPU tests' result line; the sweep's best shape per batch against the default, and the verdict of the plan's
rule: a shape becomes TUNING when it is > 10 % faster at 64 sequences and not slower at 8 (both from the sweep,
then confirmed in the step by `--variant attention_tuning=<spec>`).

    python bench/transport/lease_summary.py DIR   DIR: the $OUT folder the wait brought back (files_at on the host)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

WIN = 0.90  # the plan's rule: > 10 % faster at 64 sequences ...
HOLD = 1.00  # ... and not slower at 8
PROFILE_PARTS = ("prefill_ms", "refresh_ms", "prefilled_rows", "attention_filled_ms", "sampling_ms", "loop_ms",
                 "kernels_per_step")
PICK_PARTS = ("warp_ms", "draw_ms", "draw_triton_ms")  # draw="triton"'s kernels against the torch parts they replace


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    """The results file ``name``.json of the last step that wrote one (steps' folders in order), or None."""
    found = sorted(folder.glob(f"*/{name}.json"), key=lambda p: int(p.parent.name.split("-", 1)[0])
                   if p.parent.name.split("-", 1)[0].isdigit() else 0)
    if not found and (folder / f"{name}.json").exists():
        found = [folder / f"{name}.json"]
    return json.loads(found[-1].read_text()) if found else None


def steps_lines(folder: Path) -> list[str]:
    """One line a step of steps.json: its exit code (or why it did not start) and seconds."""
    path = folder / "steps.json"
    if not path.exists():
        return ["no steps.json here: not a steps-bg job's folder (or the job wrote none yet)"]
    out = []
    for r in json.loads(path.read_text()):
        state = f"exit {r['rc']} in {r.get('seconds')} s" if r.get("rc") is not None else r.get("note", "?")
        out.append(f"step {r['step']} {r['out']}: {state}")
    return out


def profile_lines(data: dict[str, Any]) -> list[str]:
    """Each variant's wall ms a token against the first variant's at the same batch, and the parts it moves."""
    rows = data.get("table", [])
    base = {r["batch"]: r for r in rows if r.get("variant") == (rows[0].get("variant") if rows else None)}
    out = []
    for r in rows:
        ref = base.get(r["batch"])
        wall = r.get("wall_ms")
        delta = (f" ({(wall / ref['wall_ms'] - 1) * 100:+.1f} %)" if wall and ref and ref.get("wall_ms")
                 and ref is not r else "")
        parts = ", ".join(f"{k} {r[k]}" for k in PROFILE_PARTS if r.get(k) is not None)
        error = f"; compile_error: {str(r['compile_error'])[:120]}" if r.get("compile_error") else ""
        out.append(f"[{r.get('variant') or 'default'}] batch {r['batch']}: wall {wall} ms{delta}; {parts}{error}")
    seen = set()
    for r in rows:  # the pick's parts, timed once a batch (the same for every variant)
        pick = r.get("pick_parts") or {}
        if r["batch"] not in seen and any(k in pick for k in PICK_PARTS):
            seen.add(r["batch"])
            shapes = pick.get("draw_triton_by_chunks") or {}
            fastest = (f"; fastest draw launch (chunks:warps) {min(shapes, key=shapes.get)} "
                       f"{min(shapes.values())}" if shapes else "")
            out.append(f"pick at batch {r['batch']}: "
                       + ", ".join(f"{k} {pick[k]}" for k in PICK_PARTS if k in pick) + fastest)
    return out


def sweep_verdict(data: dict[str, Any]) -> tuple[list[str], str | None]:
    """(lines on the sweep's best per batch, the spec the plan's rule makes TUNING or None): the best right shape
    at 64 must be > 10 % faster than the default there, and the same shape no slower than the default at 8."""
    rows = [r for r in data.get("table", []) if r.get("spec")]
    default = data.get("default")
    lines, by_batch = [], {}
    for key, best in sorted(data.get("best", {}).items()):
        lines.append(f"sweep best at {key}: {best.get('spec')} {best.get('ms')} ms, {best.get('vs_default')}x the "
                     f"default")
        batch = int(key.split(",")[0].split("=")[1])
        by_batch.setdefault(batch, best)
    wrong = [r for r in rows if r.get("ok") is False]
    if wrong:
        lines.append(f"{len(wrong)} shapes not ok (wrong answer or no compile), e.g. {wrong[0].get('spec')}: "
                     f"{wrong[0].get('error') or wrong[0].get('max_err')}")
    best64 = by_batch.get(64)
    if not best64 or (best64.get("vs_default") or 1) > WIN:
        lines.append(f"verdict: keep TUNING ({default}): nothing > 10 % faster at 64 sequences")
        return lines, None
    at8 = [r for r in rows if r["batch"] == 8 and r.get("ok") and same_launch(r, best64["spec"], data)]
    if not at8 or (at8[0].get("vs_default") or 99) > HOLD:
        lines.append(f"verdict: keep TUNING: {best64['spec']} wins at 64 but "
                     + (f"is {at8[0].get('vs_default')}x the default at 8" if at8 else "was not timed (ok) at 8"))
        return lines, None
    lines.append(f"verdict: {best64['spec']} ({best64['vs_default']}x at 64, {at8[0]['vs_default']}x at 8): confirm "
                 f"in the step with --variant attention_tuning={best64['spec']}, then TUNING = "
                 f"Tuning.parse({best64['spec']!r})")
    return lines, best64["spec"]


def same_launch(row: dict[str, Any], spec: str, data: dict[str, Any]) -> bool:
    """Whether ``row`` (a sweep row) is the launch ``spec`` makes at the row's batch: the same shape but for
    ``programs``, and the same splits (the sweep times a launch two tunings share once, under the first's spec)."""
    from rlstack.payload.fastgen.split_attention import Tuning, splits_for

    want, got = Tuning.parse(spec), Tuning.parse(row["spec"])
    shape = data.get("shape", {})
    kv, length = int(shape.get("kv_heads", 8)), int(shape.get("length", 768))
    return ((want.block_n, want.num_warps, want.num_stages, want.fuse_merge)
            == (got.block_n, got.num_warps, got.num_stages, got.fuse_merge)
            and splits_for(row["batch"], kv, length, want) == row.get("splits"))


def tests_line(folder: Path) -> str | None:
    """pytest's last summary line from a step log, if a step ran pytest."""
    for log in sorted(folder.glob("*-pytest.log")):
        tail = [line for line in log.read_text(errors="replace").splitlines() if " passed" in line
                or " failed" in line or " error" in line]
        if tail:
            return f"{log.name}: {tail[-1].strip()}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("folder", type=Path, help="the $OUT folder a steps-bg job's wait brought back")
    a = ap.parse_args(argv)
    if not a.folder.is_dir():
        print(f"lease_summary: {a.folder} is not a folder (give the files_at folder of the wait's reply)",
              file=sys.stderr)
        return 2
    lines = steps_lines(a.folder)
    profile = _load(a.folder, "fastgen_profile")
    lines += profile_lines(profile) if profile else ["no fastgen_profile.json"]
    test = tests_line(a.folder)
    lines.append(test or "no pytest step log")
    sweep = _load(a.folder, "attention_sweep")
    lines += sweep_verdict(sweep)[0] if sweep else ["no attention_sweep.json"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
