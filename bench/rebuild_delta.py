"""What an image adds to rootfs exports the GPU host already holds (`invoke rootfs-export --previous`): the bytes
and parts a lease must carry for a rebuild whose lock did not change, or for a second stack's image beside the
first's. Reads the exports' own summaries (bench/transport/exports/*.json: what `invoke rootfs-export` printed,
with what it was exported over and how the image's .pyc files were written). Writes
bench/results/rebuild_delta.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlstack.core import results

HERE = Path(__file__).resolve().parent
EXPORTS = HERE / "transport" / "exports"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("exports", type=Path, nargs="*", help="export records (default: bench/transport/exports/*.json)")
    args = p.parse_args()
    paths = sorted(args.exports or EXPORTS.glob("*.json"))
    rows = []
    for path in paths:
        rec = json.loads(path.read_text())
        e = rec["export"]
        rows.append({"export": path.stem, "image": rec["image"], "previous": rec["previous"], "pyc": rec["pyc"],
                     "rebuild": rec["rebuild"], "files": e["files"], "shipped_mb": round(e["shipped_bytes"] / 1e6, 2),
                     "parts": e["parts"], "carried_mb": round(e["carried_bytes"] / 1e6, 2)})
    result = results.Result(
        question="staging", title="Exports over exports the host holds: what a rebuild, or a second image, carries",
        date=max(json.loads(p.read_text())["date"] for p in paths),
        columns=["export", "image", "previous", "pyc", "rebuild", "files", "shipped_mb", "parts", "carried_mb"],
        rows=rows,
        ran=results.Ran(command="python3 bench/rebuild_delta.py " + " ".join(
            str(p.relative_to(HERE.parent)) for p in paths), bench="rebuild_delta"),
        where=results.Where(environment="host", machine="vm, 2 CPU cores (Docker export)"))
    print(results.write(result, "rebuild_delta"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
