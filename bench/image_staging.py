"""What it costs, in GPU-host time, to get a stack's image running on a GPU host without Docker or network: the
device calls of one lease (bench/transport/leases/*.json: the lender's held-time after each call), summed into
phases. Writes bench/results/image_staging.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlstack.core import results

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("lease", type=Path, nargs="?", default=HERE / "transport" / "leases" / "fp8-image-20261206.json")
    args = p.parse_args()
    lease = json.loads(args.lease.read_text())
    rows, before = [], 0.0
    for call in lease["calls"]:
        if call["what"].startswith("survey"):
            rows.append({"phase": call["what"], "held_s": call["held_s"], "calls": 1, "carried_mb": call["carried_mb"]})
            continue
        rows.append({"phase": call["what"], "held_s": round(call["held_s"] - before, 1), "calls": call.get("calls", 1),
                     "carried_mb": call["carried_mb"]})
        before = call["held_s"]
    main_lease = [r for r in rows if not str(r["phase"]).startswith("survey")]
    rows.append({"phase": "bare host -> image running (this lease)", "held_s": round(before, 1),
                 "calls": sum(int(r["calls"]) for r in main_lease),
                 "carried_mb": round(sum(float(r["carried_mb"]) for r in main_lease), 1)})
    result = results.Result(
        question="staging", title="A stack's image on a GPU host without Docker: GPU-host seconds from a bare host",
        date=lease["date"], columns=["phase", "held_s", "calls", "carried_mb"], rows=rows,
        ran=results.Ran(command=f"python3 bench/image_staging.py {args.lease.relative_to(HERE.parent)}",
                        bench="image_staging", stack="fp8", options={"image": lease["image"]}),
        where=results.Where(gpu=lease["gpu"], driver=lease["driver"], environment=f"image {lease['image']}"),
        extra={"note": lease["note"]})
    print(results.write(result, "image_staging"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
