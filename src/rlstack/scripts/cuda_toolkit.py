"""The CUDA toolkit of a stack's image, assembled from its locked wheels: one folder (CUDA_HOME) with bin/nvcc,
include/ and lib64/, made of symlinks into site-packages.

Why: pip's CUDA wheels install under site-packages/nvidia/ (CUDA 12: one folder per component, e.g.
nvidia/cuda_nvcc/bin/nvcc beside nvidia/cuda_runtime/include; CUDA 13: one shared nvidia/cu13/{bin,include,lib})
and put nothing on PATH. The JIT compilers the stacks' libraries call look for one toolkit folder: FlashInfer
(flashinfer/jit/cpp_ext.py get_cuda_path) and torch.utils.cpp_extension take CUDA_HOME or CUDA_PATH, then
`which nvcc`, then /usr/local/cuda, and FlashInfer silently falls back to torch.version.cuda when it finds no
nvcc. So the image sets CUDA_HOME to the folder built here, from the wheels the lock pins and nothing else: the
layout is derived from the wheels' own file lists (cu12 and cu13 differ), never written by hand.

Standard library only: it runs by path inside `docker build` (with the stack's venv Python, so
importlib.metadata sees the stack's wheels), and the toolchain probe imports `plan` to model the same folder from
the locked wheels' file lists without building an image.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# The CUDA toolkit's own components as pip wheels (nvidia-cuda-*, the math libraries, nvJitLink, NVTX), with or
# without a -cuNN suffix. cuDNN, NCCL, cuSPARSELt, NVSHMEM and CUTLASS are separate products, never in a toolkit.
TOOLKIT_DIST = re.compile(
    r"^nvidia-(cuda-[a-z0-9-]+?|cublas|cufft|curand|cusolver|cusparse|cufile|nvjitlink|nvtx|npp[a-z]*|nvfatbin)"
    r"(-cu\d+)?$")
VERSIONED_SO = re.compile(r"^(?P<stem>lib[^/]+?\.so)\.\d+(\.\d+)*$")


class ToolkitError(Exception):
    """The wheels do not make a toolkit (no nvcc in the toolkit wheel, or no such wheel installed)."""


class NoCompiler(ToolkitError):
    """The toolkit wheel is installed but carries no nvcc (the CUDA 12 nvidia-cuda-nvcc-cu12 wheels hold ptxas,
    libNVVM and headers only): there is no toolkit folder to make, and a JIT that needs nvcc finds none."""


def normalize(name: str) -> str:
    """PEP 503 name. Stdlib copy of rlstack.core.pkgnames.normalize (this file runs with no rlstack installed)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Layout:
    """CUDA_HOME as {path inside it: site-packages-relative target}; a target may be a folder."""

    nvcc_package: str
    nvcc_root: str  # e.g. nvidia/cu13: the folder whose bin/nvcc this toolkit runs
    links: dict[str, str] = field(default_factory=dict)

    def resolve(self, path: str) -> str | None:
        """The site-packages-relative file a path inside CUDA_HOME reaches ('bin/nvcc' -> 'nvidia/cu13/bin/nvcc'),
        through folder links too; None when the folder has no such path."""
        parts = PurePosixPath(path).parts
        for cut in range(len(parts), 0, -1):
            target = self.links.get("/".join(parts[:cut]))
            if target is not None:
                return "/".join((target, *parts[cut:]))
        return None


