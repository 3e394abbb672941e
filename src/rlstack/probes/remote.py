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

HTTP itself is httpx's: one client for the process (keep-alive connections shared by every thread, redirects,
gzip, timeouts, TLS against the machine's CA bundle). What stays here is what httpx does not know about:
ranges as a seekable file, RECORD checks, the member cache, traffic accounting, retries whose error says
what to do next, and a hedged DNS lookup. httpx is imported where it is used: importing it costs 0.3 s.

Members are cached on disk under the wheel's sha256, so a warm run opens no connection at all.
"""

from __future__ import annotations

import hashlib
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
from functools import lru_cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rlstack.core import wheelrecord
from rlstack.core.errors import RlstackError

if TYPE_CHECKING:
    import httpx

MIN_FETCH = 64 * 1024  # one round trip covers a local header, its name and most source files
BIG_MEMBER = 4 * 1024 * 1024  # larger members (shared libraries) are not kept on disk: facts from them are
FETCH_CHUNK = 1024 * 1024  # prefetch splits spans into requests of this size, run on PARALLEL connections:
TAIL = 512 * 1024  # the first request: a wheel's end, which holds its central directory and usually RECORD
PARALLEL = 6  # a CDN edge that has to fetch a part from its origin serves each connection slowly
TIMEOUT_S = 120.0  # connect, and each read of a response: a cold CDN edge can be slow, a dead one is not waited on
ATTEMPTS = 3  # tries of one request when the network fails
KEEP_IDLE = 64  # idle connections kept for reuse: the suite reads 8 wheels at once, PARALLEL connections each
OFFLINE_HINT = ("check the network (the index, PyPI or RLSTACK_INDEX_URL, must be reachable), or run where the "
                "wheel cache (RLSTACK_CACHE) is already warm")


class RangesRefused(RlstackError):
    """The server sent the whole file for a range request: read the wheel whole instead."""


class FetchError(RlstackError, OSError):
    """A request that failed on the network ATTEMPTS times, with what to do next. An OSError as well, as the
    socket errors it replaces were: callers that treat the network as one kind of failure still do."""


@dataclass
class Traffic:
    """What the probes fetched in this process: for the benchmark and for the 'downloaded' evidence line."""

    requests: int = 0
    bytes: int = 0
    whole_wheels: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, n: int, requests: int = 1) -> None:
        with self.lock:
            self.requests += requests
            self.bytes += n

    def count(self, resp: httpx.Response) -> None:
        """A response read whole, and the redirects before it (httpx followed them), as they went on the wire."""
        self.add(sum(r.num_bytes_downloaded for r in (*resp.history, resp)), 1 + len(resp.history))

    def as_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "bytes": self.bytes, "whole_wheels": list(self.whole_wheels),
                "ranges_refused_by": sorted(self.refused)}


TRAFFIC = Traffic()


def ssl_context() -> ssl.SSLContext:
    """TLS verified against the machine's CA bundle where one is set (rlstack.stacks.settings)."""
    from rlstack.stacks import settings

    ca = settings.ca_cert()
    return _context(str(ca) if ca and ca.is_file() else None)


@lru_cache(maxsize=4)
def _context(cafile: str | None) -> ssl.SSLContext:
    """One SSLContext per CA bundle for the process: loading a bundle costs tens of milliseconds of CPU."""
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


DNS_HEDGE_S = 1.0  # a lookup not answered by then is sent again (see _resolve)
_DNS: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
_DNS_LOCK = threading.Lock()


def _resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    """getaddrinfo, once per host for the process, hedged: the resolver here loses about one answer in 30 and
    then waits its 5 s timeout before asking again (measured: a cold probe-fp8 took 7 s instead of 3 when a
    connection hit it). A lookup still unanswered after DNS_HEDGE_S is sent again and the first answer wins;
    TLS still verifies the certificate against the host name. Ours because neither httpx nor httpcore caches
    or hedges lookups: each new connection asks the resolver again."""
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


def _serve_file(request: httpx.Request) -> httpx.Response:
    """A file:// URL (a local mirror's wheels, the tests' wheels) answered as a server answers: a byte range
    with 206 and Content-Range, else the whole file; 404 when there is no such file. httpx speaks http(s) only."""
    import httpx

    try:
        data = Path(urllib.parse.unquote(request.url.raw_path.decode())).read_bytes()
    except FileNotFoundError:
        return httpx.Response(404)
    spec = request.headers.get("range", "").removeprefix("bytes=")
    if not spec:
        return httpx.Response(200, content=data)
    lo_s, _, hi_s = spec.partition("-")
    lo = max(0, len(data) - int(hi_s)) if not lo_s else int(lo_s)
    hi = len(data) - 1 if not lo_s or not hi_s else min(int(hi_s), len(data) - 1)
    return httpx.Response(206, headers={"Content-Range": f"bytes {lo}-{hi}/{len(data)}"}, content=data[lo: hi + 1])


