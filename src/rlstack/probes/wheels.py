"""The locked wheels themselves, fetched once into a cache and read without installing or importing them.

A wheel is chosen the way an installer would: among the files of `name==version` on the index, only those
whose sha256 the lock lists, and among those the one whose tags fit the stack's Python and platform. The
download is verified against the lock's hash before it is used, and again whenever its size or mtime
changes. The index listing (PEP 691 JSON, the API pip and uv read) is cached with the wheel: a lock's hash
names one file forever, so a warm cache needs no network at all.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import sha256_file
from rlstack.core.pkgnames import normalize
from rlstack.probes import remote
from rlstack.probes.remote import RemoteWheel
from rlstack.stacks.locks import LockedPackage

INDEX_URL = os.environ.get("RLSTACK_INDEX_URL", "https://pypi.org/simple")


class WheelError(RlstackError):
    exit_code = 6


def cache_dir() -> Path:
    return Path(os.environ.get("RLSTACK_CACHE", Path.home() / ".cache" / "rlstack"))


def _manylinux_max(platform: str) -> tuple[int, int]:
    """The newest glibc a stack platform ('x86_64-manylinux_2_28') promises; manylinux2014's 2.17 otherwise."""
    m = re.search(r"manylinux_(\d+)_(\d+)", platform)
    return (int(m[1]), int(m[2])) if m else (2, 17)


# PEP 600's aliases for the manylinux tags that predate the glibc-numbered ones.
_LEGACY = {(2, 5): "manylinux1", (2, 12): "manylinux2010", (2, 17): "manylinux2014"}


@lru_cache(maxsize=32)
def _supported(python: str, platform: str) -> dict[Tag, tuple[int, int, int]]:
    """Every tag a CPython `python` on `platform` installs, as packaging.tags lists them for that target (not
    for this machine), with its preference: (interpreter score, glibc major, glibc minor).

    Interpreter score: 3 for this CPython's own tags (cp311 with cp311/abi3/none), 2 for the stable ABI of an
    older CPython (cp38-abi3), 1 for pure-Python tags (py3, py311). 'any' counts as glibc (0, 0)."""
    major, minor = (int(x) for x in python.split(".")[:2])
    arch = "aarch64" if "aarch64" in platform else "x86_64"
    gmajor, gmax = _manylinux_max(platform)
    glibc: dict[str, tuple[int, int]] = {}
    for gminor in range(gmax, -1, -1):  # newest glibc first, as an installer prefers them
        glibc[f"manylinux_{gmajor}_{gminor}_{arch}"] = (gmajor, gminor)
        if (gmajor, gminor) in _LEGACY:
            glibc[f"{_LEGACY[gmajor, gminor]}_{arch}"] = (gmajor, gminor)
    glibc["any"] = (0, 0)
    interpreter = f"cp{major}{minor}"
    tags = [*cpython_tags((major, minor), abis=[interpreter], platforms=list(glibc)),
            *compatible_tags((major, minor), interpreter, platforms=list(glibc))]
    out: dict[Tag, tuple[int, int, int]] = {}
    for tag in tags:
        score = 3 if tag.interpreter == interpreter else 2 if tag.interpreter.startswith("cp") else 1
        out.setdefault(tag, (score, *glibc[tag.platform]))
    return out


def wheel_score(filename: str, python: str, platform: str) -> tuple[int, ...] | None:
    """None when the wheel cannot install on (python, platform); else a sort key (higher = preferred:
    most specific interpreter tag, newest glibc that still fits, highest build number).

    The filename is read by packaging (name, version, build tag, compressed tag sets) and its tags are
    matched against packaging.tags' list for the stack's Python and platform."""
    try:
        _, _, build, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    supported = _supported(python, platform)
    scores = [supported[t] for t in tags if t in supported]
    if not scores:
        return None
    return (*max(scores), build[0] if build else 0)


def _offline(message: str) -> WheelError:
    """A failure to reach the index, with the way to work without it."""
    return WheelError(message, "check the network (PyPI) or warm the cache on a machine that has it "
                               f"(RLSTACK_CACHE={cache_dir()})")


