"""What a lock is: the parser of a stack's hash-locked requirements, its identity (the hash of its bytes), and
when it is stale.

A lock starts with a header that records a hash of everything resolution depends on (the stack's Python
and platform, the pins stack.toml owns, requirements.in, rlstack's own dependencies). `check` recomputes
that hash: a lock is stale exactly when an input changed, and the message names the stack and the fix.
Writing locks (uv) is rlstack.stacks.resolver's.

This module is the one home of the lock-file parser (`parse_locked`); every other reader of a lock imports it
from here, except rlstack/scripts/image_checks.py, which runs by path in the image build before rlstack is
installed and keeps a standard-library copy.

The image's build backend (hatchling, pyproject's [build-system]) has its own hash-locked file,
images/build-backend.lock, checked here with the stacks' locks.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from rlstack.core import pkgnames
from rlstack.core.errors import LockError, StaleLockError
from rlstack.core.paths import project_root
from rlstack.stacks.model import Stack

HEADER_RE = re.compile(r"^# rlstack-lock: (?P<fields>.*)$", re.M)
# One entry of a uv/pip-compile lock: 'name==version [; marker] \' and its '--hash=sha256:...' continuation
# lines. rlstack/scripts/image_checks.py has a standard-library copy of this pattern (PIN_RE); keep the two in step.
ENTRY_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)"
    r"(?:[ \t]*;(?P<marker>[^\\\n]*))?"
    r"(?P<body>(?:[^\n]*\\\n)*[^\n]*)",
    re.M,
)
HASH_RE = re.compile(r"--hash=sha256:([0-9a-f]{64})")
BUILD_BACKEND_LOCK = "build-backend.lock"


@dataclass(frozen=True)
class LockedPackage:
    """One pin of a lock: the version, every sha256 the lock allows for it, and its environment marker (None
    when it applies everywhere; image_checks does not require a marked pin to be installed)."""

    name: str
    version: str
    hashes: frozenset[str]
    marker: str | None = None


def parse_locked(text: str) -> dict[str, LockedPackage]:
    """{normalized name: LockedPackage} for every pin of a lock's text."""
    out: dict[str, LockedPackage] = {}
    for m in ENTRY_RE.finditer(text):
        name = pkgnames.normalize(m["name"])
        marker = (m["marker"] or "").strip() or None
        out[name] = LockedPackage(name, m["version"], frozenset(HASH_RE.findall(m["body"])), marker)
    return out


def parse_pins(text: str) -> dict[str, str]:
    """{normalized name: version} of a lock's text (parse_locked without the hashes)."""
    return {name: pkg.version for name, pkg in parse_locked(text).items()}


def locked_packages(stack: Stack) -> dict[str, LockedPackage]:
    """The stack's lock, parsed."""
    return parse_locked(stack.lock_file.read_text())


def locked_versions(stack: Stack) -> dict[str, str]:
    """{normalized package name: version} from the stack's lock."""
    return {name: pkg.version for name, pkg in locked_packages(stack).items()}


def project_dependencies(root: Path | None = None) -> list[str]:
    """rlstack's own runtime dependencies: installed into every image, so part of every lock."""
    data = tomllib.loads(((root or project_root()) / "pyproject.toml").read_text())
    return list(data["project"].get("dependencies", []))


def resolver_input(stack: Stack) -> list[str]:
    """Every requirement the resolver sees for this stack, in a stable order."""
    return [*stack.top_level, *stack.derived_pins(), *project_dependencies(stack.folder.parent.parent)]


