"""How long `invoke probe-fp8` takes to answer the report's FP8 RL question, with the wheel cache cold
(empty RLSTACK_CACHE: every locked wheel is downloaded and hash-verified, every resolution re-run) and warm
(wheels, resolutions and torch's arch list cached). uv's own package cache is left as it is in both: it is
the machine's, not rlstack's. Writes bench/results/probe_fp8.json and .md.

    python bench/probe_fp8.py [--cold N] [--warm N]
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


def run_once(cache: Path) -> dict[str, object]:
    cmd = [sys.executable, "-m", "invoke", "probe-fp8", "--json"]
    env = {**os.environ, "RLSTACK_CACHE": str(cache), "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    report = json.loads(proc.stdout)
    walls = sorted({r["signature"] for r in report["results"] if r["status"] == "fail" and r["signature"]})
    wheels = sum(1 for p in (cache / "wheels").glob("*.whl"))
    size = sum(p.stat().st_size for p in (cache / "wheels").glob("*.whl"))
    return {"wall_s": round(wall, 2), "exit": proc.returncode, "walls": walls, "wheels": wheels,
            "wheel_mb": round(size / 1e6, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cold", type=int, default=2, help="cold runs (each with a fresh empty cache)")
    ap.add_argument("--warm", type=int, default=3, help="warm runs (reusing the last cold run's cache)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-probe-") as tmp:
        cache = Path(tmp) / "cache0"
        for i in range(args.cold):
            cache = Path(tmp) / f"cache{i}"
            rows.append({"run": "cold", **run_once(cache)})
            print(rows[-1], flush=True)
        for _ in range(args.warm):
            rows.append({"run": "warm", **run_once(cache)})
            print(rows[-1], flush=True)
    summary = {k: statistics.median([r["wall_s"] for r in rows if r["run"] == k]) for k in ("cold", "warm")
               if any(r["run"] == k for r in rows)}
    data = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": platform.node(),
            "cpus": os.cpu_count(), "command": "invoke probe-fp8 --json", "median_s": summary, "runs": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "probe_fp8.json").write_text(json.dumps(data, indent=2) + "\n")
    md = ["# probe_fp8", "", f"{data['date']} on {data['host']} ({data['cpus']} CPUs), no GPU: "
          "`invoke probe-fp8` (all layers; runtime skips without a GPU).", "",
          "Cold = empty RLSTACK_CACHE (locked wheels downloaded from PyPI and sha256-verified, resolutions re-run); "
          "warm = the same cache again. uv's own cache is warm in both.", "",
          "| run | wall s | exit | walls found | wheels | wheel MB |", "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['run']} | {r['wall_s']} | {r['exit']} | {', '.join(r['walls'])} | {r['wheels']} | "  # type: ignore[arg-type]
                  f"{r['wheel_mb']} |")
    md += ["", "Median: " + ", ".join(f"{k} {v:.1f} s" for k, v in summary.items())]
    (RESULTS / "probe_fp8.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
