"""invoke tasks for rlstack. Each task parses its arguments and calls one library function; the library
prints every external command before it runs it. `invoke --list` shows them all, `invoke --help TASK`
shows a task's options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from invoke import Context, Exit, task

sys.path.insert(0, "src")  # so `invoke` works from a checkout before `pip install -e .`

from rlstack.core.errors import RlstackError


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn RlstackError into a one-paragraph message and the error's exit code, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            rc = fn(*args, **kwargs)
        except RlstackError as exc:
            raise Exit(f"rlstack: error: {exc}", code=exc.exit_code) from None
        if isinstance(rc, int) and rc != 0:
            raise Exit(code=rc)
        return rc

    return wrapper


def _cli(*argv: str) -> int:
    from rlstack.cli import main

    return main([a for a in argv if a])


# --- foundation: stacks and locks ------------------------------------------------------------------


@task(help={"stack": "one stack or a comma-separated list (default: all)", "json": "machine-readable output"})
@friendly
def stacks(c: Context, stack: str = "", json: bool = False) -> int:
    """List the stacks with their key versions (read from stack.toml and the locks)."""
    return _cli("stacks", *(["--stack", stack] if stack else []), "--json" if json else "")


@task(help={"stack": "one stack or a comma-separated list (default: all)",
            "check": "exit non-zero when a lock is stale against stack.toml/requirements.in"})
@friendly
def lock(c: Context, stack: str = "", check: bool = False) -> int:
    """Resolve each stack with uv for its platform into images/<stack>/requirements.lock (with hashes)."""
    return _cli("lock", *(["--stack", stack] if stack else []), "--check" if check else "")


@task(help={"check": "fail when a generated README section is out of date instead of rewriting it"})
@friendly
def docs(c: Context, check: bool = False) -> int:
    """Regenerate the README sections that are derived from data (the stacks table)."""
    from rlstack.host import docs as docs_mod

    if check:
        stale = docs_mod.stale_sections()
        if stale:
            raise Exit(f"README sections out of date: {', '.join(stale)}; run: invoke docs", code=1)
        return 0
    print(f"wrote {docs_mod.render_readme()}")
    return 0


# --- images and containers (issue: images) ----------------------------------------------------------

_IMAGE_HELP = {
    "stack": "stack name (images/<stack>/stack.toml); default cpu",
    "base_image": "override the stack's base_image (default: $RLSTACK_BASE_IMAGE, else stack.toml)",
    "ca_cert": "CA bundle for a TLS-intercepting proxy, passed as a BuildKit secret (default: $RLSTACK_CA_CERT)",
}


def _image_flags(stack: str, base_image: str, ca_cert: str) -> list[str]:
    return ["--stack", stack, *(["--base-image", base_image] if base_image else []),
            *(["--ca-cert", ca_cert] if ca_cert else [])]


@task(help={**_IMAGE_HELP, "no_cache": "rebuild every layer", "force": "build even when the content tag exists",
            "buildx": "use `docker buildx build --load` (CI)", "cache": "remote BuildKit cache: gha (needs --buildx)"})
@friendly
def build(c: Context, stack: str = "cpu", base_image: str = "", ca_cert: str = "", no_cache: bool = False,
          force: bool = False, buildx: bool = False, cache: str = "") -> int:
    """Build rlstack/<stack>:<hash12> and :latest with BuildKit; skipped when the content tag exists."""
    return _cli("image", "build", *_image_flags(stack, base_image, ca_cert), "--no-cache" if no_cache else "",
                "--force" if force else "", "--buildx" if buildx else "", *(["--cache", cache] if cache else []))


@task(name="smoke-image", help=_IMAGE_HELP)
@friendly
def smoke_image(c: Context, stack: str = "cpu", base_image: str = "", ca_cert: str = "") -> int:
    """Run the built image: `rlstack --version`, then the build-time checks again inside the final image."""
    return _cli("image", "smoke", *_image_flags(stack, base_image, ca_cert))


@task(name="image-size", help=_IMAGE_HELP)
@friendly
def image_size(c: Context, stack: str = "cpu", base_image: str = "", ca_cert: str = "") -> int:
    """Print the image's size; fail when it is over the stack's max_image_gb."""
    return _cli("image", "size", *_image_flags(stack, base_image, ca_cert))


@task(help={**_IMAGE_HELP, "registry": "registry prefix, e.g. ghcr.io/OWNER"})
@friendly
def push(c: Context, registry: str, stack: str = "cpu", base_image: str = "", ca_cert: str = "") -> int:
    """Push rlstack/<stack>:<hash12> as <registry>/rlstack-<stack>:<hash12> and :latest."""
    return _cli("image", "push", *_image_flags(stack, base_image, ca_cert), "--registry", registry)


@task(iterable=["set"],
      help={**_IMAGE_HELP, "recipe": "recipe file or name (host files are mounted read-only)",
            "set": "override a recipe field, KEY=VALUE (repeatable)",
            "data": "training data (file, gsm8k, generated:N)",
            "resume": "continue from the run's last checkpoint", "adapter_name": "adapter name in the volume"})
@friendly
def train(c: Context, stack: str = "cpu", recipe: str = "", set: list[str] | None = None, data: str = "",
          resume: bool = False, adapter_name: str = "", base_image: str = "", ca_cert: str = "") -> int:
    """Train in the stack's container: adapters land in the rlstack-adapters volume (GPU stacks: --gpus all)."""
    extra = [*(["--data", data] if data else []), *(["--adapter-name", adapter_name] if adapter_name else []),
             *(["--resume"] if resume else [])]
    return _cli("image", "train", *_image_flags(stack, base_image, ca_cert),
                *(["--recipe", recipe] if recipe else []),
                *[a for o in (set or []) for a in ("--set", o)], *(["--", *extra] if extra else []))


