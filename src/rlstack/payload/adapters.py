"""The adapter store: a LoRA adapter folder plus `manifest.json`, written atomically and verified before use.

An adapter is only ever visible under its final name once every file is on disk and hashed: it is built in
`<root>/.tmp-<name>-<random>`, each file is fsynced, and the folder is renamed into place with os.replace.
A reader that finds `<root>/<name>` therefore finds a complete adapter or, after tampering or a truncated
copy, one that `verify` refuses with a message naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlstack import __version__
from rlstack.core.errors import RlstackError
from rlstack.core.fileio import fsync_path, sha256_file, swap_in
from rlstack.core.names import NAME_PATTERN, check_name
from rlstack.core.paths import images_dir

MANIFEST = "manifest.json"
NAME_RE = re.compile(NAME_PATTERN)


class AdapterError(RlstackError):
    """An adapter folder that cannot be used as it is."""


class ManifestError(AdapterError):
    """manifest.json is missing or does not parse."""


class IntegrityError(AdapterError):
    """A file differs from what the manifest recorded (tampered, truncated, missing or extra)."""

    exit_code = 6


class BaseModelMismatchError(AdapterError):
    """The adapter was trained on another base model than the one it is about to be loaded onto."""

    exit_code = 7


class Manifest(BaseModel):
    """What an adapter is and how it was made; `files` pins every other file in the folder by sha256."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_RE.pattern)
    base_model: str = Field(min_length=1)
    stack: str = "native"
    lock_hash: str | None = None
    recipe: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    created: str = Field(description="ISO 8601 time, UTC")
    files: dict[str, str] = Field(description="relative path -> sha256 hex")
    rlstack_version: str = __version__


def default_root() -> Path:
    """$RLSTACK_ADAPTERS, else the container volume /adapters when mounted, else ./runs/adapters."""
    env = os.environ.get("RLSTACK_ADAPTERS")
    if env:
        return Path(env)
    if Path("/adapters").is_dir():
        return Path("/adapters")
    return Path("runs") / "adapters"


def _walk(folder: Path) -> list[str]:
    """Every regular file below folder except the manifest, as sorted POSIX relative paths. Symlinked folders are
    not entered (verify refuses any symlink before it hashes)."""
    out = []
    for dirpath, _dirs, filenames in os.walk(folder):
        for name in filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(folder).as_posix()
            if rel != MANIFEST and (p.is_file() or p.is_symlink()):
                out.append(rel)
    return sorted(out)


def _symlinks(folder: Path) -> list[str]:
    """Every symlink below folder, file or folder, as POSIX relative paths (os.walk does not follow them)."""
    found = []
    for dirpath, dirs, filenames in os.walk(folder):
        for name in [*dirs, *filenames]:
            p = Path(dirpath) / name
            if p.is_symlink():
                found.append(p.relative_to(folder).as_posix())
    return sorted(found)


def _invalid_path(rel: str) -> bool:
    """A manifest path that could name something outside the adapter folder, or the same file twice: absolute,
    with '..', '.', an empty part or a backslash, or not in its one canonical spelling."""
    pure = PurePosixPath(rel)
    return (not rel or pure.is_absolute() or "\\" in rel or pure.as_posix() != rel
            or any(part in ("..", ".", "") for part in rel.split("/")) or rel == MANIFEST)


def resolve_lock_hash() -> str | None:
    """$RLSTACK_LOCK_HASH (images set it), else the sha256 of the lock of $RLSTACK_STACK's stack (the cpu stack
    for a native run: the lock a native CPU environment is checked against by `invoke smoke`), else None. The
    lock hash is the hash of the file's bytes (rlstack.stacks.locks.lock_hash), read here without the host side."""
    env = os.environ.get("RLSTACK_LOCK_HASH")
    if env:
        return env
    lock = images_dir() / os.environ.get("RLSTACK_STACK", "cpu") / "requirements.lock"
    return sha256_file(lock) if lock.is_file() else None  # no images/ tree here: null, not a guess


def resolve_stack_name() -> str:
    return os.environ.get("RLSTACK_STACK", "native")


