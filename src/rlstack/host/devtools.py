"""The project's own lint, type-check and test entry points, shared by `invoke`, the workflows and .ci/run.

`invoke test` runs the Docker tests too: they skip (with the reason) where no engine answers, and fail
instead when RLSTACK_REQUIRE_DOCKER=1 (set by .ci/run), so one command serves a laptop and CI.
"""

from __future__ import annotations

import sys

from rlstack.core import runner

LINT_PATHS = ["src", "tests", "bench", "tasks.py"]


def lint() -> int:
    runner.run([sys.executable, "-m", "ruff", "check", *LINT_PATHS])
    return 0


def typecheck() -> int:
    return runner.run([sys.executable, "-m", "mypy"], check=False).returncode


def pytest_command(*, docker: bool = True, gpu: bool = False, keyword: str = "", fast: bool = False) -> list[str]:
    excluded = [m for m, keep in (("docker", docker), ("gpu", gpu), ("slow", not fast)) if not keep]
    expr = " and ".join(f"not {m}" for m in excluded) or "docker or not docker"
    cmd = [sys.executable, "-m", "pytest", "-m", expr]
    if keyword:
        cmd += ["-k", keyword]
    return cmd


def run_tests(*, docker: bool = True, gpu: bool = False, keyword: str = "", fast: bool = False) -> int:
    """ruff, then pytest. pytest's 'no tests collected' (exit 5) is not a failure of the project."""
    lint()
    rc = runner.run(pytest_command(docker=docker, gpu=gpu, keyword=keyword, fast=fast), check=False).returncode
    return 0 if rc == 5 else rc


# Every benchmark the docs quote: bench/<name>.py, and what it measures (`invoke bench --help` lists them; each
# writes bench/results/*.json through rlstack.core.results, and `invoke docs` renders docs/performance.md).
BENCHMARKS: dict[str, str] = {
    "rollout_peers": "rollout engines side by side, tokens/s (subcommands prepare, run --stack S, merge DIR)",
    "rollout_generation": "GRPO rollout tokens/s: TRL's default generate against fastgen",
    "grpo_step": "one GRPO step, its time split into generation, scoring and the loss",
    "logit_chunk_compile": "cold torch.compile of Unsloth's GRPO log-softmax loop (copies) by rows and pieces",
    "payload_e2e": "rlstack train and rlstack eval end to end, generate against fastgen",
    "gpu_stacks": "per stack: rlstack train, then rlstack eval (subcommands model, train, eval, summarize)",
    "learning": "what training changed: rlstack train, then base and adapter evaluated and compared, paired",
    "eval_throughput": "greedy evaluation decoding at several batch sizes",
    "fastgen_fidelity": "fastgen against transformers' generate: greedy agreement, sampled KL",
    "fastgen_profile": "fastgen's decode step split into parts, ms per step",
    "attention_sweep": "fastgen's split-KV decode attention over launch shapes",
    "probe_fp8": "invoke probe-fp8, cold and warm, no GPU",
    "probe_mutation": "mutation testing of the probes' discovery: can each check fail?",
    "image_build": "image builds from an empty builder cache, and rebuilds",
    "jit_cold_start": "FlashInfer's JIT from a cold cache in a stack's image: the nvcc it ran, the build time",
    "image_staging": "GPU-host seconds to get a stack's image running on a host without Docker (from a lease's calls)",
    "rebuild_delta": "what an image adds to rootfs exports the GPU host holds (--previous): a rebuild, a second stack",
    "input_campaign": "bad inputs to every CPU command line: tracebacks, silent acceptances, data lost",
}


def bench(name: str, *, smoke: bool = False, args: str = "") -> int:
    """One benchmark script in its own process (they load models and CUDA), with this Python; its exit code."""
    import os
    import shlex

    from rlstack.core.errors import RlstackError
    from rlstack.core.paths import project_root

    key = name.replace("-", "_")
    if key not in BENCHMARKS:
        raise RlstackError(f"unknown benchmark {name!r}", f"choose one of: {', '.join(BENCHMARKS)}")
    env = {"RLSTACK_BENCH_SMOKE": "1" if smoke else os.environ.get("RLSTACK_BENCH_SMOKE", "0")}
    script = str(project_root() / "bench" / f"{key}.py")
    return runner.run([sys.executable, script, *shlex.split(args)], env=env, check=False).returncode
