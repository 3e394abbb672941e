"""What a runtime probe actually ran on: the interpreter, torch's build, the CUDA toolkit, and how the
installed packages differ from the stack's lock.

Runtime results are evidence about an *environment*, and the lock only names the one we meant. Inside a
stack image the two agree (the build fails otherwise), but a native run on a GPU host (a lent machine without
Docker, a user's workstation) imports whatever that Python has. So every runtime report records the
versions it found, the lock packages that are missing or differ, and a fingerprint of all that: matrix rows
from different environments never merge, and a row measured off-lock says so instead of passing for the
image. Everything here reads package metadata and files; nothing imports torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from rlstack.core.pkgnames import installed_versions, normalize, public_version
from rlstack.probes.model import Environment
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack

TOOLKIT_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc-cu13")


def _torch_cuda(version: str | None) -> str | None:
    """torch.version.cuda, read from torch/version.py of the distribution that would be imported."""
    if version is None:
        return None
    try:
        files = md.files("torch") or []
    except md.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/") == "torch/version.py":
            try:
                text = Path(str(f.locate())).read_text()
            except OSError:
                return None
            m = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
            return m[1] if m else None
    return None


def _nvcc_on_path() -> str | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], text=True, capture_output=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m[1] if m else None


def toolkit(installed: dict[str, str]) -> tuple[str | None, str]:
    """The nvcc a JIT build here would use, and where it comes from: the pinned wheel when one is installed
    (flashinfer looks there first), else the nvcc on PATH."""
    for name in TOOLKIT_PACKAGES:
        if name in installed:
            return installed[name], f"{name} wheel"
    found = _nvcc_on_path()
    return (found, "nvcc on PATH") if found else (None, "no nvcc")


def deviations(locked: dict[str, LockedPackage], installed: dict[str, str]) -> list[str]:
    """Lock pins that this environment does not satisfy: 'name X (lock Y)' or 'name missing (lock Y)'.
    A local label alone (2.11.0+cu130 for 2.11.0) is not a deviation: torch's CUDA build is checked apart."""
    out = []
    for name, pkg in sorted(locked.items()):
        have = installed.get(name)
        if have is None:
            out.append(f"{name} missing (lock {pkg.version})")
        elif public_version(have) != public_version(pkg.version):
            out.append(f"{name} {have} (lock {pkg.version})")
    return out


def fingerprint(python: str, torch_cuda: str | None, locked: dict[str, LockedPackage],
                installed: dict[str, str]) -> str:
    """Same environment, same fingerprint: the interpreter, torch's CUDA build and the installed version of
    every locked package (what the probes could have imported from the stack)."""
    parts = [f"python={python}", f"torch_cuda={torch_cuda}"]
    parts += [f"{n}={installed.get(n, '-')}" for n in sorted(locked)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def capture(stack: Stack, locked: dict[str, LockedPackage], installed: dict[str, str] | None = None) -> Environment:
    installed = installed_versions() if installed is None else installed
    python = ".".join(map(str, sys.version_info[:3]))
    torch = installed.get("torch")
    torch_cuda = _torch_cuda(torch)
    devs = deviations(locked, installed)
    if ".".join(python.split(".")[:2]) != stack.python:
        devs.insert(0, f"python {python} (stack {stack.python})")
    if torch is not None and stack.torch.cuda and torch_cuda != stack.torch.cuda:
        devs.insert(0, f"torch CUDA {torch_cuda or 'none'} (stack {stack.torch.cuda})")
    tk, tk_from = toolkit(installed)
    if stack.cuda_toolkit and tk != stack.cuda_toolkit.version:
        devs.append(f"nvcc {tk or 'missing'} from {tk_from} (stack {stack.cuda_toolkit.version})")
    in_image = os.environ.get("RLSTACK_STACK") == stack.name
    versions = {n: installed.get(normalize(n), "missing") for n in ("torch", *stack.key_packages)}
    return Environment(where="image" if in_image else "native", python=python, executable=sys.executable,
                       torch=torch, torch_cuda=torch_cuda, toolkit=tk, toolkit_from=tk_from, versions=versions,
                       lock_match=not devs, deviations=devs,
                       fingerprint=fingerprint(python, torch_cuda, locked, installed))
