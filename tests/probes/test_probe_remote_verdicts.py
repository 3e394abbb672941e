"""Cold probes read members, not wheels (HTTP ranges, each member checked against RECORD, whole-wheel fallback
where ranges are refused, PEP 658 metadata); and verdicts never look green by accident (a deciding probe
that cannot run is undecided, a wheel for another glibc says which platform to lock for, a stack that does
not resolve is a clean error, the header shows the stack's toolkit and the host's, deviations fold)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import json
import random
import threading
import time
import urllib.parse
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rlstack.core.errors import LockError, RlstackError
from rlstack.probes import remote, report, toolchain, wheels
from rlstack.probes.model import Environment, ProbeReport, ProbeResult
from rlstack.probes.remote import RemoteWheel
from rlstack.probes.wheels import SourceSet, WheelCache
from rlstack.stacks.locks import LockedPackage

PY, PLAT = "3.11", "x86_64-manylinux_2_28"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSTACK_CACHE", str(tmp_path / "cache"))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(path: Path, files: dict[str, bytes], *, lie_about: str | None = None, pad: int = 0) -> Path:
    """A wheel with a RECORD (sha256 of each member; `lie_about` gets a wrong one) and `pad` bytes of an
    incompressible member, so that reading one member is visibly less than reading the wheel."""
    name, version = path.name.split("-")[:2]
    info = f"{name}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                           "Requires-Dist: torch<2.11\n".encode()}
    if pad:
        files[f"{name}/blob.bin"] = random.Random(0).randbytes(pad)
    record = "".join(f"{m},sha256={_b64(b'tampered' if m == lie_about else d)},{len(d)}\n" for m, d in files.items())
    record += f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for m, d in files.items():
            z.writestr(m, d)
        z.writestr(f"{info}/RECORD", record)
    return path


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with byte ranges (as PyPI's CDN does); `ranges = False` ignores them (HTTP 200)."""

    ranges = True

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        if path.is_dir():  # an index listing (PEP 691 JSON), gzip-encoded when the client accepts it, as PyPI does
            data = (path / "index.json").read_bytes()
            zipped = "gzip" in self.headers.get("Accept-Encoding", "")
            body = gzip.compress(data) if zipped else data
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            if zipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        data = path.read_bytes()
        rng = self.headers.get("Range")
        if rng and self.ranges:
            spec = rng.split("=", 1)[1]
            lo_s, hi_s = spec.split("-")
            lo, hi = (len(data) - int(hi_s), len(data) - 1) if lo_s == "" else (int(lo_s), int(hi_s or len(data) - 1))
            body = data[lo: hi + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{lo + len(body) - 1}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(params=[True, False], ids=["ranges", "no-ranges"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, bool]]:
    root = tmp_path / "srv"
    root.mkdir()
    handler = type("H", (_RangeHandler,), {"ranges": request.param})

    def factory(*a: object, **k: object) -> http.server.SimpleHTTPRequestHandler:
        return handler(*a, directory=str(root), **k)  # type: ignore[arg-type]

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), factory)  # type: ignore[arg-type]
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root, request.param
    httpd.shutdown()


