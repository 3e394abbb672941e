"""Stack -> image: the build args, tag and `docker build` command for images/Dockerfile, all derived from
stack.toml and the lock, and `ensure_built`, which builds only when the content tag is missing.

The tag `rlstack/<stack>:<hash12>` hashes what the image is made of: the Dockerfile, .dockerignore, every
file the build context sends (lock, stack files, recipes, rlstack's source) and the base image name. The
same inputs give the same tag, so a rebuild is skipped; any change gives a new tag. The git revision and
build time are labels only: they do not change the tag.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlstack.core import runner
from rlstack.core.errors import DockerError, RlstackError
from rlstack.core.paths import project_root
from rlstack.core.pkgnames import normalize
from rlstack.host import engine
from rlstack.stacks import locks, settings
from rlstack.stacks.model import Stack

REPO = "rlstack"
# What the build context sends (see /.dockerignore, an allow-list of the same entries).
CONTEXT_ENTRIES = ("pyproject.toml", "README.md", "images", "recipes", "src")
IGNORED_PARTS = {"__pycache__", ".DS_Store"}
SOURCE_URL = "https://github.com/rlstack/rlstack"


def dockerfile(root: Path | None = None) -> Path:
    return (root or project_root()) / "images" / "Dockerfile"


def context_files(root: Path | None = None) -> list[Path]:
    """Every file the build context holds, sorted, as paths relative to root."""
    base = root or project_root()
    out: list[Path] = []
    for entry in CONTEXT_ENTRIES:
        p = base / entry
        if p.is_file():
            out.append(Path(entry))
        elif p.is_dir():
            for f in p.rglob("*"):
                rel = f.relative_to(base)
                if f.is_file() and not (IGNORED_PARTS & set(rel.parts)) and f.suffix != ".pyc":
                    out.append(rel)
    return sorted(out)


def copy_context(dst: Path, root: Path | None = None) -> Path:
    """Copy the build context (what .dockerignore lets through) to `dst`: tests and benchmarks build from a
    copy, so editing a source file there never touches the checkout."""
    base = root or project_root()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for entry in (*CONTEXT_ENTRIES, ".dockerignore"):
        src = base / entry
        if src.is_dir():
            shutil.copytree(src, dst / entry, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dst / entry)
    return dst


def content_hash(stack: Stack, base_image: str, root: Path | None = None) -> str:
    base = root or project_root()
    h = hashlib.sha256()
    h.update(f"stack={stack.name}\0base={base_image}\0".encode())
    extra = [Path(".dockerignore")] if (base / ".dockerignore").is_file() else []
    for rel in sorted({*context_files(base), *extra}):
        h.update(rel.as_posix().encode() + b"\0")
        h.update(hashlib.sha256((base / rel).read_bytes()).digest())
    return h.hexdigest()


def key_package_versions(stack: Stack) -> dict[str, str]:
    versions = locks.locked_versions(stack)
    return {p: versions[normalize(p)] for p in stack.key_packages if normalize(p) in versions}


def git_revision(root: Path | None = None) -> str:
    """HEAD's commit, '+dirty' when tracked files differ; 'unknown' outside a git checkout."""
    base = str(root or project_root())
    try:
        rev = subprocess.run(["git", "-C", base, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", base, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def build_args(stack: Stack, base_image: str, *, git_rev: str = "unknown", created: str = "") -> dict[str, str]:
    """The Dockerfile's ARGs for this stack; the only place stack.toml meets the Dockerfile."""
    keys = key_package_versions(stack)
    return {
        "BASE_IMAGE": base_image,
        "PYTHON": stack.python,
        "STACK": stack.name,
        "TORCH_VERSION": stack.torch.version,
        "TORCH_CUDA": stack.torch.cuda or "none",
        "GPU_ARCHS": ",".join(stack.gpu_archs),
        "NVIDIA_VISIBLE_DEVICES": "all" if stack.gpu_required else "void",
        **toolkit_args(stack),
        "LOCK_HASH": locks.lock_hash(stack),
        "KEY_PACKAGES": " ".join(f"{k}=={v}" for k, v in keys.items()),
        "GIT_REV": git_rev,
        "CREATED": created,
        "SOURCE": SOURCE_URL,
    }


def toolkit_args(stack: Stack) -> dict[str, str]:
    """The CUDA toolkit folder's ARGs (images/Dockerfile, rlstack.scripts.cuda_toolkit), and the Debian packages
    the JIT compilers of a GPU stack call at run time (a compiler; Python's headers, for Triton's launcher)."""
    jit = "g++ python3-dev" if stack.gpu_required else ""
    tk = stack.cuda_toolkit
    if tk is None:
        return {"CUDA_TOOLKIT_PACKAGE": "", "CUDA_TOOLKIT_VERSION": "", "CUDA_HOME": "", "JIT_TOOLS": jit}
    return {"CUDA_TOOLKIT_PACKAGE": tk.package, "CUDA_TOOLKIT_VERSION": tk.version, "CUDA_HOME": tk.home,
            "JIT_TOOLS": jit}


@dataclass(frozen=True)
class BuildPlan:
    stack: Stack
    base_image: str
    tag: str  # rlstack/<stack>:<hash12>
    latest: str  # rlstack/<stack>:latest
    args: Mapping[str, str]
    ca_cert: Path | None = None
    no_cache: bool = False
    root: Path = field(default_factory=project_root)
    buildx: bool = False  # `docker buildx build --load` (CI's setup-buildx) instead of the built-in BuildKit
    cache: str | None = None  # 'gha': BuildKit cache in GitHub Actions (needs buildx)


def plan(
    stack: Stack, *, base_image: str | None = None, ca_cert: Path | str | None = None, no_cache: bool = False,
    root: Path | None = None, git_rev: str | None = None, created: str | None = None, repo: str | None = None,
    buildx: bool = False, cache: str | None = None,
) -> BuildPlan:
    """Everything a build needs; `repo` names the image repository (tests use their own, so they never
    move a user's rlstack/<stack>:latest)."""
    base = root or project_root()
    image = base_image or settings.base_image(stack.base_image)  # the machine's setting, else stack.toml's
    if cache not in (None, "", "gha"):
        raise RlstackError(f"unknown build cache {cache!r}", "the only remote cache is 'gha' (GitHub Actions)")
    if cache and not buildx:
        raise RlstackError("--cache gha needs --buildx", "pass --buildx (CI sets up buildx first)")
    cert = Path(ca_cert) if ca_cert else settings.ca_cert()
    if cert is not None and not cert.is_file():
        src = "--ca-cert" if ca_cert else settings.lookup("ca_cert").source
        raise RlstackError(f"CA bundle {cert} does not exist (from {src})",
                           "pass --ca-cert PATH, or set it once: invoke settings --ca-cert PATH")
    digest = content_hash(stack, image, base)
    args = build_args(
        stack, image, git_rev=git_rev if git_rev is not None else git_revision(base),
        created=created if created is not None else datetime.now(UTC).isoformat(timespec="seconds"),
    )
    repo = repo or REPO
    tag = f"{repo}/{stack.name}:{digest[:12]}"
    args["IMAGE"] = tag  # RLSTACK_IMAGE inside: runtime reports say which image they ran in
    return BuildPlan(stack=stack, base_image=image, tag=tag,
                     latest=f"{repo}/{stack.name}:latest", args=args, ca_cert=cert, no_cache=no_cache, root=base,
                     buildx=buildx, cache=cache or None)


def build_command(p: BuildPlan, exe: str = "docker") -> list[str]:
    """`docker build` for a plan: BuildKit (the caller sets DOCKER_BUILDKIT=1), host network (so a proxy
    or a local mirror on the host is reachable), the CA bundle as a secret, never as a file in a layer."""
    # buildx's container driver refuses --network host without an extra entitlement; CI needs no host proxy.
    net = [] if p.buildx else ["--network", "host"]
    cmd = [exe, *(["buildx", "build", "--load"] if p.buildx else ["build"]), "--progress", "plain", *net,
           "-f", str(dockerfile(p.root)), "-t", p.tag, "-t", p.latest]
    for k, v in p.args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    if p.ca_cert is not None:
        cmd += ["--secret", f"id=ca,src={p.ca_cert}"]
    if p.no_cache:
        cmd.append("--no-cache")
    if p.cache == "gha":
        scope = f"rlstack-{p.stack.name}"
        cmd += ["--cache-from", f"type=gha,scope={scope}", "--cache-to", f"type=gha,mode=max,scope={scope}"]
    cmd.append(str(p.root))
    return cmd


DISK_HINT = ("free space: 'docker builder prune' drops BuildKit's cache, 'docker image prune' old images; "
             "or move Docker's data-root to a larger disk")


def build_space_gb(stack: Stack) -> float:
    """Free disk below which a build is refused up front: one image's worth (the stack's size limit). A cold
    build peaks higher (build-stage venv + runtime copy + export: about 2.5x the 8 GB cpu image here), but
    a warm cache needs far less, so this only catches the hopeless case; a build that still fills the disk
    is recognised afterwards."""
    return stack.max_image_gb


def disk_problem(path: str, need_gb: float, usage: Callable[[str], Any] | None = None) -> str | None:
    """A message when `path` has less than `need_gb` free (or cannot be read), else None."""
    try:
        free = (usage or shutil.disk_usage)(path).free / 1e9
    except OSError:
        return None  # Docker's root is not visible from here (remote engine): let the build speak
    if free < need_gb:
        return f"only {free:.1f} GB free under {path}, and this build needs about {need_gb:.0f} GB"
    return None


def ensure_built(p: BuildPlan, *, force: bool = False) -> str:
    """Build the plan's image unless its content tag exists; return the tag. Checks the engine, BuildKit
    and the base image first, so each failure has its own message."""
    info = engine.engine_info()
    if not force and not p.no_cache and engine.image_exists(p.tag):
        print(f"rlstack: {p.tag} is up to date (same lock, Dockerfile and source); not rebuilding")
        runner.run([engine.client(), "tag", p.tag, p.latest])
        return p.tag
    if p.buildx:
        engine.require_buildx()
    else:
        engine.require_buildkit(info)
    if not engine.image_exists(p.base_image) and not engine.pull(p.base_image):
        raise DockerError(
            f"the base image {p.base_image} is not present locally and cannot be pulled",
            "pass --base-image IMG (a local image or a registry mirror), or set it once for this machine: "
            "invoke settings --base-image IMG",
        )
    root = str(info.get("DockerRootDir") or "/var/lib/docker")
    need = build_space_gb(p.stack)
    problem = disk_problem(root, need)
    if problem:
        raise DockerError(problem, DISK_HINT)
    proc = runner.run(build_command(p, engine.client()), check=False, env=engine.build_env())
    if proc.returncode != 0:
        problem = disk_problem(root, 1.0)
        if problem:  # the build itself filled the disk: say so instead of pointing at the step above
            raise DockerError(f"docker build for stack '{p.stack.name}' failed: {problem}", DISK_HINT)
        raise DockerError(
            f"docker build for stack '{p.stack.name}' failed (exit {proc.returncode}); the failing step is above",
            "an 'rlstack image check failed' line means stack.toml and the installed environment disagree; "
            "a TLS error behind a proxy needs the CA bundle: invoke settings --ca-cert PATH (or --ca-cert PATH)",
        )
    return p.tag


def labels_of(ref: str) -> dict[str, str]:
    cfg = engine.inspect(ref).get("Config") or {}
    return dict(cfg.get("Labels") or {})


def size_bytes(ref: str) -> int:
    return int(engine.inspect(ref).get("Size") or 0)


def layer_digests(ref: str) -> list[str]:
    return list((engine.inspect(ref).get("RootFS") or {}).get("Layers") or [])


def require_built(p: BuildPlan) -> BuildPlan:
    """The plan, when its content tag exists; otherwise an error that says why it does not: never built, or
    built from another base image or source than this command's (the tag hashes both)."""
    engine.engine_info()
    if engine.image_exists(p.tag):
        return p
    hint = f"build it: invoke build --stack {p.stack.name}"
    if engine.image_exists(p.latest):
        other = labels_of(p.latest).get("io.rlstack.base-image")
        if other and other != p.base_image:
            raise DockerError(
                f"{p.tag} is not built: {p.latest} was built on base image {other}, this command uses "
                f"{p.base_image}",
                f"set the base image once for this machine: invoke settings --base-image {other}   (or build "
                f"on {p.base_image}: invoke build --stack {p.stack.name})")
        raise DockerError(f"{p.tag} is not built: {p.latest} is older (the lock, Dockerfile or source changed "
                          f"since)", hint)
    raise DockerError(f"{p.tag} is not built (no image of stack '{p.stack.name}' on this engine)", hint)


def check_size(p: BuildPlan) -> int:
    """The image's size in bytes; RlstackError when it exceeds the stack's max_image_gb."""
    size = size_bytes(p.tag)
    limit = p.stack.max_image_gb * 1e9
    print(f"{p.tag}: {size / 1e9:.2f} GB (limit {p.stack.max_image_gb:g} GB from {p.stack.stack_file.name})")
    if size > limit:
        raise RlstackError(
            f"{p.tag} is {size / 1e9:.2f} GB, over max_image_gb = {p.stack.max_image_gb:g}",
            f"find what grew (docker history {p.tag}) or raise max_image_gb in {p.stack.stack_file}",
        )
    return size


def push(p: BuildPlan, registry: str) -> str:
    """Push the content tag as <registry>/rlstack-<stack>:<hash12> (and :latest); returns the remote ref."""
    exe = engine.client()
    digest = p.tag.rsplit(":", 1)[1]
    remote = f"{registry.rstrip('/')}/{REPO}-{p.stack.name}"
    for tag in (digest, "latest"):
        runner.run([exe, "tag", p.tag, f"{remote}:{tag}"])
        runner.run([exe, "push", f"{remote}:{tag}"])
    return f"{remote}:{digest}"
