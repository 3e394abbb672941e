"""What a lock is: the parser of a stack's hash-locked requirements, its identity (the hash of its bytes), and
when it is stale.

A lock starts with a header that records a hash of everything resolution depends on (the stack's Python
and platform, the pins stack.toml owns, requirements.in, rlstack's own dependencies). `check` recomputes
that hash: a lock is stale exactly when an input changed, and the message names the stack and the fix.
Writing locks (uv) is rlstack.stacks.resolver's.

The inputs hash says nothing about the lock's body, so a hand edit (a sha256 changed, a package line or a
whole block deleted, a version moved) would pass it. The writer therefore also records a digest of the
resolved set itself (`# rlstack-lock-digest:`, over every entry's normalised name, version, marker and
sha256s, not over comments or layout), and `check` recomputes it. A digest can say that the set changed but
not where; to name the edited line, `check` takes an optional reference: the same inputs re-resolved (the
resolver does it offline, from uv's cache), compared entry by entry.

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
from collections.abc import Callable
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
DIGEST_PREFIX = "# rlstack-lock-digest: sha256:"
DIGEST_RE = re.compile(r"^# rlstack-lock-digest: sha256:(?P<digest>[0-9a-f]{64})[ \t]*$", re.M)
BUILD_BACKEND_LOCK = "build-backend.lock"

# What re-resolves a lock's inputs to name an edit: (requirements, python, platform or None for universal, the
# lock's text) -> the lock text the resolver gives, or None when it cannot answer (no cache, no uv).
Reference = Callable[[list[str], str, str | None, str], str | None]


class EditedLockError(LockError):
    """A lock whose packages or hashes are not the set `invoke lock` wrote: edited by hand after it was
    written, or never written by it. Same exit code as LockError: the lock cannot be trusted as it is."""


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


def _entries(text: str) -> list[tuple[int, LockedPackage]]:
    """Every entry of a lock in file order with its line number, duplicates kept (a universal lock may pin one
    package twice, under two markers)."""
    out = []
    for m in ENTRY_RE.finditer(text):
        marker = (m["marker"] or "").strip() or None
        pkg = LockedPackage(pkgnames.normalize(m["name"]), m["version"], frozenset(HASH_RE.findall(m["body"])),
                            marker)
        out.append((text.count("\n", 0, m.start()) + 1, pkg))
    return out


def set_digest(text: str) -> str:
    """sha256 of a lock's resolved set: one normalised line per entry (name, version, marker, sorted sha256s),
    sorted, so uv's annotations, comments and layout do not count and every pin and hash does."""
    lines = sorted(f"{p.name}=={p.version};{p.marker or ''};{','.join(sorted(p.hashes))}" for _, p in _entries(text))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def digest_line(body: str) -> str:
    """The header line that seals `body` (a lock's entries, as the resolver wrote them)."""
    return f"{DIGEST_PREFIX}{set_digest(body)}\n"


def pins_only(text: str) -> str:
    """A lock's entries without their hashes (name==version ; marker), one a line: what the resolver is
    handed as preferences, so that every sha256 it writes comes from the index, never from the old file."""
    return "".join(f"{p.name}=={p.version}{f' ; {p.marker}' if p.marker else ''}\n" for _, p in _entries(text))


def stray_lines(text: str) -> list[str]:
    """Lines that belong to no entry and are no comment: a '--hash' line whose package line was deleted, or
    text a lock never holds."""
    covered = [(m.start(), m.end()) for m in ENTRY_RE.finditer(text)]
    out, pos = [], 0
    for number, line in enumerate(text.split("\n"), 1):
        start, pos = pos, pos + len(line) + 1
        if not line.strip() or line.lstrip().startswith("#") or any(a <= start < b for a, b in covered):
            continue
        what = "a sha256 with no package line above it (was that line deleted?)" if "--hash" in line else \
            "not part of any pin"
        out.append(f"line {number}: {line.strip()[:80]!r} is {what}")
    return out


def describe_edits(text: str, reference: str) -> list[str]:
    """Where a lock's entries differ from a reference resolution of the same inputs, each with the lock's line
    number (or the package, for one that is missing)."""
    have = {(p.name, p.marker): (n, p) for n, p in _entries(text)}
    want = {(p.name, p.marker): p for _, p in _entries(reference)}
    out = []
    for key, (line, p) in sorted(have.items(), key=lambda kv: kv[1][0]):
        ref = want.get(key)
        if ref is None:
            out.append(f"line {line}: {p.name}=={p.version} is not in the resolution of the stack's inputs")
        elif ref.version != p.version:
            out.append(f"line {line}: {p.name} is {p.version}, the resolution of the stack's inputs gives "
                       f"{ref.version}")
        else:
            for h in sorted(p.hashes - ref.hashes):
                at = next((i for i, ln in enumerate(text.split("\n"), 1) if h in ln), line)
                out.append(f"line {at}: {p.name}=={p.version}: sha256:{h} is not the hash of any file of that "
                           "release")
            if ref.hashes - p.hashes and not p.hashes - ref.hashes:
                out.append(f"line {line}: {p.name}=={p.version} lacks {len(ref.hashes - p.hashes)} of the sha256s "
                           "of that release's files (a hash line was deleted?)")
    for key, ref in sorted(want.items(), key=lambda kv: kv[0][0]):
        if key not in have:
            out.append(f"{ref.name}=={ref.version}: missing from the lock (its package line or block was deleted?)")
    return out