def write_adapter(
    root: Path,
    name: str,
    fill: Callable[[Path], None],
    *,
    base_model: str,
    recipe: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    stack: str | None = None,
    lock_hash: str | None = None,
    overwrite: bool = False,
) -> Manifest:
    """Create `<root>/<name>`: `fill(tmp_dir)` writes the adapter files, then they are hashed, the manifest is
    written, everything is fsynced and the folder is renamed into place. On any failure the temporary folder is
    removed and nothing appears under the final name."""
    check_name(name, "adapter name")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if final.exists() and not overwrite:
        raise AdapterError(f"adapter {final} already exists", "pick another --adapter-name or pass --overwrite")
    tmp = root / f".tmp-{name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        fill(tmp)
        files = {rel: sha256_file(tmp / rel) for rel in _walk(tmp)}
        if not files:
            raise AdapterError(f"adapter {name}: the trainer wrote no files")
        manifest = Manifest(
            name=name,
            base_model=base_model,
            stack=stack if stack is not None else resolve_stack_name(),
            lock_hash=lock_hash if lock_hash is not None else resolve_lock_hash(),
            recipe=recipe or {},
            metrics=metrics or {},
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            files=files,
        )
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
        for rel in [*files, MANIFEST]:
            fsync_path(tmp / rel)
        for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, key=lambda p: -len(p.parts)):
            fsync_path(d)
        swap_in(tmp, final)  # overwrite: the old adapter moves aside first, so the rename is still one step
        fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def read_manifest(adapter_dir: Path) -> Manifest:
    """The adapter's manifest, parsed. A symlinked adapter folder or manifest, and a manifest that lists a path
    outside its folder, are tampering (IntegrityError): the store follows no link out of itself."""
    adapter_dir = Path(adapter_dir)
    path = adapter_dir / MANIFEST
    if adapter_dir.is_symlink():
        raise IntegrityError(f"{adapter_dir}: the adapter folder is a symlink (to {os.readlink(adapter_dir)}); the "
                             "store follows no link out of itself", "copy the adapter into the store as a folder")
    if not adapter_dir.is_dir():
        raise AdapterError(f"{adapter_dir}: no such adapter folder", "list adapters with: invoke adapters")
    if path.is_symlink():
        raise IntegrityError(f"{path}: the manifest is a symlink; the store follows no link out of itself",
                             "copy the adapter again or retrain it")
    if not path.is_file():
        raise ManifestError(
            f"{adapter_dir}: no {MANIFEST}; this folder was not written by rlstack or its write was interrupted",
            "retrain it, or write a manifest only if you trust the files",
        )
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ManifestError(f"{path}: not valid JSON ({str(exc)[:200]})", "copy the adapter again or retrain it") \
            from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the manifest ({exc.strerror or exc})") from None
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise ManifestError(f"{path}: malformed manifest: {problems}") from None
    invalid = sorted(rel for rel in manifest.files if _invalid_path(rel))
    if invalid:
        raise IntegrityError(f"{path}: lists path(s) that are not plain files inside the adapter folder: "
                             f"{', '.join(repr(r) for r in invalid[:5])} (tampered)",
                             "copy the adapter again or retrain it")
    return manifest


def verify(adapter_dir: Path, expected_base_model: str | None = None) -> Manifest:
    """Check every file against the manifest (and the base model when given); return the manifest."""
    adapter_dir = Path(adapter_dir)
    manifest = read_manifest(adapter_dir)
    links = _symlinks(adapter_dir)
    if links:
        raise IntegrityError(f"{adapter_dir}: symlink(s) inside the adapter: {', '.join(links[:5])}; the store "
                             "follows no link out of itself (tampered)", "copy the adapter again or retrain it")
    on_disk = set(_walk(adapter_dir))
    recorded = set(manifest.files)
    missing = sorted(recorded - on_disk)
    extra = sorted(on_disk - recorded)
    if missing:
        raise IntegrityError(f"{adapter_dir}: file listed in the manifest is missing: {', '.join(missing)}")
    if extra:
        raise IntegrityError(
            f"{adapter_dir}: file not in the manifest: {', '.join(extra)}", "remove it, or retrain the adapter"
        )
    for rel in sorted(recorded):
        got = sha256_file(adapter_dir / rel)
        if got != manifest.files[rel]:
            raise IntegrityError(
                f"{adapter_dir}: {rel} does not match its sha256 in the manifest (tampered or truncated)",
                "copy the adapter again or retrain it",
            )
    if expected_base_model is not None and expected_base_model != manifest.base_model:
        raise BaseModelMismatchError(
            f"{adapter_dir}: adapter was trained on {manifest.base_model!r}, not {expected_base_model!r}",
            f"evaluate it with --model {manifest.base_model}",
        )
    return manifest


def _is_dir(path: Path) -> bool:
    """Whether path is a folder; False for a path the file system cannot even look up (a component over its
    name limit, a loop of links), which is no adapter folder either."""
    try:
        return path.is_dir()
    except OSError:
        return False


def find_adapter(spec: str | Path, root: Path | None = None) -> Path:
    """An adapter given as a path, or as a name under the store root. What is not an existing folder and holds
    no '/' is a name, checked as every name is (core.names) before it becomes a path: an over-long one is an
    InvalidNameError, not the file system's OSError."""
    p = Path(spec)
    if _is_dir(p):
        return p
    if "/" not in str(spec):
        check_name(str(spec), "--adapter")
    candidate = (root or default_root()) / str(spec)
    if _is_dir(candidate):
        return candidate
    raise AdapterError(
        f"adapter {spec!r} not found (looked at {p} and {candidate})", "list adapters with: invoke adapters"
    )


@dataclass(frozen=True)
class Entry:
    """One folder of the store as a listing shows it: its manifest when it has a readable one, and why it
    cannot be used when it cannot (a listing never hides a broken adapter)."""

    folder: Path
    manifest: Manifest | None
    problem: str | None
    hashes_checked: bool

    @property
    def ok(self) -> bool:
        return self.problem is None


def scan(root: Path | None = None, *, check_files: bool = False) -> list[Entry]:
    """Every adapter folder under root (temporary and hidden ones aside), each read and, with `check_files`,
    verified file by file. Checks all of them: one bad adapter does not hide the others."""
    root = Path(root) if root is not None else default_root()
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith("."):
            continue
        manifest = None
        try:
            manifest = verify(d) if check_files else read_manifest(d)
            problem = None
        except AdapterError as exc:
            problem = exc.message
            with contextlib.suppress(AdapterError):
                manifest = manifest or read_manifest(d)
        out.append(Entry(d, manifest, problem, check_files and problem is None))
    return out