def inputs_hash(stack: Stack) -> str:
    payload = {
        "python": stack.python,
        "platform": stack.platform,
        "requirements": resolver_input(stack),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def lock_hash(stack: Stack) -> str:
    """Identity of the resolved environment: the hash of the lock file's bytes."""
    if not stack.lock_file.is_file():
        raise LockError(
            f"{stack.lock_file}: no lock for stack '{stack.name}'", f"run: invoke lock --stack {stack.name}"
        )
    return hashlib.sha256(stack.lock_file.read_bytes()).hexdigest()


def read_header(text: str) -> dict[str, str]:
    m = HEADER_RE.search(text)
    if not m:
        return {}
    return dict(part.split("=", 1) for part in m.group("fields").split() if "=" in part)


def check_lock_consistency(stack: Stack) -> None:
    """The lock must hold the torch and CUDA build that stack.toml names: a resolver cannot pick another
    torch, but PyPI's torch decides its CUDA runtime, and a hand-edited lock can say anything."""
    versions = locked_versions(stack)
    got = versions.get("torch")
    if got != stack.torch.version:
        raise LockError(f"{stack.lock_file}: torch is {got}, stack.toml says {stack.torch.version}")
    if stack.torch.cuda:
        runtime = versions.get("nvidia-cuda-runtime-cu12") or versions.get("nvidia-cuda-runtime")
        got_cuda = ".".join(runtime.split(".")[:2]) if runtime else None
        if got_cuda != stack.torch.cuda:
            raise LockError(
                f"{stack.lock_file}: torch {got} brings CUDA runtime {got_cuda}, stack.toml says torch.cuda = "
                f"'{stack.torch.cuda}'",
                f"set [torch] cuda = \"{got_cuda}\" in {stack.stack_file}, or pick the torch that is built for it",
            )


def check(stack: Stack) -> None:
    """Raise StaleLockError when the lock is missing or was made from other inputs. The build backend's lock
    is checked with it: every stack's image builds rlstack with that backend."""
    fix = f"run: invoke lock --stack {stack.name}   (then commit {stack.lock_file.name})"
    if not stack.lock_file.is_file():
        raise StaleLockError(f"stack '{stack.name}': {stack.lock_file} is missing", fix)
    header = read_header(stack.lock_file.read_text())
    if not header:
        raise StaleLockError(f"stack '{stack.name}': {stack.lock_file} has no rlstack-lock header", fix)
    want = inputs_hash(stack)
    if header.get("inputs") != want:
        raise StaleLockError(
            f"stack '{stack.name}': lock is stale: requirements.in, stack.toml (python/platform/torch/toolkit) "
            f"or rlstack's dependencies changed since {stack.lock_file.name} was made",
            fix,
        )
    check_lock_consistency(stack)
    check_build_backend(stack.folder.parent.parent)


# The build backend. The image installs rlstack from its source folder, which runs pyproject's build backend
# (hatchling); left to itself the installer fetches whatever hatchling is newest, unhashed, at build time.
# images/build-backend.lock pins it and its dependencies with hashes, for every platform and every Python
# rlstack supports (a universal resolution from requires-python's floor), and images/Dockerfile installs
# it with --require-hashes into a throwaway environment that builds rlstack's wheel without build isolation.


def build_backend_lock_file(root: Path | None = None) -> Path:
    return (root or project_root()) / "images" / BUILD_BACKEND_LOCK


def _pyproject(root: Path | None) -> dict[str, object]:
    return tomllib.loads(((root or project_root()) / "pyproject.toml").read_text())


def build_requirements(root: Path | None = None) -> list[str]:
    """pyproject's [build-system] requires, each pinned with '==' (the lock must build what `pip install .`
    builds with, so the pin lives in pyproject and the lock follows it)."""
    system = _pyproject(root).get("build-system")
    requires = list(system.get("requires", [])) if isinstance(system, dict) else []
    if not requires:
        raise LockError("pyproject.toml: [build-system] requires is empty", "requires = [\"hatchling==X.Y.Z\"]")
    for line in requires:
        try:
            spec = Requirement(line).specifier
        except InvalidRequirement as exc:
            raise LockError(f"pyproject.toml: [build-system] requires '{line}': {exc}") from None
        if len(spec) != 1 or next(iter(spec)).operator != "==":
            raise LockError(f"pyproject.toml: [build-system] requires '{line}' is not pinned with '=='",
                            "pin the build backend (the image installs it hash-locked from images/build-backend.lock)")
    return requires


def build_backend_python(root: Path | None = None) -> str:
    """The lowest Python rlstack supports (requires-python '>=3.11' -> '3.11'): the floor of the universal
    resolution, so the lock fits every stack's Python."""
    project = _pyproject(root).get("project")
    requires_python = str(project.get("requires-python", "")) if isinstance(project, dict) else ""
    m = re.search(r">=\s*(\d+\.\d+)", requires_python)
    if not m:
        raise LockError(f"pyproject.toml: requires-python '{requires_python}' has no '>=3.X' floor",
                        "set requires-python = \">=3.11\" (the build backend's lock is resolved from it)")
    return m[1]


def build_backend_inputs_hash(root: Path | None = None) -> str:
    payload = {"python": build_backend_python(root), "platform": "universal", "requirements": build_requirements(root)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def build_backend_is_fresh(root: Path | None = None) -> bool:
    """False when check_build_backend finds anything that writing the lock again would fix."""
    try:
        check_build_backend(root)
    except LockError:
        return False
    return True


def check_build_backend(root: Path | None = None) -> None:
    """Raise StaleLockError when images/build-backend.lock is missing or was made from other build
    requirements; LockError when it does not hold the version pyproject pins."""
    path = build_backend_lock_file(root)
    fix = f"run: invoke lock   (then commit {path.parent.name}/{path.name})"
    if not path.is_file():
        raise StaleLockError(f"{path} is missing (the image builds rlstack with the build backend it locks)", fix)
    text = path.read_text()
    if read_header(text).get("inputs") != build_backend_inputs_hash(root):
        raise StaleLockError(
            f"{path} is stale: pyproject.toml's [build-system] requires or requires-python changed", fix)
    locked = parse_pins(text)
    for line in build_requirements(root):
        req = Requirement(line)
        want = next(iter(req.specifier)).version
        got = locked.get(pkgnames.normalize(req.name))
        if got != want:
            raise LockError(f"{path}: {req.name} is {got}, pyproject.toml's [build-system] pins {want}", fix)
