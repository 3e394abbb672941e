"""The tasks the workflows run under `invoke ci.`: the job matrices, a gpu-probes job and its merge, and disk
on a hosted runner. The jobs themselves are rlstack.host.ci."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from rlstack.host.commands.aliases import StackList, StackName


def ci_jobs(
    kind: Annotated[Literal["images", "gpu-probes", "canary", "all"], typer.Option(help="which job matrix")] = "all",
    stack: StackList = None,
    github_output: Annotated[str | None, typer.Option(help="also append NAME=JSON to this file ($GITHUB_OUTPUT in a "
                                                           "workflow)")] = None,
    output_name: Annotated[str, typer.Option(help="the NAME written with --github-output")] = "matrix",
) -> int:
    """Print the CI job matrix (JSON) a workflow consumes, computed from the stack files only."""
    from rlstack import stacks as stack_files
    from rlstack.host import ci

    text = ci.matrix_json(kind, stack_files.resolve_names(stack) if stack else None)
    print(text)
    if github_output:
        with open(github_output, "a") as fh:
            fh.write(f"{output_name}={text}\n")
    return 0


def probe_job(
    stack: StackName,
    gpu_arch: Annotated[str, typer.Option(help="the runner's GPU arch label, or 'none' on a CPU runner")] = "none",
    out: Annotated[str, typer.Option(help="folder for the probe JSON (the job's artifact)")] = "probe-results",
    strict: Annotated[bool, typer.Option(help="fail the job when a probe fails (the canary)")] = False,
    native: Annotated[bool, typer.Option(help="run the runtime layer natively instead of in the stack's "
                                              "image")] = False,
) -> int:
    """One gpu-probes job: static layers natively, the runtime layer in the stack's image, JSON for the merge."""
    from rlstack.host import ci

    return ci.probe_job(stack, gpu_arch, Path(out), strict=strict, in_image=not native)


def ci_merge_probes(
    results: Annotated[str, typer.Option(help="folder holding the downloaded probe JSON artifacts")] = "probe-results",
    matrix_file: Annotated[str | None, typer.Option(help="matrix file (default: compat_matrix.yaml)")] = None,
) -> int:
    """The gpu-probes merge job: every probe JSON into compat_matrix.yaml, the README section and HTML page."""
    from rlstack.host import ci

    return ci.merge_probe_results(Path(results), Path(matrix_file) if matrix_file else None)


def ci_free_disk(force: Annotated[bool, typer.Option(help="run even outside GitHub Actions (deletes system "
                                                         "folders)")] = False) -> int:
    """Free disk on a hosted GitHub runner before a CUDA image build."""
    from rlstack.host import ci

    ci.free_disk(force=force)
    return 0
