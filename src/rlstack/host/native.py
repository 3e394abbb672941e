"""A stack's locked packages, staged for a GPU host with no Docker and no network, and installed there.

The runtime probes belong in the stack's image, but not every GPU machine runs Docker (the lent machines this
project measures on do not, and neither does a locked-down cluster node). There the same probe code runs natively,
over the host's own Python, with the lock's packages laid on top: `stage` picks what the host lacks (the
host's `pip list --format=json` says what it has), fetches those wheels for the host's Python with the
lock's sha256 checked, packs them into one tar with a manifest and cuts it into parts small enough for
whatever carries them; `install` (standard library only: it runs before anything is installed) checks every
part and the whole, then installs the wheels with `pip --target` into an overlay directory that goes first
on PYTHONPATH. What stays different from the lock (kept from the host, skipped, another Python) is then
measured and recorded by the runtime report itself (rlstack.probes.environment), never assumed.

Carrying costs device time per part, so by default (`compress="xz"`) each wheel is first rewritten as a stored
(uncompressed) zip with byte-identical members, every member checked against the wheel's RECORD, and the tar
of those is xz-compressed: xz finds far more in CUDA libraries than the wheels' own per-member deflate
(bench/results/archive/stage_compression.md). The tar is compressed in independent blocks, in parallel, and parts are
cut by compressed size at block edges, so each part is a whole xz file the GPU host decompresses on its own,
all parts at once. `compress="none"` keeps the plain format: the tar of the original wheels, cut by size.

The GPU host installs them with `python -m rlstack.scripts.native_install install --parts DIR --target DIR`.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rlstack.core import wheelrecord
from rlstack.core.fileio import sha256_file, swap_in
from rlstack.core.pkgnames import normalize, public_version
from rlstack.scripts.native_install import CHUNK, MANIFEST, PARTS_FILE, NativeError, workers

COMPRESS = ("xz", "none")
# xz preset and block (parts and times of each: bench/results/archive/stage_compression.md): preset 0 already stages in
# fewer parts than no compression, and preset 1's few percent fewer bytes take longer on a 2-core host
# (`--xz-preset` trades host minutes for parts). Independent 2 MiB blocks cost little against one stream and end a
# part within one block of its limit.
XZ_PRESET = 0
XZ_BLOCK = 2 << 20
# RECORD cannot hash itself, nor its signatures (PEP 376, PEP 427); every other member must match its line.
UNHASHED = ("RECORD", "RECORD.jws", "RECORD.p7s")
RECORD_HASHES = ("sha256", "sha384", "sha512")


@dataclass(frozen=True)
class Pick:
    """One locked package and what happens to it on the host: carry the locked wheel, use the host's copy, or
    leave it out (with why)."""

    name: str
    version: str
    action: str  # "carry" | "host" | "skip"
    why: str


def read_host_packages(path: Path) -> dict[str, str]:
    """{normalized name: version} from `pip list --format=json` (or `pip freeze` lines) taken on the host."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise NativeError(f"{path}: cannot read the host's package list: {exc.strerror}",
                          "on the GPU host run: python3 -m pip list --format=json > host-packages.json") from None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, list):
        try:
            return {normalize(d["name"]): str(d["version"]) for d in data}
        except (KeyError, TypeError):
            raise NativeError(f"{path}: a JSON list, but not of pip list's {{name, version}} entries",
                              "use: python3 -m pip list --format=json") from None
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "==" not in line:
            raise NativeError(f"{path}:{n}: '{line[:80]}' is neither pip list JSON nor a 'name==version' line",
                              "use: python3 -m pip list --format=json")
        name, version = line.split("==", 1)
        out[normalize(name)] = version.strip()
    return out


def plan(locked: dict[str, str], host: dict[str, str], *, skip: dict[str, str] | None = None,
         keep_host: set[str] | None = None) -> list[Pick]:
    """Decide per locked package. A host copy at the lock's version (ignoring a local label such as +cu130)
    is used as it is; `keep_host` names packages whose host copy stays even at another version (numpy, when
    host libraries were compiled against the newer one); `skip` names packages the probes do not need."""
    skip = {normalize(k): v for k, v in (skip or {}).items()}
    keep = {normalize(k) for k in keep_host or set()}
    unknown = sorted((set(skip) | keep) - set(locked))
    if unknown:
        raise NativeError(f"not in the lock: {', '.join(unknown)}", "name packages of the stack's lock")
    picks = []
    for name, version in sorted(locked.items()):
        have = host.get(name)
        if have is not None and public_version(have) == public_version(version):
            picks.append(Pick(name, version, "host", f"the host has {have}"))
        elif name in skip:
            picks.append(Pick(name, version, "skip", skip[name]))
        elif name in keep and have is not None:
            picks.append(Pick(name, version, "host", f"kept the host's {have}"))
        else:
            picks.append(Pick(name, version, "carry", f"the host has {have}" if have else "not on the host"))
    return picks


