"""Image build benchmark: cold build time and size of each stack's image, the warm rebuild after a one-line
source change, and the no-change skip. Results merge per stack into bench/results/image_build.json.

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


def write(by_stack: dict[str, dict[str, Any]]) -> None:
    """bench/results/image_build.json in the results schema: one row per stack, the stacks measured before kept."""
    from rlstack.core import results

    result = results.Result(
        question="image-builds", title="Image builds from an empty builder cache",
        date=max(r["measured"] for r in by_stack.values()).replace("+00:00", "Z"),
        ran=results.Ran(command="python3 bench/image_build.py --stack STACK --base-image "
                                "rlstack-test/bookworm-minbase", bench="image_build"),
        where=results.Where.detect(environment="host", machine=f"{os.cpu_count()} cores"),
        columns=["stack", "cold_build_s", "size_gb", "max_image_gb", "warm_rebuild_after_source_change_s",
                 "layers_rebuilt_by_source_change", "no_change_skip_s", "measured"],
        rows=[by_stack[k] for k in sorted(by_stack)])
    results.write(result, "image_build", RESULTS)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stack", default="cpu", help="comma-separated stacks")
    p.add_argument("--base-image", default="rlstack-test/bookworm-minbase")
    p.add_argument("--ca-cert", default=None, help="default: $RLSTACK_CA_CERT / $SSL_CERT_FILE")
    p.add_argument("--keep-cache", action="store_true", help="do not empty the builder cache first")
    p.add_argument("--keep-images", action="store_true", help="keep the bench images afterwards")
    args = p.parse_args()
    from rlstack.core import results

    path = RESULTS / "image_build.json"
    by_stack = {r["stack"]: r for r in results.read(path).rows} if path.is_file() else {}
    for name in args.stack.split(","):
        r = bench_stack(name, args.base_image, args.ca_cert, args.keep_cache, not args.keep_images)
        by_stack[name] = r
        write(by_stack)
        print(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
