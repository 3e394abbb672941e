"""FlashInfer's JIT from a cold cache, in the stack's environment: which nvcc it found, which it ran (the
generated build.ninja says), and how long the first build of its sampling module took.

Run inside the stack's image (rlstack.scripts.rootfs run --entrypoint python3 -- bench/jit_cold_start.py) or
natively: the JIT cache goes to a fresh folder, so every run is cold. Writes bench/results/jit_cold_start.json
(or --out).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from rlstack.core import results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the result here instead of bench/results/")
    p.add_argument("--stack", default=os.environ.get("RLSTACK_STACK"))
    args = p.parse_args()
    workspace = Path(tempfile.mkdtemp(prefix="flashinfer-cold-"))
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(workspace)  # read when flashinfer.jit.env is imported
    from flashinfer.jit import cpp_ext
    from flashinfer.jit import env as jit_env

    found = {"cuda_home_env": os.environ.get("CUDA_HOME"), "get_cuda_path": cpp_ext.get_cuda_path(),
             "get_cuda_version": str(cpp_ext.get_cuda_version())}
    import flashinfer.sampling as sampling
    import torch

    t0 = time.monotonic()
    sampling.get_sampling_module()
    build_s = time.monotonic() - t0
    ninja = sorted(Path(jit_env.FLASHINFER_JIT_DIR).rglob("build.ninja"))
    nvcc = None
    for f in ninja:
        m = re.search(r"^nvcc = (.+)$", f.read_text(), re.M)
        if m:
            nvcc = m[1].strip().replace("$cuda_home", found["get_cuda_path"])
            break
    nvcc_version = None
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        v = re.search(r"V(\d+\.\d+\.\d+)", out)
        nvcc_version = v[1] if v else None
    probs = torch.softmax(torch.randn(4, 1000, device="cuda"), -1)
    t1 = time.monotonic()
    sample = sampling.top_k_top_p_sampling_from_probs(probs, top_k=50, top_p=0.9)
    torch.cuda.synchronize()
    row = {"module": "sampling", "build_s": round(build_s, 1), "nvcc": nvcc, "nvcc_version": nvcc_version,
           **found, "build_files": len(ninja), "first_call_s": round(time.monotonic() - t1, 3),
           "sample_ok": bool(((sample >= 0) & (sample < 1000)).all())}
    print(row)
    image = os.environ.get("RLSTACK_IMAGE")
    result = results.Result(
        question="image-builds", title="FlashInfer's JIT from a cold cache: the nvcc it ran and the build time",
        ran=results.Ran(command="python3 bench/jit_cold_start.py (inside the image: rlstack.scripts.rootfs run)",
                        bench="jit_cold_start", stack=args.stack, lock_hash=os.environ.get("RLSTACK_LOCK_HASH")),
        where=results.Where.detect(environment=f"image {image}" if image else "native"),
        columns=list(row), rows=[row])
    if args.out:
        args.out.write_text(result.model_dump_json(indent=1) + "\n")
    else:
        results.write(result, "jit_cold_start")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