def _new_client() -> httpx.Client:
    """An httpx client whose connections resolve host names through _resolve. httpx takes no DNS hook, so its
    transport's connection pool is replaced by httpcore's own pool over a network backend that connects to the
    addresses _resolve found (httpx's `_pool` is its one private name used here)."""
    import httpcore
    import httpx

    class HedgedDNS(httpcore.SyncBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> httpcore.NetworkStream:
            try:
                addresses = _resolve(host, port)
            except OSError as exc:
                raise httpcore.ConnectError(f"cannot look up {host}: {exc}") from exc
            error: httpcore.ConnectError | None = None
            for *_, sockaddr in addresses:
                try:
                    return super().connect_tcp(sockaddr[0], port, timeout, local_address, socket_options)
                except httpcore.ConnectError as exc:
                    error = exc
            raise error or httpcore.ConnectError(f"cannot connect to {host}:{port}")

    ctx = ssl_context()
    transport = httpx.HTTPTransport(verify=ctx)
    transport._pool = httpcore.ConnectionPool(  # no cap on connections; idle ones kept until the server closes them
        ssl_context=ctx, max_connections=None, max_keepalive_connections=KEEP_IDLE, network_backend=HedgedDNS())
    files = httpx.MockTransport(_serve_file)  # httpx's transport over a function, despite its name
    return httpx.Client(transport=transport, mounts={"file://": files}, verify=ctx,
                        timeout=TIMEOUT_S, follow_redirects=True,  # identity: ranges are offsets into the stored file
                        headers={"User-Agent": "rlstack-probes", "Accept-Encoding": "identity"})


_CLIENT: httpx.Client | None = None  # tests put one over httpx.MockTransport here
_CLIENT_LOCK = threading.Lock()


def client() -> httpx.Client:
    """The process's one client: a TLS handshake costs more round trips than a small member's bytes, and the
    probes' thread pools come and go (each prefetch has its own), so connections are shared by the process."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None:
            _CLIENT = _new_client()
        return _CLIENT


def _send(url: str, headers: dict[str, str], *, stream: bool = False, timeout: float = TIMEOUT_S) -> httpx.Response:
    """One GET through the shared client, tried ATTEMPTS times when the network fails: a keep-alive connection
    that the server closed while it sat idle fails its next request (httpx's own `retries` covers only
    connecting). A file:// URL is named with its host (RFC 8089's 'localhost'): httpx reads one without a host
    as a relative URL."""
    import httpx

    c = client()
    target = "file://localhost/" + url.removeprefix("file:///") if url.startswith("file:///") else url
    error: Exception | None = None
    for _ in range(ATTEMPTS):
        try:
            return c.send(c.build_request("GET", target, headers=headers, timeout=timeout), stream=stream)
        except (httpx.TransportError, OSError) as exc:
            error = exc
    raise FetchError(f"cannot fetch {url}: {type(error).__name__}: {error}", OFFLINE_HINT) from error


def http_get(url: str, *, start: int | None = None, end: int | None = None, accept: str | None = None,
             gzip: bool = False) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of GET url; bytes start..end inclusive when given (start<0:
    the last -start bytes). `gzip`: accept a gzip-encoded body (never with ranges: those are offsets into the
    file), returned decoded; TRAFFIC counts the bytes on the wire. Raises FetchError when the network fails."""
    headers = {"Accept-Encoding": "gzip"} if gzip and start is None else {}
    if accept:
        headers["Accept"] = accept
    if start is not None:
        headers["Range"] = f"bytes={start}" if start < 0 else f"bytes={start}-{'' if end is None else end}"
    resp = _send(url, headers)
    TRAFFIC.count(resp)
    return resp.status_code, dict(resp.headers), resp.content


def download(url: str, out: IO[bytes], *, timeout: float = 300) -> str:
    """Stream url's body into `out` (a whole wheel: hundreds of MB, never held in memory) and return its sha256
    (hex). Raises FetchError when the network fails or the server answers other than 200."""
    import httpx

    h = hashlib.sha256()
    resp = _send(url, {}, stream=True, timeout=timeout)
    try:
        if resp.status_code != 200:
            raise FetchError(f"cannot fetch {url}: HTTP {resp.status_code}", OFFLINE_HINT)
        for chunk in resp.iter_bytes(1 << 22):
            h.update(chunk)
            out.write(chunk)
    except httpx.TransportError as exc:
        raise FetchError(f"cannot fetch {url}: {type(exc).__name__}: {exc}", OFFLINE_HINT) from exc
    finally:
        resp.close()
        TRAFFIC.count(resp)
    return h.hexdigest()


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
