"""Image build benchmark: cold build time and size of each stack's image, the warm rebuild after a one-line
source change, and the no-change skip. Results merge per stack into bench/results/image_build.{json,md}.

"Cold" means an empty BuildKit cache (layers and the uv/apt cache mounts: `docker builder prune -af`
runs first unless --keep-cache), so every wheel is downloaded and installed; the base image is already
local (pulling it is not part of what we measure). Builds run from a temporary copy of the build
context under the image repository `rlstack-bench`, so the checkout and rlstack/<stack>:latest are
untouched.

    .venv/bin/python bench/image_build.py --stack cpu --base-image rlstack-test/bookworm-minbase
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rlstack import stacks  # noqa: E402
from rlstack.core.tables import markdown_table  # noqa: E402
from rlstack.host import engine, images  # noqa: E402

RESULTS = ROOT / "bench" / "results"
REPO = "rlstack-bench"


def copy_context(dst: Path) -> None:
    images.copy_context(dst, ROOT)


def timed_build(plan: images.BuildPlan, *, force: bool = False) -> float:
    t0 = time.perf_counter()
    images.ensure_built(plan, force=force)
    return time.perf_counter() - t0


def bench_stack(name: str, base_image: str, ca_cert: str | None, keep_cache: bool, remove: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-ctx-") as tmp:
        ctx = Path(tmp)
        copy_context(ctx)
        stack = stacks.load_stack(name, ctx / "images")
        if not keep_cache:
            subprocess.run([engine.client(), "builder", "prune", "-af"], check=True, capture_output=True)
        plan = images.plan(stack, base_image=base_image, ca_cert=ca_cert, root=ctx, repo=REPO)
        cold = timed_build(plan, force=True)
        size = images.size_bytes(plan.tag)
        layers = len(images.layer_digests(plan.tag))
        skip = timed_build(plan)
        src = ctx / "src" / "rlstack" / "__init__.py"
        src.write_text(src.read_text() + f"\n# bench touch {uuid.uuid4().hex}\n")
        warm_plan = images.plan(stack, base_image=base_image, ca_cert=ca_cert, root=ctx, repo=REPO)
        warm = timed_build(warm_plan)
        before, after = images.layer_digests(plan.tag), images.layer_digests(warm_plan.tag)
        rebuilt = sum(1 for a, b in zip(before, after, strict=False) if a != b)
        if remove:
            subprocess.run([engine.client(), "rmi", plan.tag, warm_plan.tag, plan.latest], capture_output=True,
                           check=False)
    return {
        "stack": name,
        "cold_build_s": round(cold, 1),
        "cold_cache": "kept" if keep_cache else "empty (builder prune -af)",
        "size_bytes": size,
        "size_gb": round(size / 1e9, 2),
        "max_image_gb": stack.max_image_gb,
        "layers": layers,
        "no_change_skip_s": round(skip, 2),
        "warm_rebuild_after_source_change_s": round(warm, 1),
        "layers_rebuilt_by_source_change": rebuilt,
        "base_image": base_image,
        "lock_hash": plan.args["LOCK_HASH"],
        "measured": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {os.cpu_count()} cores",
    }


def write(results: dict[str, dict[str, Any]]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "image_build.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        v = r.get(key)
        return "-" if v is None else format(v, fmt)

    rows = [[r["stack"], cell(r, "cold_build_s", ".0f"), cell(r, "size_gb", ".2f"), cell(r, "max_image_gb", "g"),
             cell(r, "warm_rebuild_after_source_change_s", ".1f"), cell(r, "layers_rebuilt_by_source_change", "d"),
             cell(r, "no_change_skip_s", ".2f"), r.get("machine", "-"), r.get("measured", "-")[:10]]
            for r in (results[k] for k in sorted(results))]
    notes = [f"- {r['stack']}: {r['note']}" for r in (results[k] for k in sorted(results)) if r.get("note")]
    md = [
        "# Image builds",
        "",
        "Measured by `bench/image_build.py` (BuildKit via Debian's docker.io 20.10, base image "
        "`rlstack-test/bookworm-minbase` = debootstrap bookworm minbase; cold = empty builder cache, every wheel "
        "downloaded from PyPI). Warm = rebuild after a one-line change to a project source file.",
        "",
        markdown_table(["stack", "cold build s", "size GB", "limit GB", "warm rebuild s", "layers rebuilt",
                        "no-change skip s", "machine", "date"], rows),
        "",
        *notes,
        *([""] if notes else []),
    ]
    (RESULTS / "image_build.md").write_text("\n".join(md))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stack", default="cpu", help="comma-separated stacks")
    p.add_argument("--base-image", default="rlstack-test/bookworm-minbase")
    p.add_argument("--ca-cert", default=None, help="default: $RLSTACK_CA_CERT / $SSL_CERT_FILE")
    p.add_argument("--keep-cache", action="store_true", help="do not empty the builder cache first")
    p.add_argument("--keep-images", action="store_true", help="keep the bench images afterwards")
    args = p.parse_args()
    path = RESULTS / "image_build.json"
    results: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.is_file() else {}
    for name in args.stack.split(","):
        r = bench_stack(name, args.base_image, args.ca_cert, args.keep_cache, not args.keep_images)
        results[name] = r
        write(results)
        print(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