@task(name="eval",
      help={**_IMAGE_HELP, "adapter": "adapter name in the rlstack-adapters volume (mounted read-only)",
            "backend": "hf or vllm", "n": "number of questions"})
@friendly
def eval_(c: Context, stack: str = "cpu", adapter: str = "", backend: str = "", n: int = 0, base_image: str = "",
          ca_cert: str = "") -> int:
    """Evaluate an adapter from the volume in the stack's container (adapters mounted read-only)."""
    extra = [*(["--backend", backend] if backend else []), *(["-n", str(n)] if n else [])]
    return _cli("image", "eval", *_image_flags(stack, base_image, ca_cert),
                *(["--adapter", adapter] if adapter else []), *(["--", *extra] if extra else []))


@task(help=_IMAGE_HELP)
@friendly
def shell(c: Context, stack: str = "cpu", base_image: str = "", ca_cert: str = "") -> int:
    """An interactive bash in the stack's container with the adapters, HF cache and runs volumes."""
    return _cli("image", "shell", *_image_flags(stack, base_image, ca_cert))


# --- payload: training and evaluation (issue: payload) ----------------------------------------------


@task(help={"base": "results.json of the base model (from rlstack eval)",
            "tuned": "results.json of the tuned adapter, on the same questions",
            "json": "machine-readable output", "iters": "bootstrap resamples (default 10000)"})
@friendly
def compare(c: Context, base: str, tuned: str, json: bool = False, iters: int = 10_000) -> int:
    """Paired base-vs-tuned comparison: delta, exact McNemar p-value, bootstrap CI, per-question flips."""
    return _cli("compare", base, tuned, "--iters", str(iters), "--json" if json else "")


@task(help={**_IMAGE_HELP, "local": "list a folder on this machine instead of the volume (e.g. runs/adapters)",
            "verify": "also check every file's sha256", "json": "machine-readable output"})
@friendly
def adapters(c: Context, stack: str = "cpu", local: str = "", verify: bool = False, json: bool = False,
             base_image: str = "", ca_cert: str = "") -> int:
    """List the adapters in the rlstack-adapters volume (name, base model, stack, date, metrics); --local DIR
    lists a folder instead (where `invoke smoke` and native `rlstack train` write)."""
    flags = ["--verify" if verify else "", "--json" if json else ""]
    if local:
        return _cli("adapters", "--root", local, *flags)
    return _cli("image", "adapters", *_image_flags(stack, base_image, ca_cert), *flags)


@task(help={"no_lock_check": "skip checking that images/cpu/requirements.lock is current",
            "steps": "override the smoke recipe's grpo.max_steps", "name": "adapter name (default: smoke-cpu-<time>)"})
@friendly
def smoke(c: Context, no_lock_check: bool = False, steps: int = 0, name: str = "") -> int:
    """The main job on a fresh machine without a GPU: lock check, tiny GRPO run on 2 CPU cores, eval of the
    adapter and of its base, and their paired comparison."""
    from rlstack.host.smoke import run_smoke

    return run_smoke(lock_check=not no_lock_check, steps=steps, name=name)


# --- probes and the compat matrix (issue: probes) ---------------------------------------------------


