"""Build-time assertions for an image: run inside `docker build` right after the locked environment is
installed, so a wrong torch, a missing GPU arch or a silently changed package fails the build, not a
training run hours later.

This file runs by path (`python image_checks.py ...`) before rlstack itself is installed in the image,
so it imports nothing but the standard library (torch only inside the function that checks it). That is
why it keeps its own small copies of three helpers that have one home elsewhere in the project: the name
normaliser (rlstack.core.pkgnames.normalize), the lock parser (rlstack.stacks.locks.parse_locked) and the
reader of installed versions (rlstack.core.pkgnames.installed_versions). Keep them in step.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

# Mirrors rlstack.stacks.locks.ENTRY_RE (stdlib copy: see the module docstring).
PIN_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)(?P<marker>\s*;[^\\\n]*)?", re.M)
# Installed by uv venv / the image itself, never part of a stack's lock.
NOT_LOCKED = frozenset({"rlstack", "pip", "setuptools", "wheel"})


def normalize(name: str) -> str:
    """PEP 503 name. Stdlib copy of rlstack.core.pkgnames.normalize (see the module docstring)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def base_version(version: str) -> str:
    """'2.10.0+cu128' -> '2.10.0': the local part is the wheel's CUDA tag, checked separately."""
    return version.split("+", 1)[0]


def parse_lock(text: str) -> tuple[dict[str, str], set[str]]:
    """({package: version}, {packages whose pin carries an environment marker}). Stdlib copy of
    rlstack.stacks.locks.parse_locked (versions and markers only; see the module docstring)."""
    pins: dict[str, str] = {}
    conditional: set[str] = set()
    for m in PIN_RE.finditer(text):
        name = normalize(m["name"])
        pins[name] = m["version"]
        if m["marker"]:
            conditional.add(name)
    return pins, conditional


def installed_versions(dists: Iterable[md.Distribution] | None = None) -> dict[str, str]:
    """{normalized name: version} of the image's environment. Stdlib copy of
    rlstack.core.pkgnames.installed_versions (see the module docstring); the image has one site-packages,
    so which of two same-named distributions wins does not arise here."""
    out: dict[str, str] = {}
    for d in dists if dists is not None else md.distributions():
        name = d.metadata["Name"]
        if name:
            out[normalize(name)] = d.version
    return out


def check_environment(pins: dict[str, str], conditional: set[str], installed: dict[str, str]) -> list[str]:
    """Every problem that makes the installed set differ from the lock, one line each."""
    problems = []
    for name, want in sorted(pins.items()):
        got = installed.get(name)
        if got is None:
            if name not in conditional:
                problems.append(f"{name}=={want} is in the lock but not installed")
        elif got != want:
            problems.append(f"{name} is {got}, the lock pins {want} (something upgraded or replaced it)")
    for name, got in sorted(installed.items()):
        if name not in pins and name not in NOT_LOCKED:
            problems.append(f"{name}=={got} is installed but not in the lock")
    return problems


def check_torch(torch_version: str, torch_cuda: str | None, gpu_archs: Sequence[str]) -> list[str]:
    """torch's version and CUDA build as stack.toml says; every stack arch compiled into torch.

    The compiled arch list is read with torch._C._cuda_getArchFlags(), which needs no GPU (the public
    torch.cuda.get_arch_list() returns [] when no device is present, as in a build)."""
    import torch

    problems = []
    got = base_version(torch.__version__)
    if got != torch_version:
        problems.append(f"torch is {torch.__version__}, stack.toml says torch.version = '{torch_version}'")
    got_cuda = torch.version.cuda
    if got_cuda != torch_cuda:
        problems.append(
            f"torch is built for CUDA {got_cuda or 'none (CPU-only)'}, stack.toml says torch.cuda = "
            f"'{torch_cuda or 'null'}'"
        )
    if gpu_archs:
        flags = torch._C._cuda_getArchFlags() if torch_cuda and hasattr(torch._C, "_cuda_getArchFlags") else ""
        compiled = set(str(flags or "").split())
        missing = [a for a in gpu_archs if a not in compiled]
        if missing:
            problems.append(
                f"torch {torch.__version__} has no kernels for {', '.join(missing)} "
                f"(compiled: {' '.join(sorted(compiled)) or 'none'}); drop the arch from gpu_archs or pick a torch "
                "built for it"
            )
    return problems


# What torch.compile's inductor imports to build its C++ wrappers (torch/_inductor/cpp_builder.py); cpp_extension
# imports setuptools at module level, which no uv venv has unless the lock does: Unsloth's compiled GRPO loss then
# fails at the first step (seen running the portable image on an H100, never natively, where the host's answered)
COMPILE_MODULES = ("torch.utils.cpp_extension",)


def check_compile_imports(importer: Callable[[str], object] = importlib.import_module) -> list[str]:
    """The modules torch.compile needs import in this environment (GPU stacks: their training compiles)."""
    problems = []
    for module in COMPILE_MODULES:
        try:
            importer(module)
        except ImportError as exc:
            problems.append(
                f"{module} cannot be imported ({exc}): torch.compile (inductor) imports it on a GPU stack's "
                f"training path; add the missing package to the stack's requirements.in and re-lock"
            )
    return problems


def run_checks(
    *, torch_version: str, torch_cuda: str | None, gpu_archs: Sequence[str], lock_text: str,
    installed: dict[str, str] | None = None,
) -> list[str]:
    pins, conditional = parse_lock(lock_text)
    if not pins:
        return ["the lock has no pinned packages"]
    problems = check_environment(pins, conditional, installed if installed is not None else installed_versions())
    problems += check_torch(torch_version, torch_cuda, gpu_archs)
    if gpu_archs:
        problems += check_compile_imports()
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--torch-version", required=True)
    p.add_argument("--torch-cuda", default="none", help="torch.version.cuda, or 'none' for a CPU-only torch")
    p.add_argument("--gpu-archs", default="", help="comma- or space-separated, e.g. sm_90,sm_120")
    p.add_argument("--lock", required=True, type=Path)
    p.add_argument("--stack", default="?")
    args = p.parse_args(argv)
    cuda = None if args.torch_cuda in ("", "none", "null") else args.torch_cuda
    archs = [a for a in re.split(r"[,\s]+", args.gpu_archs) if a]
    problems = run_checks(
        torch_version=args.torch_version, torch_cuda=cuda, gpu_archs=archs, lock_text=args.lock.read_text()
    )
    if problems:
        print(f"rlstack image check failed for stack '{args.stack}':", file=sys.stderr)
        for line in problems:
            print(f"  - {line}", file=sys.stderr)
        print(f"  -> fix images/{args.stack}/stack.toml or re-lock: invoke lock --stack {args.stack}", file=sys.stderr)
        return 1
    print(
        f"rlstack image check ok for stack '{args.stack}': torch {args.torch_version} (CUDA {cuda or 'none'}), "
        f"archs {' '.join(archs) or '-'}, environment == lock"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