def _index_get(url: str, accept: str | None = None) -> tuple[dict[str, str], bytes]:
    """(headers, body) of a page of the index, over the probes' shared keep-alive client (rlstack.probes.remote:
    no TLS handshake per package) and gzip-compressed on the wire (torch's listing is megabytes of JSON)."""
    try:
        status, headers, body = remote.http_get(url, accept=accept, gzip=True)
    except remote.FetchError as exc:
        raise _offline(exc.message) from None
    if status != 200:
        raise _offline(f"cannot fetch {url}: HTTP {status}")
    return headers, body


@contextmanager
def _get(url: str, accept: str | None = None) -> Iterator[io.BytesIO]:
    """An index page as a file to read (suggest reads the versions a package has with it)."""
    yield io.BytesIO(_index_get(url, accept)[1])


def _lists(files: list[dict[str, object]], version: str, hashes: frozenset[str]) -> bool:
    """A cached listing answers for this pin: it holds a file the lock names (or, unlocked, that version)."""
    return any(f["sha256"] in hashes for f in files) or (not hashes and any(
        _version_of(str(f["filename"])) == version for f in files))


def _listing(url: str) -> dict[str, Any]:
    """A PEP 691 JSON listing."""
    headers, body = _index_get(url, "application/vnd.pypi.simple.v1+json")
    try:
        data = json.loads(body)
    except ValueError:
        raise WheelError(f"{url}: the index answered with something other than PEP 691 JSON "
                         f"({headers.get('content-type', 'no content type')})",
                         "set RLSTACK_INDEX_URL to an index that serves the JSON simple API") from None
    return data if isinstance(data, dict) else {}


def _entry(f: dict[str, Any]) -> dict[str, object]:
    """What the cache keeps of a PEP 691 file entry: name, URL, sha256, size, and the sha256 of its PEP 658
    metadata file when the index serves one."""
    meta = f.get("core-metadata", f.get("data-dist-info-metadata"))
    return {"filename": f["filename"], "url": f["url"], "sha256": f.get("hashes", {}).get("sha256", ""),
            "size": f.get("size"), "metadata_sha256": meta.get("sha256") if isinstance(meta, dict) else None}


def _version_of(filename: str) -> str | None:
    try:
        return str(parse_wheel_filename(filename)[1]) if filename.endswith(".whl") else None
    except (InvalidWheelFilename, InvalidVersion):
        return None


def platform_problem(filenames: list[str], python: str, platform: str) -> str:
    """In words, why none of these wheels installs on (python, platform): the glibc they need, or the
    Python / architecture they are for."""
    wheels = [f for f in filenames if f.endswith(".whl")]
    if not wheels:
        return "the index has only an sdist of this version (no wheel to read or install)"
    need = _glibc_needed(wheels, python, platform)
    if need:
        return (f"its wheels need manylinux_{need[0]}_{need[1]} (glibc {need[0]}.{need[1]}), and the stack locks for "
                f"{platform} (glibc {'.'.join(map(str, _manylinux_max(platform)))})")
    tags = sorted({t for f in wheels for t in f.removesuffix(".whl").split("-")[-3:-2]})
    return f"its wheels are for {', '.join(sorted(set(wheels)))[:300]} (Python tags {', '.join(tags)})"


def platform_fix(name: str, filenames: list[str], python: str, platform: str) -> str:
    need = _glibc_needed([f for f in filenames if f.endswith(".whl")], python, platform)
    arch = "aarch64" if "aarch64" in platform else "x86_64"
    if need:
        return (f"lock for that platform: set platform = \"{arch}-manylinux_{need[0]}_{need[1]}\" in the stack's "
                f"stack.toml (its base image must have glibc >= {need[0]}.{need[1]}), then invoke lock --stack NAME; "
                f"or pin a {name} release with a wheel for {platform}")
    return f"pin a {name} release that has a wheel for Python {python} on {platform}"


def _glibc_needed(wheels: list[str], python: str, platform: str) -> tuple[int, int] | None:
    """The lowest manylinux glibc at which one of the wheels would install for this Python and arch."""
    arch = "aarch64" if "aarch64" in platform else "x86_64"
    best: tuple[int, int] | None = None
    for f in wheels:
        for m in re.finditer(r"manylinux_(\d+)_(\d+)_" + arch, f):
            glibc = (int(m[1]), int(m[2]))
            if wheel_score(f, python, f"{arch}-manylinux_{glibc[0]}_{glibc[1]}") is not None and \
                    (best is None or glibc < best):
                best = glibc
    return best if best and best > _manylinux_max(platform) else None


