"""The device calls that carry images' exports to a GPU host, packed first-fit under the carry limit (standard
library only: it runs here, beside `invoke rootfs-export`).

Why: a call carries at most 64 MiB with the working tree and 8 paths, and each call costs GPU-host seconds whatever it
carries. One part a call leaves a small part, a manifest, the spec and the parts.json files each in a call of its
own; packed first-fit by size they share calls with the big parts. EXTRA paths (the embedded model's halves, the
libraries that convert it) travel first, in the order given, so that work on the host can start while parts travel.

    python3 bench/transport/plan_calls.py EXPORT... [--extra PATH ...] [--tree-mb MB]
        EXPORT: folders under .stage/rootfs (rootfs-export --out); the last one's manifest and spec travel too

Prints one JSON line a call: {"n", "mb", "carry": [paths], "stash": [export folders to stash]}; with --commands, the
`image_run.sh stash` command line of each call instead of "stash".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

LIMIT = 64 * 2**20  # the device tool's carry limit, working tree included
MAX_PATHS = 8  # and the paths one call may carry
SMALL = ("parts.json",)
LAST = ("rootfs-manifest.json.gz", "rootfs-spec.json")


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def tree_bytes(root: Path) -> int:
    """What the working tree takes of each call: the files git tracks and the untracked ones it does not ignore (what
    the device tool carries with every call), each at its size on disk in whole blocks. A plan made from the files'
    byte sum had calls refused as over the limit by the tool's own count, so the allocated size, a little more, is
    the measure; a tracked file deleted from the tree does not travel and is not counted."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout
    total = 0
    for name in filter(None, listed.split(b"\0")):
        try:
            st = (root / os.fsdecode(name)).stat()
        except FileNotFoundError:
            continue
        total += max(st.st_size, st.st_blocks * 512)
    return total


def items(exports: list[Path]) -> list[tuple[Path, Path]]:
    """(file to carry, export folder it stashes into): every part and parts.json; the last export's manifest and
    spec (the image is assembled from them)."""
    out: list[tuple[Path, Path]] = []
    for i, folder in enumerate(exports):
        if not (folder / "parts.json").is_file():
            raise SystemExit(f"plan_calls: {folder} has no parts.json: give folders `invoke rootfs-export --out` wrote")
        names = [p.name for p in sorted(folder.iterdir())]
        wanted = [n for n in names if n.startswith("part-") or n in SMALL or (i == len(exports) - 1 and n in LAST)]
        out += [(folder / n, folder) for n in wanted]
    return out


def plan(exports: list[Path], extra: list[Path], budget: int) -> list[dict[str, Any]]:
    """Calls: first the EXTRA paths (each starts a call, in order, and a folder among them is stashed too; parts
    may join it), then the parts first-fit by decreasing size, at most MAX_PATHS paths a call; a file over the budget
    is refused (it never travels)."""
    bins: list[tuple[int, list[tuple[Path, Path | None]]]] = [(size(p), [(p, p if p.is_dir() else None)])
                                                              for p in extra]
    for path, folder in sorted(items(exports), key=lambda pf: -size(pf[0])):
        s = size(path)
        if s > budget:
            raise SystemExit(f"plan_calls: {path} is {s / 1e6:.1f} MB, over the {budget / 1e6:.1f} MB a call carries "
                             "besides the working tree: carry a smaller tree (move what the jobs do not read, such as "
                             "bench/results' evaluation folders, out of the checkout for the lease) or export again "
                             "with smaller parts")
        for i, (used, held) in enumerate(bins):
            if used + s <= budget and len(held) < MAX_PATHS:
                bins[i] = (used + s, [*held, (path, folder)])
                break
        else:
            bins.append((s, [(path, folder)]))
    return [{"n": n, "mb": round(used / 1e6, 1), "carry": [str(p) for p, _ in held],
             "stash": sorted({str(f) for _, f in held if f is not None})} for n, (used, held) in enumerate(bins)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("exports", type=Path, nargs="+", help="export folders, the image's own last")
    ap.add_argument("--extra", type=Path, action="append", default=[], help="a path to carry first (repeatable)")
    ap.add_argument("--tree-mb", type=float,
                    help="what the working tree takes of each call (MB; default: measured in this checkout)")
    ap.add_argument("--commands", action="store_true", help="print image_run.sh's stash command of each call")
    args = ap.parse_args(argv)
    tree = int(args.tree_mb * 1e6) if args.tree_mb is not None else tree_bytes(Path(__file__).resolve().parents[2])
    print(f"plan_calls: the working tree takes {tree / 1e6:.1f} MB of each call", file=sys.stderr)
    calls = plan(args.exports, args.extra, LIMIT - tree)
    for call in calls:
        if args.commands:
            stash = call.pop("stash")
            call["command"] = "bash bench/transport/image_run.sh stash " + " ".join(stash) if stash else "true"
        print(json.dumps(call))
    print(f"plan_calls: {len(calls)} calls, {sum(c['mb'] for c in calls):.1f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
