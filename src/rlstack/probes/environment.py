"""What a runtime probe actually ran on: the interpreter, torch's build, the CUDA toolkit its JIT compilers
find, and how the installed packages differ from the stack's lock.

Runtime results are evidence about an *environment*, and the lock only names the one we meant. Inside a
stack image the two agree (the build fails otherwise), but a native run on a GPU host (a lent machine without
Docker, a user's workstation) imports whatever that Python has. So every runtime report records the
versions it found, the lock packages that are missing or differ, and a fingerprint of all that: matrix rows
from different environments never merge, and a row measured off-lock says so instead of passing for the
image. Everything here reads package metadata and files; nothing imports torch.

The toolkit is the one FlashInfer's JIT finds (find_cuda_home), not the one the lock installs: pip's nvcc wheel
puts nothing on PATH, so natively a GPU host's own /usr/local/cuda answers, and an image finds the lock's nvcc
only through the CUDA_HOME it sets. Anything else is a deviation, even at the same version.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import posixpath
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rlstack.core.pkgnames import installed_versions, normalize, public_version
from rlstack.probes.model import Environment
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack


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


DEFAULT_CUDA_HOME = "/usr/local/cuda"  # FlashInfer's (and torch's) last guess


@dataclass(frozen=True)
class Found:
    """What a JIT compiler's toolkit lookup answers: the folder (None where FlashInfer's get_cuda_path() raises),
    how it was found, the nvcc it would run (None where that file is not there) and that nvcc's version."""

    home: str | None
    how: str
    nvcc: str | None = None
    version: str | None = None

    def where(self) -> str:
        """'<home>/bin/nvcc (CUDA_HOME=...)', or where the lookup found no nvcc."""
        if self.nvcc is not None:
            return f"{self.nvcc} ({self.how})"
        if self.home is None:
            return f"no nvcc: {self.how}"
        return f"no nvcc at {posixpath.join(self.home, 'bin/nvcc')} ({self.how})"

    def describe(self) -> str:
        """Where the toolkit came from, for a report; without an nvcc, what FlashInfer then reads."""
        return self.where() if self.nvcc is not None else f"{self.where()}; FlashInfer reads torch.version.cuda"


def find_cuda_home(env: Mapping[str, str], which: Callable[[str, str | None], str | None],
                   exists: Callable[[str], bool]) -> tuple[str | None, str]:
    """(CUDA home, how it was found) as FlashInfer's get_cuda_path() finds it (flashinfer/jit/cpp_ext.py,
    0.6.8.post1 and 0.7.1), in its order: CUDA_HOME or CUDA_PATH (an empty CUDA_HOME counts as unset, an empty
    CUDA_PATH does not: `a or b`, then `is not None`); else `which nvcc`, whose grandparent folder it takes; else
    /usr/local/cuda when it exists; else None (get_cuda_path raises, and get_cuda_version() silently returns
    torch.version.cuda). torch.utils.cpp_extension's _find_cuda_home looks in the same order on Linux.

    Given the environment, a `which(name, PATH)` and an `exists(path)`, so that the same lookup runs here and
    over a model of an image (rlstack.probes.toolchain.Image)."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home is not None:
        name = "CUDA_HOME" if env.get("CUDA_HOME") else "CUDA_PATH"
        return home, f"{name}={home}"
    nvcc = which("nvcc", env.get("PATH"))
    if nvcc:
        return posixpath.dirname(posixpath.dirname(nvcc)), f"no CUDA_HOME; `which nvcc` = {nvcc}"
    if exists(DEFAULT_CUDA_HOME):
        return DEFAULT_CUDA_HOME, f"no CUDA_HOME, no nvcc on PATH; {DEFAULT_CUDA_HOME} exists"
    return None, f"no CUDA_HOME or CUDA_PATH, no nvcc on PATH, no {DEFAULT_CUDA_HOME}"


def nvcc_version(nvcc: str) -> str | None:
    """The full version an nvcc reports ('13.0.88' from 'release 13.0, V13.0.88'); None when it does not run."""
    try:
        out = subprocess.run([nvcc, "--version"], text=True, capture_output=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m[1] if m else None


def jit_toolkit(env: Mapping[str, str] | None = None) -> Found:
    """The toolkit FlashInfer's JIT would use in this process's environment (find_cuda_home over the real
    PATH and filesystem), with the version its <home>/bin/nvcc reports."""
    env = os.environ if env is None else env
    home, how = find_cuda_home(env, lambda name, path: shutil.which(name, path=path), os.path.exists)
    if home is None:
        return Found(None, how)
    nvcc = posixpath.join(home, "bin/nvcc")
    version = nvcc_version(nvcc) if os.path.isfile(nvcc) else None
    return Found(home, how, nvcc if version else None, version)


def toolkit(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The nvcc version a JIT build here would use and where it comes from, found the way FlashInfer's JIT
    finds it (jit_toolkit). Not the pinned wheel: a wheel FlashInfer does not look in compiles nothing."""
    found = jit_toolkit(env)
    return found.version, found.describe()


def wheel_nvcc(package: str) -> Path | None:
    """The real path of the nvcc that the installed distribution `package` (stack.toml [cuda_toolkit] package)
    installed, or None when it is not installed or has none."""
    try:
        files = md.files(package) or []
    except md.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/").endswith("/bin/nvcc"):
            return Path(str(f.locate())).resolve()
    return None


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


def toolkit_deviation(stack: Stack, found: Found, pinned: Path | None) -> str | None:
    """How the toolkit the JIT finds departs from the stack's: none at all, another version, or the same version
    from somewhere else (a GPU host's own /usr/local/cuda is not the pinned wheel, whatever its version).
    `pinned` is the real path of the stack's wheel's nvcc here (wheel_nvcc), None when it is not installed."""
    tk = stack.cuda_toolkit
    if tk is None:
        return None
    if found.nvcc is None:
        return f"nvcc missing: {found.describe()} (stack {tk.package} {tk.version})"
    if found.version != tk.version:
        return f"nvcc {found.version} from {found.describe()} (stack {tk.package} {tk.version})"
    if pinned is None or Path(found.nvcc).resolve() != pinned:
        return f"nvcc {found.version} from {found.describe()}, not the stack's {tk.package} wheel"
    return None


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
    found = jit_toolkit()
    tk, tk_from = found.version, found.describe()
    if stack.cuda_toolkit:
        dev = toolkit_deviation(stack, found, wheel_nvcc(stack.cuda_toolkit.package))
        if dev:
            devs.append(dev)
    in_image = os.environ.get("RLSTACK_STACK") == stack.name
    versions = {n: installed.get(normalize(n), "missing") for n in ("torch", *stack.key_packages)}
    return Environment(where="image" if in_image else "native",
                       image=os.environ.get("RLSTACK_IMAGE") or None if in_image else None,
                       python=python, executable=sys.executable,
                       torch=torch, torch_cuda=torch_cuda, toolkit=tk, toolkit_from=tk_from, versions=versions,
                       lock_match=not devs, deviations=devs,
                       fingerprint=fingerprint(python, torch_cuda, locked, installed))