def _record(z: zipfile.ZipFile, whl: str) -> tuple[str, dict[str, tuple[str, str]]]:
    """The wheel's RECORD: its member name and {path: (hash algorithm, urlsafe base64 digest)}."""
    found = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    if len(found) != 1:
        raise NativeError(f"{whl}: {len(found)} *.dist-info/RECORD files, a wheel has one",
                          "stage with --compress none to carry the wheel as it is")
    return found[0], wheelrecord.parse(z.read(found[0]).decode("utf-8"))


def store_wheel(whl: Path, dest: Path) -> int:
    """Rewrite the wheel `whl` at `dest` as a stored (uncompressed) zip: the same members in the same order,
    names, dates and permissions, byte for byte. Why: deflate works member by member and hides what repeats
    across a CUDA library; xz over the stored bytes finds it. Every member's bytes, as written, are checked
    against the wheel's RECORD (the lock's sha256 covers the wheel we read, RECORD each member we write), and
    a member that does not match, or that RECORD does not list, refuses the wheel. Returns the members checked."""
    def refuse(member: str, why: str) -> NativeError:
        return NativeError(f"{whl.name}: {member}: {why}; refused",
                           "the wheel does not match its own RECORD: report it to its publisher, or stage with "
                           "--compress none to carry it as it is (unchecked member by member)")

    checked = 0
    try:
        with zipfile.ZipFile(whl) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as dst:
            record_name, record = _record(src, whl.name)
            for info in src.infolist():
                out = zipfile.ZipInfo(info.filename, info.date_time)
                out.external_attr, out.create_system, out.comment = (info.external_attr, info.create_system,
                                                                     info.comment)
                if info.is_dir():
                    dst.writestr(out, b"")
                    continue
                unhashed = info.filename.rpartition("/")[0] == record_name.rpartition("/")[0] and \
                    info.filename.rpartition("/")[2] in UNHASHED
                algo, digest = record.get(info.filename, ("", ""))
                if not unhashed and info.filename not in record:
                    raise refuse(info.filename, "not listed in RECORD")
                if not unhashed and algo not in RECORD_HASHES:
                    raise refuse(info.filename, f"RECORD gives it no sha256 ('{algo}')")
                h = hashlib.new(algo if algo in RECORD_HASHES else "sha256")
                out.file_size = info.file_size  # lets zipfile choose zip64 up front for members over 2 GiB
                with src.open(info) as r, dst.open(out, "w") as w:
                    for chunk in iter(lambda r=r: r.read(CHUNK), b""):  # type: ignore[misc]
                        h.update(chunk)
                        w.write(chunk)
                if not unhashed:
                    got = wheelrecord.b64_digest(h.digest())
                    if got != digest:
                        raise refuse(info.filename, f"{algo} {got}, RECORD says {digest}")
                    checked += 1
    except zipfile.BadZipFile as exc:  # includes a member whose CRC-32 does not match
        raise NativeError(f"{whl.name}: not a readable zip ({exc})", "delete it from the wheel cache and stage again"
                          ) from None
    return checked


def _xz(raw: bytes, preset: int) -> bytes:
    return lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32, preset=preset)


