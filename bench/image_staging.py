"""What it costs, in GPU-host time, to get a stack's image running on a GPU host without Docker or network: the
device calls of each lease (bench/transport/leases/*.json: the lender's held-time after each call), summed into
phases, one group of rows per lease. Writes bench/results/image_staging.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rlstack.core import results

HERE = Path(__file__).resolve().parent
LEASES = HERE / "transport" / "leases"


def lease_rows(lease: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """A lease's phases (held-time deltas) and its total from a bare host; a survey in a lease of its own is
    shown but not summed."""
    rows: list[dict[str, Any]] = []
    before = 0.0
    for call in lease["calls"]:
        row = {"lease": name, "phase": call["what"], "calls": call.get("calls", 1), "carried_mb": call["carried_mb"]}
        if call["what"].startswith("survey"):
            rows.append({**row, "held_s": call["held_s"]})
            continue
        rows.append({**row, "held_s": round(call["held_s"] - before, 1)})
        before = call["held_s"]
    main = [r for r in rows if not str(r["phase"]).startswith("survey")]
    total = lease.get("total", "bare host -> image running (this lease)")
    rows.append({"lease": name, "phase": f"{total}: {', '.join(lease['images'])}", "held_s": round(before, 1),
                 "calls": sum(int(r["calls"]) for r in main),
                 "carried_mb": round(sum(float(r["carried_mb"]) for r in main), 1)})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("leases", type=Path, nargs="*", help="lease records (default: every one in bench/transport/leases)")
    args = p.parse_args()
    paths = sorted(args.leases or LEASES.glob("*.json"))
    leases = [(path, json.loads(path.read_text())) for path in paths]
    rows = [r for path, lease in leases for r in lease_rows(lease, path.stem)]
    latest = max(leases, key=lambda pl: str(pl[1]["date"]))[1]
    gpus = sorted({str(lease["gpu"]) for _, lease in leases})
    result = results.Result(
        question="staging", title="A stack's image on a GPU host without Docker: GPU-host seconds from a bare host",
        date=latest["date"], columns=["lease", "phase", "held_s", "calls", "carried_mb"], rows=rows,
        ran=results.Ran(command="python3 bench/image_staging.py " + " ".join(
            str(p.relative_to(HERE.parent)) for p in paths), bench="image_staging",
            options={"leases": [p.stem for p in paths]}),
        where=results.Where(gpu=", ".join(gpus), driver=latest["driver"],
                            environment="image " + ", ".join(latest["images"])),
        group_by="lease",
        extra={"notes": {path.stem: lease["note"] for path, lease in leases}})
    print(results.write(result, "image_staging"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
