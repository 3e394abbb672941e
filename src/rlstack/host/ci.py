"""What the CI workflows run, computed and done here so that no logic lives only in YAML: the job matrices
(from the stack files only: no stack name, version or GPU arch is typed into a workflow), one gpu-probes job,
the merge of its results into the compat matrix, and freeing disk on a hosted runner."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from rlstack import stacks
from rlstack.core import runner
from rlstack.core.errors import RlstackError
from rlstack.core.fileio import write_atomic
from rlstack.stacks.model import Stack

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


# Large toolchains preinstalled on GitHub's hosted Ubuntu runners that an image build never uses;
# CUDA stack images need ~30 GB of free disk while they build.
HOSTED_RUNNER_BLOAT = ["/usr/share/dotnet", "/usr/local/lib/android", "/opt/ghc", "/opt/hostedtoolcache/CodeQL"]


def free_gb(path: str = "/") -> float:
    return shutil.disk_usage(path).free / 1e9


def free_disk(paths: list[str] | None = None, *, force: bool = False) -> float:
    """Delete the hosted runner's unused toolchains. Refuses outside GitHub Actions unless forced, so a
    developer who runs it by mistake loses nothing."""
    if not force and os.environ.get("GITHUB_ACTIONS") != "true":
        raise RlstackError(
            "ci-free-disk deletes system folders and only runs on GitHub's hosted runners",
            "pass --force if you really mean to run it elsewhere",
        )
    before = free_gb()
    for p in paths or HOSTED_RUNNER_BLOAT:
        if Path(p).exists():
            runner.run(["sudo", "rm", "-rf", p] if os.geteuid() != 0 else ["rm", "-rf", p], check=False)
    after = free_gb()
    print(f"free disk: {before:.1f} GB -> {after:.1f} GB")
    return after


STATIC_LAYERS = ["resolve", "contract", "toolchain"]


def _write_report(report: Any, path: Path) -> Path:
    write_atomic(path, report.model_dump_json(indent=2))
    print(f"wrote {path}: {'FAILED probes' if report.failed else 'all probes pass or skip'}")
    return path


def runtime_in_image(stack_name: str, arch: str, out: Path) -> Path:
    """The runtime layer where it belongs: inside the stack's own image, on the runner's GPU. The report
    comes back on stdout (the container's filesystem is read-only and mounts nothing writable from here)."""
    from rlstack.core.options import argv_for
    from rlstack.host import containers
    from rlstack.matrix.schema import read_report
    from rlstack.probes.commands import probe

    stack = stacks.load_stack(stack_name)
    image = containers.ready_image(stack)
    argv = argv_for(probe, {"stack": stack_name, "layer": "runtime", "gpu_arch": arch, "json_": True})
    proc = runner.run(containers.run_command(containers.spec_for(stack, image, argv), containers.engine.client()),
                      capture=True, check=False)
    start = proc.stdout.find("{")
    if start < 0:
        raise RlstackError(f"the runtime probe in {image} printed no report (exit {proc.returncode})",
                           (proc.stderr or "")[-2000:] or None)
    out.write_text(proc.stdout[start:])
    read_report(out)  # validate before anything merges it
    print(f"wrote {out}")
    return out


def probe_job(stack: str, arch: str, out_dir: Path, *, strict: bool = False, in_image: bool = True) -> int:
    """What one gpu-probes job does for (stack, arch): the static layers natively, the runtime layer in the
    stack's image on the runner's GPU (`in_image=False`: natively, e.g. a machine without Docker), each
    written as JSON under `out_dir`. A failing probe is evidence, not a broken job: the reports are written
    and the job passes, unless `strict` (the canary), where a failure keeps the other jobs from starting."""
    from rlstack.matrix.schema import read_report
    from rlstack.probes import suite

    out_dir.mkdir(parents=True, exist_ok=True)
    if arch in ("", "none"):
        report = suite.run(stack)
        _write_report(report, out_dir / f"probe-{stack}-none.json")
        return 1 if strict and report.failed else 0
    static = suite.run(stack, layers=STATIC_LAYERS, gpu_arch=arch)
    _write_report(static, out_dir / f"probe-{stack}-{arch}-static.json")
    runtime_path = out_dir / f"probe-{stack}-{arch}-runtime.json"
    if in_image:
        runtime_in_image(stack, arch, runtime_path)
        failed = read_report(runtime_path).failed
    else:
        runtime = suite.run(stack, layers=["runtime"], gpu_arch=arch)
        _write_report(runtime, runtime_path)
        failed = runtime.failed
    return 1 if strict and (static.failed or failed) else 0


def merge_probe_results(results_dir: Path, matrix_file: Path | None = None) -> int:
    """The gpu-probes merge job: every probe JSON under `results_dir` into compat_matrix.yaml, then render."""
    from rlstack.host.docs import publish_matrix

    files = sorted(results_dir.rglob("*.json"))
    if not files:
        raise RlstackError(f"no probe results (*.json) under {results_dir}", "did the probe jobs upload artifacts?")
    return publish_matrix(files, matrix_file)