def refuse_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request the probes send (http, https and file URLs alike) fails the test."""
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"network used: {request.url}")

    monkeypatch.setattr(remote, "_CLIENT", httpx.Client(transport=httpx.MockTransport(refuse)))


def _index(tmp: Path, monkeypatch: pytest.MonkeyPatch, base_url: str, files: list[Path],
           metadata: dict[str, bytes] | None = None) -> None:
    """A PEP 691 index served by the test server at `base_url`/simple, whose file URLs point at `base_url`."""
    idx = tmp / "srv" / "simple" / "pkg"
    idx.mkdir(parents=True, exist_ok=True)
    entries = []
    for f in files:
        e: dict[str, object] = {"filename": f.name, "url": f"{base_url}/{f.name}", "size": f.stat().st_size,
                                "hashes": {"sha256": hashlib.sha256(f.read_bytes()).hexdigest()}}
        if metadata and f.name in metadata:
            e["core-metadata"] = {"sha256": hashlib.sha256(metadata[f.name]).hexdigest()}
        entries.append(e)
    (idx / "index.json").write_text(json.dumps({"files": entries}))
    monkeypatch.setattr(wheels, "INDEX_URL", f"{base_url}/simple")
    if base_url.startswith("file:"):  # no server: the listing is read from its folder
        monkeypatch.setattr(wheels, "_listing", lambda url: json.loads(
            (Path(urllib.parse.urlsplit(url).path) / "index.json").read_text()))


def test_members_are_range_read_checked_and_cached(server: tuple[str, Path, bool], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url, root, ranges = server
    w = make_wheel(root / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b"X = 1\n", "pkg/a.py": b"Y = 2\n"},
                   pad=2_000_000)
    _index(tmp_path, monkeypatch, url, [w])
    digest = hashlib.sha256(w.read_bytes()).hexdigest()
    cache = WheelCache(root=tmp_path / "wheels", quiet=True)
    before = remote.TRAFFIC.bytes
    got = cache.open(LockedPackage("pkg", "1.0", frozenset({digest})), PY, PLAT)
    assert isinstance(got, RemoteWheel)
    src = SourceSet({"pkg": got})
    assert src.read("pkg", "pkg/a.py") == "Y = 2\n"
    fetched = remote.TRAFFIC.bytes - before
    if ranges:
        assert fetched < w.stat().st_size / 2  # the central directory and one member, not the 2 MB wheel
        assert not cache.downloaded
    else:  # refused: the whole wheel, checked against the lock's sha256, and said so
        assert cache.downloaded == [w.name] and w.name in remote.TRAFFIC.whole_wheels
    src.close()
    # warm: a new cache object reads the member without the network
    refuse_network(monkeypatch)
    again = WheelCache(root=tmp_path / "wheels", quiet=True).open(LockedPackage("pkg", "1.0", frozenset({digest})), PY,
                                                                   PLAT)
    assert SourceSet({"pkg": again}).read("pkg", "pkg/a.py") == "Y = 2\n"


def test_a_member_that_does_not_match_record_is_refused(tmp_path: Path) -> None:
    w = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/a.py": b"Y = 2\n", "pkg/b.py": b"Z = 3\n"},
                   lie_about="pkg/a.py")
    rw = RemoteWheel(w.name, w.as_uri(), "f" * 64, w.stat().st_size, tmp_path / "m")
    assert rw.read("pkg/b.py") == b"Z = 3\n"
    with pytest.raises(RlstackError, match="does not match the wheel's RECORD"):
        rw.read("pkg/a.py")
    assert rw.read("pkg/none.py") is None


def test_prefetched_sources_come_in_few_requests(tmp_path: Path) -> None:
    files = {f"pkg/m{i}.py": f"X{i} = {i}\n".encode() for i in range(200)}
    w = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", files)
    rw = RemoteWheel(w.name, w.as_uri(), "e" * 64, w.stat().st_size, tmp_path / "m")
    before = remote.TRAFFIC.requests
    rw.prefetch_sources()
    assert remote.TRAFFIC.requests - before <= 4
    assert (tmp_path / "m" / ("e" * 64) / "sources.zip").is_file()
    assert rw.read("pkg/m7.py") == b"X7 = 7\n"


def test_metadata_through_pep_658_when_the_index_serves_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = tmp_path / "srv"
    srv.mkdir()
    w = make_wheel(srv / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b""})
    meta = b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\nRequires-Dist: torch<2.12\n"
    (srv / (w.name + ".metadata")).write_bytes(meta)
    _index(tmp_path, monkeypatch, srv.as_uri(), [w], metadata={w.name: meta})
    text, problem = WheelCache(root=tmp_path / "wheels", quiet=True).metadata("pkg", "1.0", PY, PLAT)
    assert "torch<2.12" in text and problem is None  # the .metadata file, not the wheel's (torch<2.11)


def test_a_wheel_for_a_newer_glibc_names_the_platform_to_lock_for(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    srv = tmp_path / "srv"
    srv.mkdir()
    w = make_wheel(srv / "pkg-1.0-cp38-abi3-manylinux_2_31_x86_64.whl", {"pkg/__init__.py": b""})
    _index(tmp_path, monkeypatch, srv.as_uri(), [w])
    pkg = LockedPackage("pkg", "1.0", frozenset({hashlib.sha256(w.read_bytes()).hexdigest()}))
    cache = WheelCache(root=tmp_path / "wheels", quiet=True)
    with pytest.raises(wheels.WheelError) as err:
        cache.choose(pkg, PY, PLAT)
    assert "need manylinux_2_31" in err.value.message and "x86_64-manylinux_2_28" in err.value.message
    assert 'platform = "x86_64-manylinux_2_31"' in (err.value.hint or "")
    assert cache.platform_needed("pkg", "1.0", PY, PLAT) == "x86_64-manylinux_2_31"
    # the source is still readable for a static look (sources do not depend on glibc) when asked for
    assert cache.open(pkg, PY, PLAT, any_platform=True) is not None


def _report(results: list[ProbeResult], env: Environment | None = None) -> ProbeReport:
    return ProbeReport(stack="s", lock_hash="a" * 64, gpu_arch="sm_120", toolkit="12.8.61", host_toolkit="12.4.131",
                       torch_cuda="13.0", host="h", date="2026-12-03T00:00:00Z", layers=["contract"], results=results,
                       duration_s=0.1, environment=env)


def test_a_skipped_deciding_probe_is_undecided_and_not_a_pass() -> None:
    r = _report([ProbeResult(id="contract:a", layer="contract", status="pass", reason="ok"),
                 ProbeResult(id="contract:b", layer="contract", status="skip", undecided=True,
                             reason="undecided: cannot read vllm's locked wheel: needs manylinux_2_31")])
    assert r.exit_code == 3 and not r.failed
    text = report.verdict(r, "Q")
    assert "UNDECIDED" in text and "manylinux_2_31" in text and "no wall found" not in text
    assert "UNDECIDED" in report.table(r)
    # a skip that only says 'not applicable' is not undecided
    ok = _report([ProbeResult(id="contract:b", layer="contract", status="skip", reason="not applicable: x")])
    assert ok.exit_code == 0 and "no wall found" in report.verdict(ok, "Q")


def test_header_shows_the_stacks_toolkit_and_the_hosts_and_folds_deviations() -> None:
    devs = [f"pkg{i} {i}.0 (lock {i}.1)" for i in range(170)] + ["torch missing (lock 2.11.0)"]
    env = Environment(where="native", python="3.12.3", torch="2.11.0", torch_cuda="13.0", toolkit="12.4.131",
                      toolkit_from="nvcc on PATH", lock_match=False, deviations=devs, fingerprint="0" * 12)
    text = report.table(_report([], env))
    head = text.splitlines()[0]
    assert "toolkit 12.8.61 (stack.toml" in head and "host nvcc 12.4.131" in head
    assert "171 off-lock (1 missing, 170 at another version)" in text and "+168 more" in text
    assert len(text.splitlines()) < 10


def test_a_stack_that_does_not_resolve_is_a_clean_error(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlstack.probes import suite
    from rlstack.stacks import resolver

    (stack_tree / "images" / "cpu" / "requirements.lock").unlink()
    why = ("  x No solution found when resolving dependencies:\n  Because trl==0.24.0 depends on transformers>=4.56 "
           "and you require transformers==4.40.0, we can conclude that your requirements are unsatisfiable.")
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: resolver.Resolution(False, why, ["uv"]))
    with pytest.raises(LockError) as err:
        suite.run("cpu", layers=["contract"])
    assert "does not resolve" in err.value.message and "transformers==4.40.0" in err.value.message
    assert "invoke lock --stack cpu" in (err.value.hint or "")


def _torch_sources(tmp: Path, cuda: str) -> SourceSet:
    t = make_wheel(tmp / "torch-1-cp311-cp311-manylinux_2_28_x86_64.whl", {
        "torch/version.py": f"cuda: Optional[str] = '{cuda}'\n".encode(),
        "torch/utils/cpp_extension.py": b"def _check_cuda_version():\n"
                                        b"        if cuda_ver.major != torch_cuda_version.major:\n"
                                        b"            raise RuntimeError(CUDA_MISMATCH_MESSAGE)\n"})
    return SourceSet({"torch": t})


@pytest.mark.parametrize(("toolkit", "cuda", "status"), [
    ("12.8.61", "13.0", "fail"), ("12.9.86", "13.0", "fail"), ("13.0.88", "13.0", "pass"), ("13.1.80", "13.0", "pass"),
    ("12.8.61", "12.8", "pass"), (None, "13.0", "pass")])
def test_nvcc_must_have_torchs_cuda_major(tmp_path: Path, toolkit: str | None, cuda: str, status: str) -> None:
    rule = next(r for r in toolchain.load_rules() if r.kind == "toolkit_torch_major")
    res = toolchain.evaluate(rule, _torch_sources(tmp_path, cuda), gpu_arch="sm_120", toolkit=toolkit,
                             torch_cuda="12.8")
    assert res.status == status, res.reason
    assert res.evidence[0].file == "torch/utils/cpp_extension.py" and res.evidence[0].line == 2
    if status == "fail":
        assert res.signature == "cuda-toolkit-major-mismatch" and "torch is built for CUDA 13.0" in res.reason


def test_a_directory_beyond_the_first_request_comes_with_record_in_one_more(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's central directory is larger than the first request (the wheel's last TAIL bytes): the rest of
    it and RECORD (written just before it) come in one request, and every member is still checked."""
    monkeypatch.setattr(remote, "TAIL", 4096)
    files = {f"pkg/m{i}.py": f"X{i} = {i}\n".encode() for i in range(400)}  # a directory of ~20 KB
    w = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", files, lie_about="pkg/m3.py")
    rw = RemoteWheel(w.name, w.as_uri(), "d" * 64, w.stat().st_size, tmp_path / "m")
    before = remote.TRAFFIC.requests
    assert rw.read("pkg/m7.py") == b"X7 = 7\n"
    assert remote.TRAFFIC.requests - before <= 3  # tail, directory + RECORD, the member
    with pytest.raises(RlstackError, match="does not match the wheel's RECORD"):
        rw.read("pkg/m3.py")


