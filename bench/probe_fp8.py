"""How long `invoke probe-fp8` takes to answer the report's FP8 RL question for both FP8 stacks, and how many
bytes it fetches: cold (an empty RLSTACK_CACHE: wheel members range-read from PyPI and checked against each
wheel's RECORD, index listings fetched, co-install resolution re-run), warm (the same cache again), and a cold
`--suggest` (the closest passing combination for fp8-report, verified by uv). uv's own package cache is left as
it is in every run: it is the machine's, not rlstack's. Python's bytecode cache is too: the runs drop
PYTHONDONTWRITEBYTECODE (this project's machine sets it, and then every run recompiles rlstack and its
dependencies, about 1 s of CPU that no installed copy spends), and one untimed import writes the caches first.
Writes bench/results/probe_fp8.json (the results schema, rlstack.core.results).

    python bench/probe_fp8.py [--cold N] [--warm N] [--suggest N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
INVOKE = [sys.executable, "-m", "invoke"]
TARGETS_S = {"cold": 5, "warm": 1, "cold --suggest": 60}


def _env(cache: Path) -> dict[str, str]:
    env = {**os.environ, "RLSTACK_CACHE": str(cache), "PYTHONPATH": str(ROOT / "src")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def warm_bytecode(cache: Path) -> None:
    """Import what probe-fp8 imports once, untimed, so that every timed run finds the bytecode caches."""
    code = "import invoke, tasks; from rlstack.probes import commands, suite, discover, suggest, report, resolve"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(cache), check=True)


def run_once(cache: Path, *extra: str) -> dict[str, object]:
    cmd = [*INVOKE, "probe-fp8", "--json", *extra]
    env = _env(cache)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    data = json.loads(proc.stdout)
    ref = data["reports"]["fp8-report"]
    walls = sorted({r["signature"] or r["id"] for r in ref["results"] if r["status"] == "fail"})
    fp8_fail = sorted(r["id"] for r in data["reports"]["fp8"]["results"] if r["status"] == "fail")
    out: dict[str, object] = {"wall_s": round(wall, 2), "exit": proc.returncode, "fp8_report_walls": walls,
                              "fp8_failures": fp8_fail, "requests": data["traffic"]["requests"],
                              "mb": round(data["traffic"]["bytes"] / 1e6, 1),
                              "whole_wheels": data["traffic"]["whole_wheels"],
                              "cache_mb": round(sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 1e6,
                                                1)}
    if "suggest" in data:
        best = data["suggest"]["suggestions"][0] if data["suggest"]["suggestions"] else None
        out["suggest_s"] = data["suggest"]["duration_s"]
        out["rank1"] = {k: v for k, v in (best or {}).items() if k in ("passes", "kind", "changes",
                                                                      "lock_lines_changed", "distance")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--cold", type=int, default=2, help="cold runs (each with a fresh empty cache)")
    ap.add_argument("--warm", type=int, default=3, help="warm runs (reusing the last cold run's cache)")
    ap.add_argument("--suggest", type=int, default=1, help="cold --suggest runs (each with a fresh empty cache)")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-probe-") as tmp:
        warm_bytecode(Path(tmp) / "untimed")
        cache = Path(tmp) / "cache0"
        for i in range(args.cold):
            cache = Path(tmp) / f"cache{i}"
            rows.append({"run": "cold", **run_once(cache)})
            print(rows[-1], flush=True)
        for _ in range(args.warm):
            rows.append({"run": "warm", **run_once(cache)})
            print(rows[-1], flush=True)
        for i in range(args.suggest):
            rows.append({"run": "cold --suggest", **run_once(Path(tmp) / f"suggest{i}", "--suggest")})
            print(rows[-1], flush=True)
    kinds = [k for k in ("cold", "warm", "cold --suggest") if any(r["run"] == k for r in rows)]
    summary = {k: statistics.median([float(r["wall_s"]) for r in rows if r["run"] == k]) for k in kinds}  # type: ignore[arg-type]
    from rlstack.core import results

    table = [{"run": k, "median_s": v, "target_s": TARGETS_S[k],
              "mb_read": next((r["mb"] for r in rows if r["run"] == k), None)} for k, v in summary.items()]
    result = results.Result(
        question="probe-speed", title="invoke probe-fp8, both FP8 stacks, no GPU (median of 3)",
        ran=results.Ran(command="invoke probe-fp8 --json [--suggest]", bench="probe_fp8"),
        where=results.Where.detect(environment="host", machine=f"{os.cpu_count()} cores"),
        columns=["run", "median_s", "target_s", "mb_read"], rows=table,
        notes="Cold: an empty RLSTACK_CACHE (wheel members range-read from PyPI, each checked against its RECORD); "
              "warm: the same cache again. uv's package cache and Python's bytecode cache are warm in every run.",
        extra={"host": platform.node(), "cpus": os.cpu_count(), "runs": rows})
    print(f"wrote {results.write(result, 'probe_fp8', RESULTS)}")
    print({k: f"{v:.2f} s" for k, v in summary.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