@task(help={"stack": "stack name (required)", "gpu_arch": "target GPU arch, e.g. sm_120 (default: each of the stack's)",
            "layer": "comma-separated layers: resolve,contract,toolchain,runtime (default: all)",
            "json": "print the report as JSON", "output": "also write the JSON report to this file",
            "with_stack": "also check co-installing with these stacks (comma-separated)",
            "suggest": "search nearby versions for a combination that passes the static probes",
            "max_candidates": "bound of the --suggest search", "fresh": "ignore cached resolutions",
            "runtime_probes": "only these runtime probes, comma-separated (default: all)"})
@friendly
def probe(c: Context, stack: str, gpu_arch: str = "", layer: str = "", json: bool = False, output: str = "",
          with_stack: str = "", suggest: bool = False, max_candidates: int = 12, fresh: bool = False,
          runtime_probes: str = "") -> int:
    """Run a stack's probes; prints a table (or JSON) and exits non-zero when a probe fails."""
    return _cli("probe", "--stack", stack, *(["--gpu-arch", gpu_arch] if gpu_arch else []),
                *(["--layer", layer] if layer else []), "--json" if json else "", *(["-o", output] if output else []),
                *(["--with", with_stack] if with_stack else []), "--suggest" if suggest else "",
                "--max-candidates", str(max_candidates), "--fresh" if fresh else "",
                *(["--runtime-probes", runtime_probes] if runtime_probes else []))


@task(name="probe-fp8",
      help={"gpu_arch": "target GPU arch (default sm_120, the report's RTX 5090)",
            "layer": "comma-separated layers (default: all)", "json": "print the report as JSON",
            "output": "also write the JSON report to this file",
            "suggest": "search nearby versions for a combination that passes the static probes",
            "max_candidates": "bound of the --suggest search", "fresh": "ignore cached resolutions"})
@friendly
def probe_fp8(c: Context, gpu_arch: str = "sm_120", layer: str = "", json: bool = False, output: str = "",
              suggest: bool = False, max_candidates: int = 12, fresh: bool = False) -> int:
    """The report's FP8 RL question end to end: every layer for the fp8 stack, then a verdict naming each wall."""
    return _cli("probe-fp8", "--gpu-arch", gpu_arch, *(["--layer", layer] if layer else []), "--json" if json else "",
                *(["-o", output] if output else []), "--suggest" if suggest else "",
                "--max-candidates", str(max_candidates), "--fresh" if fresh else "")


@task(name="native-stage", iterable=["skip"],
      help={"stack": "stack name (required)", "host_packages": "the GPU host's 'pip list --format=json' output",
            "python": "the GPU host's Python, e.g. 3.12", "skip": "NAME[:why] of a locked package the probes do not "
            "need there (repeatable)", "keep_host": "comma-separated packages whose host copy stays",
            "out": "output folder (default .stage/STACK)", "part_mb": "largest part in MiB (default 55)"})
@friendly
def native_stage(c: Context, stack: str, host_packages: str, python: str, skip: list[str] | None = None,
                 keep_host: str = "", out: str = "", part_mb: int = 55) -> int:
    """Stage a stack's locked wheels (sha256-checked) in parts for a GPU host with no Docker and no network."""
    return _cli("native-stage", "--stack", stack, "--host-packages", host_packages, "--python", python,
                *[a for s in skip or [] for a in ("--skip", s)], *(["--keep-host", keep_host] if keep_host else []),
                *(["--out", out] if out else []), "--part-mb", str(part_mb))


@task(help={"log": "the log file to read (- for stdin)", "json": "machine-readable output"})
@friendly
def diagnose(c: Context, log: str, json: bool = False) -> int:
    """Name the known walls in any log (signatures.yaml): the wall, why, and the fix. Exits 1 when one matches."""
    return _cli("diagnose", log, "--json" if json else "")


@task(help={"results": "comma-separated probe JSON files to merge (rlstack probe --json -o FILE)",
            "check": "only validate compat_matrix.yaml", "no_readme": "do not rewrite the README section"})
@friendly
def matrix(c: Context, results: str = "", check: bool = False, no_readme: bool = False) -> int:
    """Merge probe results into compat_matrix.yaml; render the README section and docs/compat_matrix.html."""
    return _cli("matrix", *[r for r in results.split(",") if r], "--check" if check else "",
                "--no-readme" if no_readme else "")


# --- CI (issue: CI) ---------------------------------------------------------------------------------


@task(name="ci-matrix",
      help={"kind": "images | gpu-probes | canary | all", "stack": "restrict to these stacks (comma-separated)",
            "github_output": "also append matrix=JSON to this file ($GITHUB_OUTPUT in a workflow)"})
