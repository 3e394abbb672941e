"""Reading a few files of a wheel on the index without downloading the wheel.

The probes read a handful of members (a few Python sources, one METADATA, torch's arch list) out of wheels
of up to 900 MB. A wheel is a zip, and a zip can be read from its end: the central directory lists every
member with its offset, so HTTP range requests fetch the directory and then only the members asked for.
What is read is checked the way an installer checks an installed file: each member's sha256 against the
wheel's own RECORD (and zip's CRC-32), and the wheel's size against what the index and the server say.
The whole file's sha256, which the lock names, cannot be checked without the whole file: the lock's hash
picks the file (and keys the cache), RECORD vouches for each member read from it.

When a server answers a range request with the whole file (HTTP 200), ranges are refused: the caller
falls back to downloading the wheel (sha256-checked as before) and says so. `TRAFFIC` counts requests and
bytes for the benchmark.

Members are cached on disk under the wheel's sha256, so a warm run opens no connection at all.
"""

from __future__ import annotations

import gzip as _gzip
import hashlib
import http.client
import io
import json
import os
import queue
import socket
import ssl
import struct
import threading
import urllib.parse
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlstack.core import wheelrecord
from rlstack.core.errors import RlstackError

MIN_FETCH = 64 * 1024  # one round trip covers a local header, its name and most source files
BIG_MEMBER = 4 * 1024 * 1024  # larger members (shared libraries) are not kept on disk: facts from them are
FETCH_CHUNK = 1024 * 1024  # prefetch splits spans into requests of this size, run on PARALLEL connections:
TAIL = 512 * 1024  # the first request: a wheel's end, which holds its central directory and usually RECORD
PARALLEL = 6  # a CDN edge that has to fetch a part from its origin serves each connection slowly


class RangesRefused(RlstackError):
    """The server sent the whole file for a range request: read the wheel whole instead."""


@dataclass
class Traffic:
    """What the probes fetched in this process: for the benchmark and for the 'downloaded' evidence line."""

    requests: int = 0
    bytes: int = 0
    whole_wheels: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, n: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes += n

    def as_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "bytes": self.bytes, "whole_wheels": list(self.whole_wheels),
                "ranges_refused_by": sorted(self.refused)}


TRAFFIC = Traffic()
_IDLE: dict[tuple[str, str], list[http.client.HTTPConnection]] = {}
_IDLE_LOCK = threading.Lock()


DNS_HEDGE_S = 1.0  # a lookup not answered by then is sent again (see _resolve)
_DNS: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
_DNS_LOCK = threading.Lock()


def _resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    """getaddrinfo, once per host for the process, hedged: the resolver here loses about one answer in 30 and
    then waits its 5 s timeout before asking again (measured: a cold probe-fp8 took 7 s instead of 3 when a
    connection hit it). A lookup still unanswered after DNS_HEDGE_S is sent again and the first answer wins;
    TLS still verifies the certificate against the host name."""
    key = (host, port)
    with _DNS_LOCK:
        if key in _DNS:
            return _DNS[key]
    answers: queue.Queue[list[tuple[Any, ...]] | OSError] = queue.Queue()

    def look() -> None:
        try:
            answers.put(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            answers.put(exc)

    threading.Thread(target=look, daemon=True).start()
    sent = 1
    try:
        got = answers.get(timeout=DNS_HEDGE_S)
    except queue.Empty:
        threading.Thread(target=look, daemon=True).start()
        sent += 1
        got = answers.get()
    if isinstance(got, OSError) and sent == 2:  # the other lookup may still answer
        got = answers.get()
    if isinstance(got, OSError):
        raise got
    with _DNS_LOCK:
        _DNS[key] = got
    return got


def _create_connection(address: tuple[str, int], timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
                       source_address: tuple[str, int] | None = None) -> socket.socket:
    """socket.create_connection over _resolve's cached, hedged lookup (what http.client calls to connect)."""
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in _resolve(host, port):
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error or OSError(f"cannot connect to {host}:{port}")


def _connection(scheme: str, host: str, ctx_factory: Callable[[], ssl.SSLContext]) -> http.client.HTTPConnection:
    """An idle persistent connection to (scheme, host), or a new one: a TLS handshake costs more round trips
    than a small member's bytes, and the probes' thread pools come and go (each fetch_sources and prefetch
    has its own), so connections are shared by the process, not kept per thread. Give it back with _release
    after a response was read whole."""
    with _IDLE_LOCK:
        idle = _IDLE.get((scheme, host))
        if idle:
            return idle.pop()
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, timeout=120, context=ctx_factory())
    else:
        conn = http.client.HTTPConnection(host, timeout=120)
    conn._create_connection = _create_connection  # type: ignore[attr-defined]
    return conn


