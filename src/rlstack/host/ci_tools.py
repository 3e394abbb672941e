"""Small CI chores that workflows call through invoke, so no logic lives only in YAML."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from rlstack.core.errors import RlstackError
from rlstack.host import runner

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
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(report.model_dump_json(indent=2))
    os.replace(tmp, path)
    print(f"wrote {path}: {'FAILED probes' if report.failed else 'all probes pass or skip'}")
    return path


def runtime_in_image(stack_name: str, arch: str, out: Path) -> Path:
    """The runtime layer where it belongs: inside the stack's own image, on the runner's GPU. The report
    comes back on stdout (the container's filesystem is read-only and mounts nothing writable from here)."""
    from rlstack import matrix
    from rlstack.host import containers, engine, images, stacks

    stack = stacks.load_stack(stack_name)
    tag = images.ensure_built(images.plan(stack))
    spec = containers.spec_for(stack, tag, ["probe", "--stack", stack_name, "--layer", "runtime",
                                            "--gpu-arch", arch, "--json"])
    info = engine.engine_info()
    if spec.gpus:
        engine.require_nvidia_runtime(info)
    proc = runner.run(containers.run_command(spec, engine.client()), capture=True, check=False)
    start = proc.stdout.find("{")
    if start < 0:
        raise RlstackError(f"the runtime probe in {tag} printed no report (exit {proc.returncode})",
                           (proc.stderr or "")[-2000:] or None)
    out.write_text(proc.stdout[start:])
    matrix.read_report(out)  # validate before anything merges it
    print(f"wrote {out}")
    return out


def probe_job(stack: str, arch: str, out_dir: Path, *, strict: bool = False, in_image: bool = True) -> int:
    """What one gpu-probes job does for (stack, arch): the static layers natively, the runtime layer in the
    stack's image on the runner's GPU (`in_image=False`: natively, e.g. a machine without Docker), each
    written as JSON under `out_dir`. A failing probe is evidence, not a broken job: the reports are written
    and the job passes, unless `strict` (the canary), where a failure keeps the other jobs from starting."""
    from rlstack import matrix
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
        failed = matrix.read_report(runtime_path).failed
    else:
        runtime = suite.run(stack, layers=["runtime"], gpu_arch=arch)
        _write_report(runtime, runtime_path)
        failed = runtime.failed
    return 1 if strict and (static.failed or failed) else 0


def merge_probe_results(results_dir: Path, matrix_file: Path | None = None) -> int:
    """The gpu-probes merge job: every probe JSON under `results_dir` into compat_matrix.yaml, then render."""
    from rlstack import matrix

    files = sorted(results_dir.rglob("*.json"))
    if not files:
        raise RlstackError(f"no probe results (*.json) under {results_dir}", "did the probe jobs upload artifacts?")
    path = matrix_file or matrix.matrix_path()
    merged = matrix.merge(files, path)
    print(f"merged {len(files)} result file(s) into {path} ({len(merged.rows)} rows)")
    for p in matrix.render(merged, readme=True):
        print(f"wrote {p}")
    return 0