@dataclass
class WheelCache:
    """Locked wheels on disk, keyed by filename; `fetch(pkg)` returns a verified local wheel path."""

    root: Path = field(default_factory=lambda: cache_dir() / "wheels")
    quiet: bool = False
    downloaded: list[str] = field(default_factory=list)
    ranges: bool = field(default_factory=lambda: os.environ.get("RLSTACK_WHOLE_WHEELS", "") != "1")
    _remote: dict[str, RemoteWheel] = field(default_factory=dict, repr=False)
    _remote_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _listings: dict[str, list[dict[str, object]]] = field(default_factory=dict, repr=False)
    _listing_locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)

    def _index(self, name: str, version: str, hashes: frozenset[str]) -> list[dict[str, object]]:
        """The index's files of `name` (PEP 691), from memory, the disk cache or the index. One listing is
        fetched once per cache object even when two stacks ask for it at the same moment (probe-fp8 runs
        fp8-report and fp8 side by side, and they share vllm, torch, trl, flashinfer and unsloth's listing)."""
        with self._remote_lock:
            lock = self._listing_locks.setdefault(name, threading.Lock())
        with lock:
            files = self._listings.get(name)
            if files is not None and _lists(files, version, hashes):
                return files
            idx = self.root / "index" / f"{name}.json"
            if idx.is_file():
                files = json.loads(idx.read_text())
                if _lists(files, version, hashes):
                    self._listings[name] = files
                    return files
            files = [_entry(f) for f in _listing(f"{INDEX_URL}/{name}/").get("files", [])]
            idx.parent.mkdir(parents=True, exist_ok=True)
            remote.write_text(idx, json.dumps(files))
            self._listings[name] = files
            return files

    def choose(self, pkg: LockedPackage, python: str, platform: str) -> dict[str, object]:
        """The file an installer would take for this pin: the best-scoring wheel among those whose sha256 the
        lock lists (or, for a version outside any lock, among all files of that version)."""
        files = self._index(pkg.name, pkg.version, pkg.hashes)
        mine = [f for f in files if f["sha256"] in pkg.hashes] if pkg.hashes else \
            [f for f in files if _version_of(str(f["filename"])) == pkg.version]
        cands = [(score, f) for f in mine if (score := wheel_score(str(f["filename"]), python, platform)) is not None]
        if not cands:
            raise WheelError(f"no wheel of {pkg.name}=={pkg.version} fits Python {python} on {platform}: "
                             + platform_problem([str(f["filename"]) for f in mine], python, platform),
                             platform_fix(pkg.name, [str(f["filename"]) for f in mine], python, platform))
        return max(cands, key=lambda c: c[0])[1]

    def open(self, pkg: LockedPackage, python: str, platform: str, *, any_platform: bool = False
             ) -> Path | RemoteWheel:
        """The locked wheel to read members from: the whole file when it is already here (verified), else a
        RemoteWheel that range-reads members (falling back to the whole file where ranges are refused).
        `any_platform`: when no wheel installs on the platform, read the source of another of the locked
        wheels (Python sources do not depend on the glibc tag); the platform problem is the caller's."""
        try:
            f = self.choose(pkg, python, platform)
        except WheelError:
            if not any_platform:
                raise
            files = self._index(pkg.name, pkg.version, pkg.hashes)
            mine = [f for f in files if str(f["filename"]).endswith(".whl") and (
                f["sha256"] in pkg.hashes if pkg.hashes else _version_of(str(f["filename"])) == pkg.version)]
            if not mine:
                raise
            arch = "aarch64" if "aarch64" in platform else "x86_64"
            f = max(mine, key=lambda f: arch in str(f["filename"]))
        path = self.root / str(f["filename"])
        if path.is_file() and self._verified(path, str(f["sha256"])):
            return path
        if not self.ranges:
            return self.fetch(pkg, python, platform)
        return self.remote(f)

    def remote(self, f: dict[str, object]) -> RemoteWheel:
        """One RemoteWheel per file for the cache's life: what it fetched (the central directory above all)
        serves every later reader of the same file."""
        key = str(f["sha256"])
        with self._remote_lock:
            if key not in self._remote:
                self._remote[key] = RemoteWheel(str(f["filename"]), str(f["url"]), key,
                                                int(f["size"]) if f.get("size") else None,  # type: ignore[call-overload]
                                                self.root / "members", fallback=lambda: self._download(f))
            return self._remote[key]

    def platform_needed(self, name: str, version: str, python: str, platform: str) -> str | None:
        """The platform tag (e.g. 'x86_64-manylinux_2_35') a stack would need to install name==version, when
        none of its wheels installs on `platform`; None when one does (or when no newer glibc would help)."""
        files = [str(f["filename"]) for f in self._index(normalize(name), version, frozenset())
                 if _version_of(str(f["filename"])) == version]
        wheels = [f for f in files if f.endswith(".whl")]
        if any(wheel_score(f, python, platform) is not None for f in wheels):
            return None
        need = _glibc_needed(wheels, python, platform)
        arch = "aarch64" if "aarch64" in platform else "x86_64"
        return f"{arch}-manylinux_{need[0]}_{need[1]}" if need else None

    def metadata(self, name: str, version: str, python: str, platform: str) -> tuple[str, str | None]:
        """(METADATA text, platform problem or None) of name==version: PEP 658 where the index serves it, else
        the METADATA member range-read from the wheel that fits the platform (or any wheel of that version,
        the problem then said). Cached by the file's sha256."""
        pkg = LockedPackage(normalize(name), version, frozenset())
        files = [f for f in self._index(pkg.name, version, frozenset()) if _version_of(str(f["filename"])) == version
                 and str(f["filename"]).endswith(".whl")]
        if not files:
            raise WheelError(f"{name}=={version}: no wheel on the index", "only an sdist: its metadata needs a build")
        problem = None
        try:
            f = self.choose(pkg, python, platform)
        except WheelError as exc:
            problem, f = exc.message, files[0]
        path = self.root / "metadata" / f"{f['sha256']}.METADATA"
        if path.is_file():
            return path.read_text(), problem
        text: str | None = None
        if f.get("metadata_sha256"):
            status, _, body = remote.http_get(str(f["url"]) + ".metadata")
            if status == 200 and hashlib.sha256(body).hexdigest() == f["metadata_sha256"]:
                text = body.decode("utf-8", errors="replace")
        if text is None:
            wheel = self.remote(f)
            info = next((n for n in wheel.names() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
            data = wheel.read(info) if info else None
            wheel.close()
            if data is None:
                raise WheelError(f"{f['filename']}: no .dist-info/METADATA")
            text = data.decode("utf-8", errors="replace")
        path.parent.mkdir(parents=True, exist_ok=True)
        remote.write_text(path, text)
        return text, problem

    def fetch(self, pkg: LockedPackage, python: str, platform: str) -> Path:
        """The whole locked wheel on disk, downloaded once and checked against the lock's sha256."""
        f = self.choose(pkg, python, platform)
        path = self.root / str(f["filename"])
        if path.is_file() and self._verified(path, str(f["sha256"])):
            return path
        return self._download(f)

    def _download(self, f: dict[str, object]) -> Path:
        path = self.root / str(f["filename"])
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.part")
        if not self.quiet:
            print(f"rlstack: downloading {f['filename']}", file=sys.stderr, flush=True)
        try:
            with tmp.open("wb") as out:
                digest = remote.download(str(f["url"]), out)
        except remote.FetchError as exc:
            tmp.unlink(missing_ok=True)
            raise _offline(exc.message) from None
        if digest != f["sha256"]:
            tmp.unlink(missing_ok=True)
            raise WheelError(f"{f['filename']}: sha256 {digest} is not the locked {f['sha256']}",
                             "the index served a different file than the lock names; do not use it")
        os.replace(tmp, path)
        self._mark(path, str(f["sha256"]))
        self.downloaded.append(path.name)
        return path

    def digest(self, path: Path) -> str:
        """The sha256 of a whole wheel in the cache (from its verification marker; hashed if it has none)."""
        try:
            return str(json.loads(self._marker(path).read_text())["sha256"])
        except (OSError, ValueError, KeyError):
            return sha256_file(path)

    def _marker(self, path: Path) -> Path:
        return path.with_name(path.name + ".sha256")

    def _mark(self, path: Path, digest: str) -> None:
        st = path.stat()
        self._marker(path).write_text(json.dumps({"sha256": digest, "size": st.st_size, "mtime": st.st_mtime}))

    def _verified(self, path: Path, digest: str) -> bool:
        """Re-hash only when the file changed since it was last verified (a 500 MB torch wheel takes seconds)."""
        st = path.stat()
        try:
            mark = json.loads(self._marker(path).read_text())
            if mark == {"sha256": digest, "size": st.st_size, "mtime": st.st_mtime}:
                return True
        except (OSError, ValueError):
            pass
        if sha256_file(path) == digest:
            self._mark(path, digest)
            return True
        return False


class LocalWheel:
    """A wheel file on disk, read with zipfile (the same interface as RemoteWheel)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        st = path.stat()
        self.key = f"{path}:{st.st_size}:{st.st_mtime_ns}"  # names this file's content for caches in memory
        self._zip: zipfile.ZipFile | None = None

    def _z(self) -> zipfile.ZipFile:
        if self._zip is None:
            self._zip = zipfile.ZipFile(self.path)
        return self._zip

    def names(self) -> list[str]:
        return self._z().namelist()

    def read(self, member: str) -> bytes | None:
        try:
            return self._z().read(member)
        except KeyError:
            return None

    def prefetch(self, members: list[str]) -> None:
        pass

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None


Reader = LocalWheel | RemoteWheel


def reader(wheel: Path | RemoteWheel | LocalWheel) -> Reader:
    return LocalWheel(wheel) if isinstance(wheel, Path) else wheel


class SourceSet:
    """Python sources of several wheels, by package and path, read on demand from whole wheels on disk or
    member by member from the index (RemoteWheel)."""

    def __init__(self, wheels: dict[str, Path | RemoteWheel | LocalWheel]) -> None:
        self.wheels = wheels
        self._readers: dict[str, Reader] = {}
        self._text: dict[tuple[str, str], str | None] = {}
        self._names: dict[str, frozenset[str]] = {}

    def reader(self, package: str) -> Reader:
        package = normalize(package)
        if package not in self._readers:
            if package not in self.wheels:
                raise KeyError(package)
            self._readers[package] = reader(self.wheels[package])
        return self._readers[package]

    def has(self, package: str) -> bool:
        return normalize(package) in self.wheels

    def version(self, package: str) -> str | None:
        """The version of the wheel read for a package (from its file name), for messages."""
        if not self.has(package):
            return None
        return _version_of(self.reader(package).name)

    def names(self, package: str) -> list[str]:
        return self.reader(package).names()

    def read(self, package: str, path: str) -> str | None:
        key = (normalize(package), path)
        if key not in self._text:
            data = self.reader(package).read(path)
            self._text[key] = data.decode("utf-8", errors="replace") if data is not None else None
        return self._text[key]

    @cached_property
    def _module_owner(self) -> dict[str, str]:
        """top-level import name -> package, from the wheels' file lists."""
        owner: dict[str, str] = {}
        for pkg in self.wheels:
            for top in dict.fromkeys(n.split("/", 1)[0] for n in self.names(pkg)):  # torch: 16,000 names, 10 tops
                if top.endswith(".py"):
                    top = top[:-3]
                if "." not in top and not top.endswith("-info"):
                    owner.setdefault(top, pkg)
        return owner

    def module_file(self, module: str) -> tuple[str, str] | None:
        """(package, path) of a dotted module inside the set, or None when it is not there."""
        pkg = self._module_owner.get(module.split(".", 1)[0])
        if pkg is None:
            return None
        base = module.replace(".", "/")
        names = self.name_set(pkg)
        for cand in (f"{base}.py", f"{base}/__init__.py"):
            if cand in names:
                return pkg, cand
        return None

    def name_set(self, package: str) -> frozenset[str]:
        package = normalize(package)
        if package not in self._names:
            self._names[package] = frozenset(self.names(package))
        return self._names[package]

    def package_of(self, module: str) -> str | None:
        return self._module_owner.get(module.split(".", 1)[0])

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()