def _release(scheme: str, host: str, conn: http.client.HTTPConnection) -> None:
    with _IDLE_LOCK:
        _IDLE.setdefault((scheme, host), []).append(conn)


def _drop_idle(scheme: str, host: str) -> None:
    with _IDLE_LOCK:
        idle = _IDLE.pop((scheme, host), [])
    for c in idle:
        c.close()


def http_get(url: str, *, start: int | None = None, end: int | None = None, accept: str | None = None,
             ctx_factory: Callable[[], ssl.SSLContext] | None = None, gzip: bool = False
             ) -> tuple[int, dict[str, str], bytes]:
    """GET url (bytes start..end inclusive when given; start<0 = the last -start bytes). Follows redirects;
    retries once on a connection the server closed. file:// URLs read the local file (ranges honoured).
    `gzip`: accept a gzip-encoded body (never with ranges: those are offsets into the file) and return it
    decoded; TRAFFIC counts the bytes on the wire."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        data = Path(urllib.parse.unquote(parts.path)).read_bytes()
        if start is None:
            TRAFFIC.add(len(data))
            return 200, {"content-length": str(len(data))}, data
        lo = max(0, len(data) + start) if start < 0 else start
        hi = len(data) - 1 if end is None or start < 0 else min(end, len(data) - 1)
        body = data[lo: hi + 1]
        TRAFFIC.add(len(body))
        return 206, {"content-range": f"bytes {lo}-{hi}/{len(data)}"}, body
    from rlstack.probes.wheels import ssl_context

    headers = {"User-Agent": "rlstack-probes",
               "Accept-Encoding": "gzip" if gzip and start is None else "identity"}
    if accept:
        headers["Accept"] = accept
    if start is not None:
        headers["Range"] = f"bytes={start}-" if start < 0 or end is None else f"bytes={start}-{end}"
        if start < 0:
            headers["Range"] = f"bytes={start}"
    for attempt in range(3):
        conn = _connection(parts.scheme, parts.netloc, ctx_factory or ssl_context)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        except (http.client.HTTPException, OSError):
            conn.close()  # a connection the server closed while idle: its idle peers likely are closed too,
            _drop_idle(parts.scheme, parts.netloc)  # so the retry opens a fresh one
            if attempt == 2:
                raise
            continue
        if resp.will_close:
            conn.close()
        else:
            _release(parts.scheme, parts.netloc, conn)
        got = {k.lower(): v for k, v in resp.getheaders()}
        TRAFFIC.add(len(body))
        if resp.status in (301, 302, 303, 307, 308) and "location" in got:
            return http_get(urllib.parse.urljoin(url, got["location"]), start=start, end=end, accept=accept,
                            ctx_factory=ctx_factory, gzip=gzip)
        if got.get("content-encoding", "").lower() == "gzip":
            body = _gzip.decompress(body)
        return resp.status, got, body
    raise OSError(f"cannot fetch {url}")  # pragma: no cover - the loop returns or raises


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP range requests, remembering every span it fetched: zipfile reads
    the central directory and single members through it as it would from disk."""

    def __init__(self, url: str, size: int | None = None) -> None:
        self.url = url
        self.spans: list[tuple[int, bytes]] = []
        self._spans_lock = threading.Lock()  # prefetch's threads append while another may read
        self.pos = 0
        if size is None:
            size = self._probe_size()
        else:
            # the central directory and the .dist-info files (written last) in one request
            self.size = size
            self.fetch(max(0, size - TAIL), size)
        self.size = size

    def _probe_size(self) -> int:
        status, headers, body = http_get(self.url, start=-TAIL)
        if status != 206:
            raise RangesRefused(f"{self.url}: the server does not serve byte ranges (HTTP {status})")
        total = int(headers["content-range"].rsplit("/", 1)[1])
        self.spans.append((total - len(body), body))
        return total

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def _cached(self, lo: int, hi: int) -> bytes | None:
        """Bytes [lo, hi) from the spans fetched so far, joined across neighbouring spans (prefetch fetches a
        large member as several parallel chunks; a read across their seams must not fetch it again)."""
        if lo >= hi:
            return b""
        with self._spans_lock:
            spans = sorted(self.spans, key=lambda sp: sp[0])
        parts: list[bytes] = []
        pos = lo
        for start, data in spans:
            end = start + len(data)
            if start <= pos < end:
                take = data[pos - start: min(hi, end) - start]
                parts.append(take)
                pos += len(take)
                if pos >= hi:
                    return parts[0] if len(parts) == 1 else b"".join(parts)
            elif start > pos:
                break
        return None

    def fetch(self, lo: int, hi: int) -> None:
        """Bring bytes [lo, hi) into the span cache with one request."""
        hi = min(hi, self.size)
        if lo >= hi or self._cached(lo, hi) is not None:
            return
        status, headers, body = http_get(self.url, start=lo, end=hi - 1)
        if status != 206:
            raise RangesRefused(f"{self.url}: the server does not serve byte ranges (HTTP {status})")
        total = headers.get("content-range", "").rsplit("/", 1)[-1]
        if total.isdigit() and int(total) != self.size:
            raise RlstackError(f"{self.url}: the server says the file has {total} bytes, the index {self.size}",
                               "the file changed on the index; re-lock before trusting it")
        with self._spans_lock:
            self.spans.append((lo, body))

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        lo, hi = self.pos, min(self.pos + n, self.size)
        data = self._cached(lo, hi)
        if data is None:
            self.fetch(lo, max(hi, lo + MIN_FETCH))
            data = self._cached(lo, hi) or b""
        self.pos += len(data)
        return data

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _directory_and_record(raw: RangeFile) -> None:
    """When the first request (the wheel's last TAIL bytes) did not reach back to the start of the central
    directory (torch's is over 1 MB), fetch the rest of it, and as many bytes again before it, in one request:
    RECORD is written just before the directory and is about its size, so the directory and RECORD cost one
    round trip instead of three (directory, RECORD's local header, RECORD's data). zipfile then reads both
    from the spans. A zip64 or unusual end record is left to zipfile to read as it would."""
    if not raw.spans:
        return
    start, tail = raw.spans[-1]
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return
    cd_size, cd_offset = struct.unpack("<II", tail[at + 12: at + 20])
    if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF or cd_offset >= start:
        return  # zip64, or the directory is already in the tail
    raw.fetch(max(0, cd_offset - cd_size), start)