def plan(dists: Mapping[str, Iterable[str]], nvcc_package: str) -> Layout:
    """The toolkit folder for these installed distributions ({name: site-packages-relative files}).

    bin/ and nvvm/ are nvcc's own (nvcc finds cicc and libdevice through its real path, nvcc.profile's TOP);
    include/ and lib64/ merge every toolkit wheel's include/ and lib/ entries, nvcc's first; a shared library
    present only as libX.so.N also gets the libX.so a linker's -lX needs."""
    files = {normalize(n): [f.replace("\\", "/") for f in fs] for n, fs in dists.items()}
    nvcc_package = normalize(nvcc_package)
    if nvcc_package not in files:
        raise ToolkitError(f"{nvcc_package} is not installed: the stack's toolkit wheel is missing from the lock")
    roots = [f[: -len("/bin/nvcc")] for f in files[nvcc_package] if re.fullmatch(r"nvidia/[^/]+/bin/nvcc", f)]
    if not roots:
        bins = sorted(f.rsplit("/", 1)[-1] for f in files[nvcc_package] if "/bin/" in f)
        raise NoCompiler(f"{nvcc_package} carries no nvcc (its bin/: {', '.join(bins) or 'nothing'})")
    nvcc_root = roots[0]
    links: dict[str, str] = {"bin": f"{nvcc_root}/bin"}
    owned = [f for n, fs in sorted(files.items(), key=lambda kv: kv[0] != nvcc_package)
             if TOOLKIT_DIST.match(n) for f in fs]
    if any(f.startswith(f"{nvcc_root}/nvvm/") for f in files[nvcc_package]):
        links["nvvm"] = f"{nvcc_root}/nvvm"
    for f in owned:
        m = re.fullmatch(r"(nvidia/[^/]+)/(include|lib)/([^/]+)(/.*)?", f)
        if not m:
            continue
        root, kind, entry, rest = m.groups()
        here = f"{'include' if kind == 'include' else 'lib64'}/{entry}"
        links.setdefault(here, f"{root}/{kind}/{entry}")
        if kind == "lib" and not rest:
            so = VERSIONED_SO.match(entry)
            if so:
                links.setdefault(f"lib64/{so['stem']}", f"{root}/lib/{entry}")
    return Layout(nvcc_package=nvcc_package, nvcc_root=nvcc_root, links=links)


def installed_files() -> tuple[dict[str, list[str]], Path]:
    """{name: site-packages-relative files} of this Python's distributions, and their site-packages folder."""
    dists: dict[str, list[str]] = {}
    site: Path | None = None
    for d in md.distributions():
        name = d.metadata["Name"]
        if not name:
            continue
        dists[normalize(name)] = [str(f) for f in d.files or []]
        if site is None and TOOLKIT_DIST.match(normalize(name)):
            site = Path(str(d.locate_file("")))
    if site is None:
        raise ToolkitError("no CUDA toolkit wheel is installed in this Python")
    return dists, site


def build(layout: Layout, site_packages: Path, home: Path) -> int:
    """Make the folder: every link absolute into site_packages. Refuses a home that already has content."""
    if home.exists() and any(home.iterdir()):
        raise ToolkitError(f"{home} exists and is not empty")
    for rel, target in sorted(layout.links.items()):
        dest = home / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        src = site_packages / target
        if not os.path.lexists(src):
            raise ToolkitError(f"{rel} -> {src}: the target is not installed")
        dest.symlink_to(src)
    return len(layout.links)


def nvcc_release(nvcc: Path) -> str | None:
    """'13.0' from `nvcc --version` ('release 13.0, V13.0.88'), as FlashInfer and torch read it."""
    try:
        out = subprocess.run([str(nvcc), "--version"], text=True, capture_output=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+\.\d+),", out)
    return m[1] if m else None


def lookups() -> dict[str, str]:
    """Each JIT compiler's own answer in this environment, from its own code: FlashInfer's get_cuda_path() and
    get_cuda_version(), torch.utils.cpp_extension's CUDA_HOME. Only for the libraries installed here."""
    found: dict[str, str] = {}
    if _installed("flashinfer-python"):
        from flashinfer.jit import cpp_ext

        try:
            found["flashinfer get_cuda_path()"] = str(cpp_ext.get_cuda_path())
        except RuntimeError as exc:  # its own error when it finds no toolkit at all
            found["flashinfer get_cuda_path()"] = f"error: {exc}"
        found["flashinfer get_cuda_version()"] = str(cpp_ext.get_cuda_version())
    if _installed("torch"):
        from torch.utils import cpp_extension

        found["torch.utils.cpp_extension.CUDA_HOME"] = str(cpp_extension.CUDA_HOME)
    return found


def _installed(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


KERNEL = """#include <cuda_runtime.h>
{extra}
__global__ void rlstack_probe(float* x) {{ {body} }}
"""
CUB_KERNEL = ("#include <cub/cub.cuh>",
              "typedef cub::BlockReduce<float, 128> R; __shared__ typename R::TempStorage t; "
              "float v = R(t).Sum(x[threadIdx.x]); if (threadIdx.x == 0) x[0] = v;")


def compile_probe(home: Path, archs: Iterable[str], workdir: Path) -> str | None:
    """Compile and link a kernel the way FlashInfer's JIT does (its -isystem folders, -lcudart from lib64), for
    each of the stack's archs; with CCCL's headers in the toolkit, a cub kernel as FlashInfer's sampling has.
    Needs no GPU. Returns nvcc's complaint, or None when it built."""
    has_cub = (home / "include" / "cccl" / "cub").is_dir() or (home / "include" / "cub").is_dir()
    extra, body = CUB_KERNEL if has_cub else ("", "x[threadIdx.x] += 1.0f;")
    src = workdir / "rlstack_probe.cu"
    src.write_text(KERNEL.format(extra=extra, body=body))
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    cmd = [str(home / "bin" / "nvcc"), "-shared", "-Xcompiler", "-fPIC", *gencode, "-isystem", str(home / "include"),
           "-isystem", str(home / "include" / "cccl"), str(src), f"-L{home / 'lib64'}", "-lcudart",
           "-o", str(workdir / "rlstack_probe.so")]
    try:
        proc = subprocess.run(cmd, text=True, capture_output=True, timeout=600, cwd=workdir)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{' '.join(cmd)}: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-4:]
        return f"nvcc could not build a {'cub ' if has_cub else ''}kernel for {' '.join(archs)}: " + " | ".join(tail)
    return None


