"""The CI matrices, computed in one place from the stack files. Workflows read them from
`invoke ci-matrix`; no stack name, version or GPU arch is typed into workflow YAML."""

from __future__ import annotations

import json
from typing import Any, Literal

from rlstack.core.errors import RlstackError
from rlstack.host import stacks
from rlstack.host.stacks import Stack

Kind = Literal["images", "gpu-probes", "canary", "all"]
KINDS = ("images", "gpu-probes", "canary", "all")
# Runners that carry a GPU of a given arch register with these labels (README: "GPU runners").
GPU_RUNNER_LABELS = ["self-hosted", "gpu"]
CPU_RUNNER = "ubuntu-latest"


def images_matrix(all_stacks: list[Stack]) -> dict[str, Any]:
    return {
        "include": [
            {
                "stack": s.name,
                "python": s.python,
                "torch": s.torch.version,
                "cuda": s.cuda_label,
                "base_image": s.base_image,
                "max_image_gb": s.max_image_gb,
                "gpu_required": s.gpu_required,
            }
            for s in all_stacks
        ]
    }


def probe_jobs(all_stacks: list[Stack]) -> list[dict[str, Any]]:
    """Every (stack, arch) a probe job runs for. GPU stacks run on self-hosted runners labelled with the
    arch; a CPU-only stack runs once on a hosted runner, where the runtime layer skips with its reason."""
    jobs: list[dict[str, Any]] = []
    for s in all_stacks:
        if s.gpu_archs:
            for arch in s.gpu_archs:
                job = {"stack": s.name, "arch": arch, "runs_on": [*GPU_RUNNER_LABELS, arch]}
                jobs.append({**job, "canary": True} if s.ci_canary else job)
        else:
            jobs.append({"stack": s.name, "arch": "none", "runs_on": [CPU_RUNNER]})
    return jobs


def split_canary(jobs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The canary is the first GPU job of the stack marked `ci_canary` (the one expected to pass): if a
    runner or the probe code is broken, it fails alone instead of failing every job."""
    gpu = [j for j in jobs if j["arch"] != "none"]
    marked = [j for j in gpu if j.get("canary")]
    if not gpu:
        raise RlstackError("no stack lists a GPU arch, so there is no GPU probe job to run as canary")
    canary = (marked or gpu)[0]
    strip = [{k: v for k, v in j.items() if k != "canary"} for j in jobs]
    return strip[jobs.index(canary)], [j for i, j in enumerate(strip) if i != jobs.index(canary)]


def matrix(kind: str, names: list[str] | None = None) -> dict[str, Any]:
    if kind not in KINDS:
        raise RlstackError(f"unknown matrix kind '{kind}'", f"valid kinds: {', '.join(KINDS)}")
    chosen = [stacks.load_stack(n) for n in (names or stacks.stack_names())]
    canary, rest = split_canary(probe_jobs(chosen)) if kind != "images" else ({}, [])
    if kind == "images":
        return images_matrix(chosen)
    if kind == "canary":
        return {"include": [canary]}
    if kind == "gpu-probes":
        return {"include": rest}
    return {"images": images_matrix(chosen), "canary": {"include": [canary]}, "gpu-probes": {"include": rest}}


def matrix_json(kind: str, names: list[str] | None = None) -> str:
    """Compact JSON: GitHub's `fromJSON` reads it from a step output, which must be a single line."""
    return json.dumps(matrix(kind, names), separators=(",", ":"))
