"""The locked wheels themselves, fetched once into a cache and read without installing or importing them.

A wheel is chosen the way an installer would: among the files of `name==version` on the index, only those
whose sha256 the lock lists, and among those the one whose tags fit the stack's Python and platform. The
download is verified against the lock's hash before it is used, and again whenever its size or mtime
changes. The index listing (PEP 691 JSON, the API pip and uv read) is cached with the wheel: a lock's hash
names one file forever, so a warm cache needs no network at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import sys
import urllib.request
import zipfile
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import sha256_file, write_atomic
from rlstack.core.pkgnames import normalize
from rlstack.host.locks import LockedPackage

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


def _ssl_context() -> ssl.SSLContext:
    """TLS verified against the machine's CA bundle where one is set (rlstack.host.settings)."""
    from rlstack.host import settings

    ca = settings.ca_cert()
    return ssl.create_default_context(cafile=str(ca)) if ca and ca.is_file() else ssl.create_default_context()


def _get(url: str, accept: str | None = None, timeout: float = 60) -> Any:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        return urllib.request.urlopen(req, timeout=timeout, context=_ssl_context())
    except OSError as exc:
        raise WheelError(f"cannot fetch {url}: {exc}",
                         "check the network (PyPI) or warm the cache on a machine that has it "
                         f"(RLSTACK_CACHE={cache_dir()})") from None


@dataclass
class WheelCache:
    """Locked wheels on disk, keyed by filename; `fetch(pkg)` returns a verified local wheel path."""

    root: Path = field(default_factory=lambda: cache_dir() / "wheels")
    quiet: bool = False
    downloaded: list[str] = field(default_factory=list)

    def _index(self, name: str, version: str, hashes: frozenset[str]) -> list[dict[str, object]]:
        idx = self.root / "index" / f"{name}.json"
        if idx.is_file():
            files = json.loads(idx.read_text())
            if any(f["sha256"] in hashes for f in files):
                return files
        with _get(f"{INDEX_URL}/{name}/", "application/vnd.pypi.simple.v1+json") as resp:
            data = json.load(resp)
        files = [{"filename": f["filename"], "url": f["url"], "sha256": f.get("hashes", {}).get("sha256", "")}
                 for f in data.get("files", [])]
        idx.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(idx, json.dumps(files))
        return files

    def choose(self, pkg: LockedPackage, python: str, platform: str) -> dict[str, object]:
        files = self._index(pkg.name, pkg.version, pkg.hashes)
        cands = []
        for f in files:
            score = wheel_score(str(f["filename"]), python, platform)
            if f["sha256"] in pkg.hashes and score is not None:
                cands.append((score, f))
        if not cands:
            raise WheelError(f"no wheel of {pkg.name}=={pkg.version} in the lock fits Python {python} on {platform}",
                             "the lock allows only sdists or other platforms for this pin; re-lock the stack")
        return max(cands, key=lambda c: c[0])[1]

    def fetch(self, pkg: LockedPackage, python: str, platform: str) -> Path:
        f = self.choose(pkg, python, platform)
        path = self.root / str(f["filename"])
        if path.is_file() and self._verified(path, str(f["sha256"])):
            return path
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.part")
        if not self.quiet:
            print(f"rlstack: downloading {f['filename']}", file=sys.stderr, flush=True)
        h = hashlib.sha256()
        with _get(str(f["url"]), timeout=300) as resp, tmp.open("wb") as out:
            for chunk in iter(lambda: resp.read(1 << 22), b""):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != f["sha256"]:
            tmp.unlink(missing_ok=True)
            raise WheelError(f"{f['filename']}: sha256 {h.hexdigest()} is not the locked {f['sha256']}",
                             "the index served a different file than the lock names; do not use it")
        os.replace(tmp, path)
        self._mark(path, str(f["sha256"]))
        self.downloaded.append(path.name)
        return path

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


class SourceSet:
    """Python sources of several wheels, by package and path, read from the zips on demand."""

    def __init__(self, wheels: dict[str, Path]) -> None:
        self.wheels = wheels
        self._zips: dict[str, zipfile.ZipFile] = {}
        self._text: dict[tuple[str, str], str | None] = {}

    def zip(self, package: str) -> zipfile.ZipFile:
        package = normalize(package)
        if package not in self._zips:
            if package not in self.wheels:
                raise KeyError(package)
            self._zips[package] = zipfile.ZipFile(self.wheels[package])
        return self._zips[package]

    def has(self, package: str) -> bool:
        return normalize(package) in self.wheels

    def names(self, package: str) -> list[str]:
        return self.zip(package).namelist()

    def read(self, package: str, path: str) -> str | None:
        key = (normalize(package), path)
        if key not in self._text:
            try:
                self._text[key] = self.zip(package).read(path).decode("utf-8", errors="replace")
            except KeyError:
                self._text[key] = None
        return self._text[key]

    @cached_property
    def _module_owner(self) -> dict[str, str]:
        """top-level import name -> package, from the wheels' file lists."""
        owner: dict[str, str] = {}
        for pkg in self.wheels:
            for n in self.names(pkg):
                top = n.split("/", 1)[0]
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
        for cand in (f"{base}.py", f"{base}/__init__.py"):
            if self.read(pkg, cand) is not None:
                return pkg, cand
        return None

    def package_of(self, module: str) -> str | None:
        return self._module_owner.get(module.split(".", 1)[0])

    def close(self) -> None:
        for z in self._zips.values():
            z.close()
        self._zips.clear()