def check(home: Path, version: str, found: Mapping[str, str], nvcc_says: str | None,
          compiler: str | None) -> list[str]:
    """Problems, one line each: every lookup must answer `home`, every version the pinned one's major.minor,
    and a host C++ compiler must be there (nvcc compiles host code with it; FlashInfer calls it by name)."""
    want = ".".join(version.split(".")[:2])
    problems = []
    if nvcc_says != want:
        problems.append(f"{home}/bin/nvcc reports CUDA {nvcc_says or 'nothing (not runnable)'}, stack.toml pins "
                        f"{version}")
    for what, got in found.items():
        expect = want if "version" in what else str(home)
        if got != expect:
            problems.append(f"{what} = {got}, expected {expect}")
    if compiler is None:
        problems.append("no host C++ compiler (c++) on PATH: nvcc and FlashInfer's JIT need one")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="make the toolkit folder from the installed wheels")
    b.add_argument("--package", required=True, help="the toolkit wheel (stack.toml [cuda_toolkit] package)")
    b.add_argument("--home", required=True, type=Path, help="the folder to make (the image's CUDA_HOME)")
    c = sub.add_parser("check", help="ask each JIT compiler where its toolkit is; fail unless it is this one")
    c.add_argument("--home", required=True, type=Path)
    c.add_argument("--version", required=True, help="stack.toml [cuda_toolkit] version")
    c.add_argument("--package", required=True, help="stack.toml [cuda_toolkit] package")
    c.add_argument("--stack", default="?")
    c.add_argument("--gpu-archs", default="", help="comma-separated: the compile check builds for each")
    args = p.parse_args(argv)
    if args.cmd == "check":
        if not (args.home / "bin" / "nvcc").exists():
            try:
                plan(installed_files()[0], args.package)
            except NoCompiler as exc:
                print(f"rlstack image check for stack '{args.stack}': {exc}; no toolkit folder, so a JIT that "
                      "needs nvcc finds none here (the toolchain probe reports it as a wall)")
                return 0
            except ToolkitError:
                pass
        found = lookups()
        problems = check(args.home, args.version, found, nvcc_release(args.home / "bin" / "nvcc"),
                         shutil.which(os.environ.get("CXX", "c++")))
        archs = [a for a in re.split(r"[,\s]+", args.gpu_archs) if a]
        if not problems and archs:
            with tempfile.TemporaryDirectory(prefix="rlstack-nvcc-") as tmp:
                complaint = compile_probe(args.home, archs, Path(tmp))
            if complaint:
                problems.append(complaint)
        if problems:
            print(f"rlstack image check failed for stack '{args.stack}' (CUDA toolkit):", file=sys.stderr)
            for line in problems:
                print(f"  - {line}", file=sys.stderr)
            print(f"  -> the toolkit folder comes from images/{args.stack}/stack.toml [cuda_toolkit]: see "
                  "rlstack.scripts.cuda_toolkit", file=sys.stderr)
            return 1
        print(f"rlstack image check ok for stack '{args.stack}': CUDA {args.version} at {args.home}; "
              + "; ".join(f"{k} = {v}" for k, v in found.items()))
        return 0
    try:
        dists, site = installed_files()
        layout = plan(dists, args.package)
        n = build(layout, site, args.home)
    except NoCompiler as exc:
        print(f"rlstack cuda toolkit: {exc}: no toolkit folder is made (a JIT that needs nvcc finds none)")
        return 0
    except ToolkitError as exc:
        print(f"rlstack cuda toolkit: {exc}", file=sys.stderr)
        return 1
    print(f"rlstack cuda toolkit: {args.home} = {n} links into {site} (nvcc from {layout.nvcc_root}/bin)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