def _record_matches(data: bytes, field: str) -> bool:
    """Whether bytes match RECORD's hash field 'sha256=<urlsafe base64, no padding>' (PEP 376/427). A field
    in another algorithm vouches for nothing this checks, as before: it passes (wheels write sha256)."""
    algo, _, b64 = field.partition("=")
    if algo != "sha256" or not b64:
        return True
    return wheelrecord.b64_digest(hashlib.sha256(data).digest()) == b64.rstrip("=")


class RemoteWheel:
    """A wheel on the index, read member by member (RangeFile + zipfile), each member checked against the
    wheel's RECORD and cached under the wheel's sha256. `fallback` downloads the whole wheel (checked against
    the lock's sha256) when the server refuses ranges; from then on members come from that file."""

    def __init__(self, filename: str, url: str, sha256: str, size: int | None, root: Path,
                 fallback: Callable[[], Path] | None = None) -> None:
        self.filename, self.url, self.sha256, self.size = filename, url, sha256, size
        self.dir = root / sha256
        self.fallback = fallback
        self._zip: zipfile.ZipFile | None = None
        self._raw: RangeFile | None = None  # kept across close(): its spans hold what was fetched
        self._whole: Path | None = None
        self._names: list[str] | None = None
        self._record: dict[str, str | None] | None = None
        self._nameset: frozenset[str] | None = None
        self._pack: zipfile.ZipFile | None = None
        self._pack_names: frozenset[str] = frozenset()
        self._lock = threading.RLock()
        pack = self.dir / "sources.zip"
        if pack.is_file():
            self._open_pack(pack)

    def _open_pack(self, pack: Path) -> None:
        self._pack = zipfile.ZipFile(pack)
        self._pack_names = frozenset(self._pack.namelist())

    def __fspath__(self) -> str:  # so a caller that wants a name for messages can use os.fspath
        return self.filename

    @property
    def name(self) -> str:
        return self.filename

    @property
    def key(self) -> str:
        """Names this file's content for caches in memory: the lock's sha256."""
        return self.sha256

    def _open(self) -> zipfile.ZipFile:
        with self._lock:
            return self._open_locked()

    def _open_locked(self) -> zipfile.ZipFile:
        if self._zip is None and self._whole is not None:
            self._zip = zipfile.ZipFile(self._whole)
        if self._zip is None:
            try:
                if self._raw is None:
                    self._raw = RangeFile(self.url, self.size)
                    _directory_and_record(self._raw)
                self._zip = zipfile.ZipFile(self._raw)
            except RangesRefused:
                host = urllib.parse.urlsplit(self.url).netloc
                TRAFFIC.refused.add(host)
                if self.fallback is None:
                    raise
                self._whole = self.fallback()
                TRAFFIC.whole_wheels.append(self.filename)
                self._zip = zipfile.ZipFile(self._whole)
        return self._zip

    def names(self) -> list[str]:
        if self._names is None:
            path = self.dir / "names.json"
            if path.is_file():
                self._names = list(json.loads(path.read_text()))
            else:
                with self._lock:
                    self._names = self._open().namelist()
                write_text(path, json.dumps(self._names))
        return self._names

    def _dist_info(self) -> str | None:
        return next((n.split("/")[0] for n in self.names() if n.endswith(".dist-info/RECORD") and n.count("/") == 1),
                    None)

    def record(self) -> dict[str, str | None]:
        """{member: its RECORD hash field, e.g. 'sha256=<urlsafe base64>' (None where RECORD lists none: RECORD
        itself)} from the wheel's RECORD. Kept as written and compared when a member is read: torch's RECORD
        lists 16,000 files, of which the probes read a handful."""
        if self._record is None:
            info = self._dist_info()
            if info is None:
                raise RlstackError(f"{self.filename}: no .dist-info/RECORD", "not a valid wheel")
            text = self._member(f"{info}/RECORD", None).decode("utf-8")
            self._record = {name: f"{algo}={digest}" if algo else None
                            for name, (algo, digest) in wheelrecord.parse(text).items()}
        return self._record

    def _member(self, member: str, digest: str | None, keep: bool = True) -> bytes:
        if member in self._pack_names and self._pack is not None:
            with self._lock:
                return self._pack.read(member)
        cached = self.dir / "m" / member
        if ".." not in member.split("/") and cached.is_file():
            return cached.read_bytes()
        with self._lock:
            z = self._open()
            data = z.read(member)  # zipfile checks the CRC-32
        if digest is not None and not _record_matches(data, digest):
            raise RlstackError(f"{self.filename}: {member} does not match the wheel's RECORD",
                               "the index served other bytes than the wheel holds; do not use it")
        if keep and len(data) <= BIG_MEMBER and ".." not in member.split("/"):
            cached.parent.mkdir(parents=True, exist_ok=True)
            _write_bytes(cached, data)
        return data

    def read(self, member: str, *, keep: bool = True) -> bytes | None:
        """A member's bytes, checked against RECORD; None when the wheel has no such member."""
        if self._nameset is None:
            self._nameset = frozenset(self.names())
        if member not in self._nameset:
            return None
        rec = self.record()
        if member not in rec and not member.endswith("/RECORD"):
            raise RlstackError(f"{self.filename}: {member} is not listed in the wheel's RECORD",
                               "a member RECORD does not vouch for is not read")
        return self._member(member, rec.get(member), keep)

    def prefetch(self, members: list[str]) -> None:
        """Fetch the members not cached yet in as few range requests as their offsets allow (neighbours
        closer than MIN_FETCH share a request): reading a whole package's sources costs a few round trips."""
        todo = [m for m in members if not (self.dir / "m" / m).is_file() and m not in self._pack_names]
        if not todo:
            return
        with self._lock:
            self._fetch(self._open(), todo)

    @staticmethod
    def _fetch(z: zipfile.ZipFile, members: list[str]) -> None:
        """Bring the members' bytes into the RangeFile's spans: neighbours closer than MIN_FETCH share a span,
        spans are cut into FETCH_CHUNK requests run on PARALLEL connections. Nothing to do on a whole wheel."""
        raw = z.fp
        if not isinstance(raw, RangeFile):
            return
        infos = {i.filename: i for i in z.infolist()}
        spans = sorted((infos[m].header_offset, infos[m].header_offset + 30 + len(m.encode()) + 1024 +
                        infos[m].compress_size) for m in members if m in infos)
        merged: list[list[int]] = []
        for lo, hi in spans:
            if merged and lo - merged[-1][1] < MIN_FETCH:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        chunks = [(a, min(a + FETCH_CHUNK, hi, raw.size)) for lo, hi in merged for a in range(lo, hi, FETCH_CHUNK)]
        chunks = [c for c in chunks if c[0] < c[1] and raw._cached(*c) is None]
        if len(chunks) == 1:
            raw.fetch(*chunks[0])
        elif chunks:
            with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
                list(pool.map(lambda c: raw.fetch(*c), chunks))

    def prefetch_sources(self, suffixes: tuple[str, ...] = (".py",)) -> None:
        """Bring every member ending in `suffixes` (the Python sources) to the disk cache, each checked against
        RECORD: a few large range requests instead of one round trip per file the analysis opens."""
        if self._pack is not None:
            return
        members = [n for n in self.names() if n.endswith(suffixes)]
        self.prefetch(members)
        self.record()
        pack = self.dir / "sources.zip"
        tmp = pack.with_name(f"sources.{os.getpid()}-{threading.get_ident()}.part")
        pack.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as out:
            for m in members:
                data = self.read(m, keep=False)
                if data is not None:
                    out.writestr(m, data)
        os.replace(tmp, pack)
        self._open_pack(pack)

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None
        if self._pack is not None:
            self._pack.close()
            self._pack = None
            self._pack_names = frozenset()


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}-{threading.get_ident()}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> Path:
    """core.fileio.write_atomic in a folder made first (two threads writing one cache file are safe there)."""
    from rlstack.core.fileio import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text)