class XzParts:
    """A write-only stream (what tarfile writes the bundle into) that cuts its bytes into blocks of XZ_BLOCK,
    compresses each block as an independent xz stream on a thread pool, and packs the compressed blocks, in
    order, into out_dir/part-NNN files of at most part_bytes each. A part is then one or more whole xz streams
    back to back, which is itself a valid xz file: the GPU host decompresses every part on its own, all at
    once. It also hashes the uncompressed stream, which is what install checks after joining."""

    def __init__(self, out_dir: Path, part_bytes: int, *, preset: int = XZ_PRESET, threads: int | None = None
                 ) -> None:
        self.out_dir, self.part_bytes, self.preset = out_dir, part_bytes, preset
        # a block must fit a part even when incompressible (xz then adds a few bytes per 64 KiB), and parts end
        # on a block edge: a part wastes less than one compressed block
        self.block = max(1 << 15, min(XZ_BLOCK, part_bytes // 8))
        self.threads = threads or workers()
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rlstack-xz")
        self.pending: deque[tuple[int, Future[bytes]]] = deque()
        self.buf = bytearray()
        self.raw = hashlib.sha256()
        self.size = 0
        self.parts: list[dict[str, Any]] = []
        self._part: io.BufferedWriter | None = None
        self._hash = hashlib.sha256()
        self._started = time.monotonic()

    @property
    def sha256(self) -> str:
        return self.raw.hexdigest()

    def write(self, data: bytes) -> int:
        self.raw.update(data)
        self.size += len(data)
        self.buf += data
        while len(self.buf) >= self.block:
            self._submit(bytes(self.buf[:self.block]))
            del self.buf[:self.block]
        return len(data)

    def _submit(self, raw: bytes) -> None:
        self.pending.append((len(raw), self.pool.submit(_xz, raw, self.preset)))
        while len(self.pending) > 2 * self.threads:  # bounded: a few blocks in flight, never the whole tar
            self._take()

    def _take(self) -> None:
        raw_size, future = self.pending.popleft()
        data = future.result()
        if len(data) > self.part_bytes:
            raise NativeError(f"a {raw_size}-byte block compressed to {len(data)} bytes, more than a part holds")
        if self._part is None or self.parts[-1]["size"] + len(data) > self.part_bytes:
            self._close_part()
            name = f"part-{len(self.parts):03d}"
            self.parts.append({"name": name, "sha256": "", "size": 0, "raw_size": 0, "blocks": 0})
            self._part, self._hash = (self.out_dir / name).open("wb"), hashlib.sha256()
        self._part.write(data)
        self._hash.update(data)
        part = self.parts[-1]
        part["size"] += len(data)
        part["raw_size"] += raw_size
        part["blocks"] += 1

    def _close_part(self) -> None:
        if self._part is None:
            return
        self._part.close()
        self._part = None
        part = self.parts[-1]
        part["sha256"] = self._hash.hexdigest()
        ratio = part["size"] / max(part["raw_size"], 1)
        print(f"rlstack:   {part['name']}: {part['size'] / 2**20:.1f} MiB ({part['raw_size'] / 2**20:.1f} MiB "
              f"uncompressed, {ratio:.2f}) at {time.monotonic() - self._started:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Compress what is left and finish the last part."""
        if self.buf:
            self._submit(bytes(self.buf))
            self.buf.clear()
        while self.pending:
            self._take()
        self._close_part()
        self.pool.shutdown()

    def __enter__(self) -> XzParts:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
            return
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self._part is not None:
            self._part.close()


def split(tar: Path, out_dir: Path, part_bytes: int) -> list[dict[str, Any]]:
    """Cut `tar` into out_dir/part-NNN files of at most part_bytes each."""
    parts = []
    with tar.open("rb") as src:
        n = 0
        while True:
            name = f"part-{n:03d}"
            h, size = hashlib.sha256(), 0
            with (out_dir / name).open("wb") as dst:
                while size < part_bytes:
                    chunk = src.read(min(CHUNK, part_bytes - size))
                    if not chunk:
                        break
                    h.update(chunk)
                    dst.write(chunk)
                    size += len(chunk)
            if size == 0:
                (out_dir / name).unlink()
                break
            parts.append({"name": name, "sha256": h.hexdigest(), "size": size})
            n += 1
    return parts


def _pack(tar: tarfile.TarFile, carry: list[Pick], locked: dict[str, Any], cache: Any, python: str, platform: str,
          stored: Path | None, sink: XzParts | None) -> list[dict[str, Any]]:
    """Fetch each carried wheel (sha256 against the lock) into the tar; with `stored`, as its stored rewrite
    (written there, added, removed). Progress per wheel: staging several GB takes minutes."""
    wheels = []
    started = time.monotonic()
    for i, p in enumerate(carry, 1):
        whl = cache.fetch(locked[p.name], python, platform)
        entry: dict[str, Any] = {"name": p.name, "version": p.version, "file": whl.name, "sha256": sha256_file(whl),
                                 "size": whl.stat().st_size}
        if stored is None:
            tar.add(whl, arcname=f"wheels/{whl.name}")
        else:
            rewritten = stored / whl.name
            entry["members_checked"] = store_wheel(whl, rewritten)
            entry["stored_size"] = rewritten.stat().st_size
            tar.add(rewritten, arcname=f"wheels/{whl.name}")
            rewritten.unlink()
        wheels.append(entry)
        line = f"rlstack: [{i}/{len(carry)}] {p.name}=={p.version} {entry['size'] / 2**20:.1f} MiB"
        if sink is not None:
            line += (f", {entry['members_checked']} members match RECORD; {sink.size / 2**20:.0f} MiB in, "
                     f"{len(sink.parts)} part(s) so far, {time.monotonic() - started:.0f} s")
        print(line, file=sys.stderr, flush=True)
    return wheels


def stage(stack_name: str, host_packages: Path, out_dir: Path, *, python: str, platform: str = "x86_64-manylinux_2_28",
          skip: dict[str, str] | None = None, keep_host: set[str] | None = None, part_mb: int = 55,
          compress: str = "xz", preset: int | None = None, cache: Any = None) -> dict[str, Any]:
    """Fetch the carried wheels (sha256 against the lock), pack and split them into out_dir. The folder is
    written aside and swapped in at the end, so an interrupted stage leaves the previous one whole.
    `compress`: "xz" (stored wheels, RECORD-checked, xz parts cut by compressed size) or "none" (the plain
    format: the original wheels, the tar cut by size)."""
    from rlstack.probes.wheels import WheelCache
    from rlstack.stacks import locks
    from rlstack.stacks.locks import parse_locked
    from rlstack.stacks.model import load_stack

    if part_mb < 1:
        raise NativeError(f"--part-mb {part_mb}: a part must hold at least 1 MiB")
    if compress not in COMPRESS:
        raise NativeError(f"--compress {compress}: one of {', '.join(COMPRESS)}")
    preset = XZ_PRESET if preset is None else preset
    if not 0 <= preset <= 9:
        raise NativeError(f"--xz-preset {preset}: xz presets are 0 to 9")
    stack = load_stack(stack_name)
    locked = parse_locked(stack.lock_file.read_text())
    picks = plan({n: p.version for n, p in locked.items()}, read_host_packages(host_packages), skip=skip,
                 keep_host=keep_host)
    cache = cache or WheelCache()
    carry = [p for p in picks if p.action == "carry"]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    manifest = {"stack": stack.name, "lock_hash": locks.lock_hash(stack), "python": python, "platform": platform,
                "picks": [asdict(p) for p in picks], "wheels": []}

    def finish(tar: tarfile.TarFile) -> None:
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    try:
        fmt: dict[str, Any]
        if compress == "none":
            tar_path = work / "bundle.tar"
            with tarfile.open(tar_path, "w") as tar:
                manifest["wheels"] = _pack(tar, carry, locked, cache, python, platform, None, None)
                finish(tar)
            parts = split(tar_path, work, part_mb << 20)
            fmt = {"format": "tar", "tar_sha256": sha256_file(tar_path), "tar_size": tar_path.stat().st_size}
            tar_path.unlink()
        else:
            print(f"rlstack: {len(carry)} wheels, rewritten stored and xz-compressed (preset {preset}) on "
                  f"{workers()} threads", file=sys.stderr, flush=True)
            with XzParts(work, part_mb << 20, preset=preset) as sink, \
                    tarfile.open(fileobj=sink, mode="w|", bufsize=1 << 20) as tar:  # type: ignore[call-overload]
                manifest["wheels"] = _pack(tar, carry, locked, cache, python, platform, work, sink)
                finish(tar)
            parts = sink.parts
            fmt = {"format": "xz", "preset": preset, "block_bytes": sink.block, "tar_sha256": sink.sha256,
                   "tar_size": sink.size}
        index = {"stack": stack.name, "lock_hash": manifest["lock_hash"], "python": python, **fmt, "parts": parts,
                 "carry": len(carry), "host": sum(p.action == "host" for p in picks),
                 "skip": {p.name: p.why for p in picks if p.action == "skip"}}
        (work / PARTS_FILE).write_text(json.dumps(index, indent=1) + "\n")
        swap_in(work, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return index