@friendly
def ci_matrix(c: Context, kind: str = "all", stack: str = "", github_output: str = "") -> int:
    """Print the CI matrix JSON the workflows consume (computed from the stack files only)."""
    return _cli("ci-matrix", "--kind", kind, *(["--stack", stack] if stack else []),
                *(["--github-output", github_output] if github_output else []))

@task(name="probe-job",
      help={"stack": "stack name", "gpu_arch": "the runner's GPU arch label, or 'none' on a CPU runner",
            "out": "folder for the probe JSON (uploaded as the job's artifact)",
            "strict": "fail the job when a probe fails (the canary)",
            "native": "run the runtime layer natively instead of inside the stack's image"})
@friendly
def probe_job(c: Context, stack: str, gpu_arch: str = "none", out: str = "probe-results", strict: bool = False,
              native: bool = False) -> int:
    """One gpu-probes job: static layers natively, the runtime layer in the stack's image, JSON for the merge."""
    from pathlib import Path

    from rlstack.host.ci_tools import probe_job as run_probe_job

    return run_probe_job(stack, gpu_arch, Path(out), strict=strict, in_image=not native)


@task(name="ci-merge-probes",
      help={"results": "folder holding the downloaded probe JSON artifacts",
            "matrix_file": "matrix file (default: compat_matrix.yaml)"})
@friendly
def ci_merge_probes(c: Context, results: str = "probe-results", matrix_file: str = "") -> int:
    """The gpu-probes merge job: every probe JSON into compat_matrix.yaml, README section and HTML page."""
    from pathlib import Path

    from rlstack.host.ci_tools import merge_probe_results

    return merge_probe_results(Path(results), Path(matrix_file) if matrix_file else None)


@task(name="ci-free-disk", help={"force": "run even outside GitHub Actions (deletes system folders)"})
@friendly
def ci_free_disk(c: Context, force: bool = False) -> None:
    """Free disk on a hosted GitHub runner before a CUDA image build."""
    from rlstack.host.ci_tools import free_disk

    free_disk(force=force)


# --- benchmarks (issue: GPU performance) ------------------------------------------------------------


_BENCH_SCRIPTS = {"rollout": "bench/rollout_generation.py", "grpo": "bench/grpo_step.py",
                  "eval": "bench/eval_throughput.py", "e2e": "bench/payload_e2e.py"}


@task(help={"only": "comma-separated subset of: rollout, grpo, eval, e2e (default: all)",
            "smoke": "tiny model on the CPU to check the scripts (results go to /tmp, not bench/results)",
            "args": "extra arguments passed to every script, e.g. '--completion 64'"})
@friendly
def bench(c: Context, only: str = "", smoke: bool = False, args: str = "") -> int:
    """Run the GPU benchmarks (rollout tokens/s, GRPO step, eval throughput, the payload end to end); each writes
    bench/results/*.json + .md."""
    import os
    import shlex

    from rlstack.host.runner import run

    names = [n for n in (only.split(",") if only else _BENCH_SCRIPTS) if n]
    unknown = sorted(set(names) - set(_BENCH_SCRIPTS))
    if unknown:
        raise Exit(f"rlstack: error: unknown benchmark(s) {unknown}; choose from {sorted(_BENCH_SCRIPTS)}", code=2)
    env = {"RLSTACK_BENCH_SMOKE": "1" if smoke else os.environ.get("RLSTACK_BENCH_SMOKE", "0")}
    rc = 0
    for name in names:
        rc = rc or run([sys.executable, _BENCH_SCRIPTS[name], *shlex.split(args)], env=env, check=False).returncode
    return rc

# --- development ------------------------------------------------------------------------------------


@task(help={"no_docker": "skip the Docker tests (they also skip by themselves when no engine answers)",
            "gpu": "also run the GPU tests (needs CUDA)", "k": "pytest -k expression",
            "fast": "skip the slow tests (training, network)"})
@friendly
def test(c: Context, no_docker: bool = False, gpu: bool = False, k: str = "", fast: bool = False) -> int:
    """Lint, then the test suite: unit, slow (CPU training) and Docker tests; --gpu adds the GPU tests."""
    from rlstack.host.devtools import run_tests

    return run_tests(docker=not no_docker, gpu=gpu, keyword=k, fast=fast)


@task
@friendly
def lint(c: Context) -> int:
    """ruff over src, tests, bench and tasks.py."""
    from rlstack.host.devtools import lint as run_lint

    return run_lint()


@task
@friendly
def typecheck(c: Context) -> int:
    """mypy over src/rlstack."""
    from rlstack.host.devtools import typecheck as run_mypy

    return run_mypy()