def verify_digest(path: Path, text: str, fix: str, reresolve: Callable[[], str | None] | None = None) -> None:
    """Raise EditedLockError unless the lock's entries are exactly the set its digest line seals. With
    `reresolve` (the same inputs resolved again, or None when that cannot be done) the error names the edited
    lines; without it, the lines that belong to no pin."""
    m = DIGEST_RE.search(text)
    if m is None:
        raise EditedLockError(f"{path}: not written by 'rlstack lock', or edited: it has no "
                              f"'{DIGEST_PREFIX}...' line sealing its pins and hashes", fix)
    stray = stray_lines(text)
    if m["digest"] == set_digest(text):
        if stray:  # the digest seals the entries only; pip reads every line, so text it cannot parse is an edit too
            raise EditedLockError(f"{path}: edited after 'invoke lock' wrote it: lines that are no pin, hash or "
                                  "comment\n  " + "\n  ".join(stray[:20]), fix)
        return
    found = stray
    reference = reresolve() if reresolve is not None else None
    if reference is not None:
        found += describe_edits(text, reference)
        if not found:
            found = ["every pin and sha256 matches a fresh resolution of its inputs: the digest line itself was "
                     "changed"]
    elif not found:
        found = ["(which line is not known: uv could not re-resolve the inputs offline from its cache; "
                 "'invoke lock --check' names the edit where it can)"]
    raise EditedLockError(f"{path}: edited after 'invoke lock' wrote it: its pins and sha256s do not match its "
                          "rlstack-lock-digest line\n  " + "\n  ".join(found[:20]), fix)


def parse_pins(text: str) -> dict[str, str]:
    """{normalized name: version} of a lock's text (parse_locked without the hashes)."""
    return {name: pkg.version for name, pkg in parse_locked(text).items()}


def locked_packages(stack: Stack) -> dict[str, LockedPackage]:
    """The stack's lock, parsed."""
    return parse_locked(read_lock_text(stack.lock_file, f"run: invoke lock --stack {stack.name}"))


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
        raise LockError(f"{stack.lock_file}: torch is {got or 'not pinned in it'}, stack.toml says "
                        f"{stack.torch.version}", f"run: invoke lock --stack {stack.name}   (a lock holds the torch "
                        "stack.toml names; edit stack.toml to change it)")
    if stack.torch.cuda:
        runtime = versions.get("nvidia-cuda-runtime-cu12") or versions.get("nvidia-cuda-runtime")
        got_cuda = ".".join(runtime.split(".")[:2]) if runtime else None
        if got_cuda != stack.torch.cuda:
            raise LockError(
                f"{stack.lock_file}: torch {got} brings CUDA runtime {got_cuda}, stack.toml says torch.cuda = "
                f"'{stack.torch.cuda}'",
                f"set [torch] cuda = \"{got_cuda}\" in {stack.stack_file}, or pick the torch that is built for it",
            )


def read_lock_text(path: Path, fix: str) -> str:
    """A lock's text; a file that is not UTF-8 text is no lock `invoke lock` wrote."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EditedLockError(f"{path}: not a lock: byte {exc.start} is not UTF-8 text", fix) from None
    except IsADirectoryError:
        raise EditedLockError(f"{path}: is a directory, not a lock file", fix) from None


def check_digest(stack: Stack, reference: Reference | None = None) -> None:
    """Raise EditedLockError when the stack's lock is not the set `invoke lock` sealed (see verify_digest)."""
    fix = f"run: invoke lock --stack {stack.name}   (rewrites it from its committed pins, with the index's hashes)"
    text = read_lock_text(stack.lock_file, fix)
    reresolve = (lambda: reference(resolver_input(stack), stack.python, stack.platform, text)) if reference else None
    verify_digest(stack.lock_file, text, fix, reresolve)


def check(stack: Stack, reference: Reference | None = None) -> None:
    """Raise StaleLockError when the lock is missing or was made from other inputs, EditedLockError when its
    pins and hashes are not the set its digest seals (`reference` re-resolves to name the edit), LockError when
    it does not hold stack.toml's torch. The build backend's lock is checked with it: every stack's image
    builds rlstack with that backend."""
    fix = f"run: invoke lock --stack {stack.name}   (then commit {stack.lock_file.name})"
    if not stack.lock_file.is_file():
        raise StaleLockError(f"stack '{stack.name}': {stack.lock_file} is missing", fix)
    header = read_header(read_lock_text(stack.lock_file, fix))
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
    check_digest(stack, reference)
    check_build_backend(stack.folder.parent.parent, reference)


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


def check_build_backend(root: Path | None = None, reference: Reference | None = None) -> None:
    """Raise StaleLockError when images/build-backend.lock is missing or was made from other build
    requirements; LockError when it does not hold the version pyproject pins; EditedLockError when its pins
    and hashes are not the set its digest seals."""
    path = build_backend_lock_file(root)
    fix = f"run: invoke lock   (then commit {path.parent.name}/{path.name})"
    if not path.is_file():
        raise StaleLockError(f"{path} is missing (the image builds rlstack with the build backend it locks)", fix)
    text = read_lock_text(path, fix)
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
    reresolve = (lambda: reference(build_requirements(root), build_backend_python(root), None, text)) \
        if reference else None
    verify_digest(path, text, fix, reresolve)
