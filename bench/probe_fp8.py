"""How long `invoke probe-fp8` takes to answer the report's FP8 RL question for both FP8 stacks, and how many
bytes it fetches: cold (an empty RLSTACK_CACHE: wheel members range-read from PyPI and checked against each
wheel's RECORD, index listings fetched, co-install resolution re-run), warm (the same cache again), and a cold
`--suggest` (the closest passing combination for fp8-report, verified by uv). uv's own package cache is left as
it is in every run: it is the machine's, not rlstack's. Python's bytecode cache is too: the runs drop
PYTHONDONTWRITEBYTECODE (this project's machine sets it, and then every run recompiles rlstack and its
dependencies, about 1 s of CPU that no installed copy spends), and one untimed import writes the caches first.
Writes bench/results/probe_fp8.json and .md.

    python bench/probe_fp8.py [--cold N] [--warm N] [--suggest N]
"""

from __future__ import annotations

import argparse
import datetime as dt
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
    data = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": platform.node(),
            "cpus": os.cpu_count(), "command": "invoke probe-fp8 --json [--suggest]", "median_s": summary,
            "targets_s": {"cold": 5, "warm": 1, "cold --suggest": 60}, "runs": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "probe_fp8.json").write_text(json.dumps(data, indent=2) + "\n")
    md = ["# probe_fp8", "", f"{data['date']} on {data['host']} ({data['cpus']} CPUs), no GPU: `invoke probe-fp8 "
          "--json` (the static layers for fp8-report and fp8 on sm_120), and the same with `--suggest`.", "",
          "Cold = empty RLSTACK_CACHE: wheel members range-read from PyPI (each checked against the wheel's RECORD), "
          "index listings fetched, the co-install resolution re-run by uv; warm = the same cache again. uv's own "
          "package cache is warm in every run, and so is Python's bytecode cache (the runs drop this machine's "
          "PYTHONDONTWRITEBYTECODE=1, under which every run recompiles rlstack and its dependencies). MB and "
          "requests: what rlstack fetched, index listings included (gzip-encoded bytes on the wire); cache MB: what "
          "the run left in RLSTACK_CACHE.", "",
          "| run | wall s | exit | MB fetched | requests | cache MB | fp8-report walls | fp8 failures |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['run']} | {r['wall_s']} | {r['exit']} | {r['mb']} | {r['requests']} | {r['cache_mb']} | "
                  f"{', '.join(r['fp8_report_walls'])} | {', '.join(r['fp8_failures']) or '-'} |")  # type: ignore[arg-type]
    md += ["", "Median: " + ", ".join(f"{k} {v:.1f} s (target {data['targets_s'][k]} s)"  # type: ignore[index]
                                      for k, v in summary.items())]
    for r in rows:
        if "rank1" in r:
            md += ["", f"`--suggest` rank 1 ({r['suggest_s']} s of the run): `{json.dumps(r['rank1'])}`"]
    (RESULTS / "probe_fp8.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