def test_reads_across_the_seams_of_parallel_chunks_are_not_fetched_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "FETCH_CHUNK", 1024)
    w = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/a.py": b"A = 1\n"}, pad=20_000)
    rf = remote.RangeFile(w.as_uri(), w.stat().st_size)
    for lo in range(0, 8192, 1024):
        rf.fetch(lo, lo + 1024)
    before = remote.TRAFFIC.requests
    rf.seek(1000)
    assert rf.read(5000) == w.read_bytes()[1000:6000]  # spans five chunks
    assert remote.TRAFFIC.requests == before


def test_one_listing_per_package_when_two_stacks_ask_at_once(server: tuple[str, Path, bool], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """probe-fp8 runs fp8-report and fp8 side by side through one WheelCache: the index listing they share
    is fetched once (gzip-encoded on the wire, as PyPI serves it)."""
    url, root, _ = server
    w = make_wheel(root / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b""})
    _index(tmp_path, monkeypatch, url, [w])
    seen: list[str] = []
    real = httpx.HTTPTransport()

    def counting(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return real.handle_request(request)

    monkeypatch.setattr(remote, "_CLIENT", httpx.Client(transport=httpx.MockTransport(counting)))
    cache = WheelCache(root=tmp_path / "wheels", quiet=True)
    digest = hashlib.sha256(w.read_bytes()).hexdigest()
    pins = [LockedPackage("pkg", "1.0", frozenset({digest}))] * 4
    with ThreadPoolExecutor(max_workers=4) as pool:
        chosen = list(pool.map(lambda p: cache.choose(p, PY, PLAT), pins))
    assert {c["sha256"] for c in chosen} == {digest}
    assert [u for u in seen if u.endswith("/simple/pkg/")] == [f"{url}/simple/pkg/"]


def test_a_lost_dns_answer_costs_the_hedge_not_the_resolvers_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver here loses an answer now and then and waits 5 s to ask again: a lookup not answered within
    DNS_HEDGE_S is sent again, the first answer wins, and each host is looked up once per process."""
    stuck = threading.Event()
    calls: list[str] = []

    def getaddrinfo(host: str, port: int, **kw: object) -> list[tuple[object, ...]]:
        calls.append(host)
        if len(calls) == 1:
            stuck.wait(10)  # the lost answer
        return [(2, 1, 6, "", ("192.0.2.1", port))]

    monkeypatch.setattr(remote.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(remote, "DNS_HEDGE_S", 0.05)
    monkeypatch.setattr(remote, "_DNS", {})
    t0 = time.perf_counter()
    assert remote._resolve("files.example", 443)[0][4] == ("192.0.2.1", 443)
    assert time.perf_counter() - t0 < 2 and len(calls) == 2
    assert remote._resolve("files.example", 443) and len(calls) == 2  # cached
    stuck.set()


def test_connections_look_hosts_up_through_the_hedged_resolver(server: tuple[str, Path, bool],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared client connects to the addresses _resolve found (a name only it knows reaches the server), and
    TRAFFIC counts the request."""
    url, root, _ = server
    (root / "hello.txt").write_bytes(b"hello")
    port = int(url.rsplit(":", 1)[1])
    monkeypatch.setattr(remote, "_DNS", {("probe-host.invalid", port): [(2, 1, 6, "", ("127.0.0.1", port))]})
    monkeypatch.setattr(remote, "_CLIENT", None)  # a client of its own, closed below
    before = (remote.TRAFFIC.requests, remote.TRAFFIC.bytes)
    try:
        assert remote.http_get(f"http://probe-host.invalid:{port}/hello.txt")[::2] == (200, b"hello")
    finally:
        if remote._CLIENT is not None:
            remote._CLIENT.close()
    assert (remote.TRAFFIC.requests - before[0], remote.TRAFFIC.bytes - before[1]) == (1, 5)


def test_a_dropped_connection_is_tried_again_and_a_dead_network_says_what_to_do(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    """A keep-alive connection the server closed fails its next request: the request is sent again. When every
    try fails the error names the URL and the way out, and is still an OSError (the network's kind of failure)."""
    tries: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        tries.append(str(request.url))
        if len(tries) < remote.ATTEMPTS or "dead" in str(request.url):
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(206, headers={"Content-Range": "bytes 0-1/10"}, content=b"ab")

    monkeypatch.setattr(remote, "_CLIENT", httpx.Client(transport=httpx.MockTransport(flaky)))
    assert remote.http_get("https://files.example/ok.whl", start=0, end=1) == (
        206, {"content-range": "bytes 0-1/10", "content-length": "2"}, b"ab")
    assert len(tries) == remote.ATTEMPTS
    tries.clear()
    with pytest.raises(remote.FetchError) as err:
        remote.http_get("https://files.example/dead.whl")
    assert "cannot fetch https://files.example/dead.whl: RemoteProtocolError" in err.value.message
    assert "RLSTACK_CACHE" in (err.value.hint or "")
    assert len(tries) == remote.ATTEMPTS and isinstance(err.value, OSError)


def test_file_urls_are_served_like_an_index_serves_them(tmp_path: Path) -> None:
    """Byte ranges (a suffix, an open end, past the end) as a server answers them, the whole file, and 404."""
    f = tmp_path / "a b.whl"
    f.write_bytes(b"0123456789")
    u = f.as_uri()
    assert remote.http_get(u, start=-3) == (206, {"content-range": "bytes 7-9/10", "content-length": "3"}, b"789")
    assert remote.http_get(u, start=8)[2] == b"89"
    assert remote.http_get(u, start=2, end=20)[::2] == (206, b"23456789")
    assert remote.http_get(u)[::2] == (200, b"0123456789")
    assert remote.http_get((tmp_path / "none.whl").as_uri())[0] == 404
