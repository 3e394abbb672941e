"""The locked-wheel cache (tag choice, hash verification, offline warm cache) and the toolchain rules on
handmade wheels (a flashinfer-like rule source, a torch-like library with an arch list)."""

from __future__ import annotations

import hashlib
import json
import random
import urllib.parse
import zipfile
from pathlib import Path

import httpx
import pytest

from rlstack.probes import remote, toolchain, wheels
from rlstack.probes.wheels import SourceSet, WheelCache, WheelError, wheel_score
from rlstack.stacks.locks import LockedPackage, parse_locked

PY, PLAT = "3.11", "x86_64-manylinux_2_28"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSTACK_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize(("name", "ok"), [
    ("a-1.0-py3-none-any.whl", True),
    ("a-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", True),
    ("a-1.0-cp38-abi3-manylinux_2_24_x86_64.whl", True),
    ("a-1.0-cp311-cp311-manylinux2014_x86_64.whl", True),
    ("a-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", False),
    ("a-1.0-cp311-cp311-manylinux_2_35_x86_64.whl", False),  # newer glibc than the stack's platform
    ("a-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", False),
    ("a-1.0-cp311-cp311-win_amd64.whl", False),
    ("a-1.0.tar.gz", False),
])
def test_wheel_score_accepts_only_installable_wheels(name: str, ok: bool) -> None:
    assert (wheel_score(name, PY, PLAT) is not None) is ok


def test_wheel_score_prefers_specific_tag_and_higher_build() -> None:
    s = lambda n: wheel_score(n, PY, PLAT)  # noqa: E731
    assert s("a-1.0-cp311-cp311-manylinux_2_28_x86_64.whl") > s("a-1.0-py3-none-any.whl")
    assert s("a-1.0-1-cp38-abi3-manylinux_2_24_x86_64.whl") > s("a-1.0-cp38-abi3-manylinux_2_24_x86_64.whl")


def test_parse_locked_keeps_every_hash() -> None:
    text = ("# header\nfoo-bar==1.2 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 +
            "\n    # via x\nbaz==3 \\\n    --hash=sha256:" + "c" * 64 + "\n")
    got = parse_locked(text)
    assert got["foo-bar"].version == "1.2" and got["foo-bar"].hashes == {"a" * 64, "b" * 64}
    assert got["baz"].hashes == {"c" * 64}


def _local_index(tmp: Path, monkeypatch: pytest.MonkeyPatch, files: list[Path], served: dict[str, bytes] | None = None
                 ) -> None:
    """An index served from disk through file:// URLs (rlstack.probes.remote serves them like https)."""
    idx = tmp / "index" / "pkg"
    idx.mkdir(parents=True)
    entries = [{"filename": f.name, "url": f.as_uri(), "hashes": {"sha256": hashlib.sha256(f.read_bytes()).hexdigest()}}
               for f in files]
    (idx / "index.json").write_text(json.dumps({"files": entries}))
    monkeypatch.setattr(wheels, "INDEX_URL", (tmp / "index").as_uri())
    monkeypatch.setattr(wheels, "_listing", lambda url: json.loads(
        (Path(urllib.parse.urlsplit(url).path) / "index.json").read_text()))


def _wheel(tmp: Path, filename: str, files: dict[str, bytes | str]) -> Path:
    p = tmp / "srv" / filename
    p.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(p, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return p


def test_fetch_verifies_hash_picks_platform_and_then_works_offline(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    good = _wheel(tmp_path, "pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", {"pkg/__init__.py": "X = 1\n"})
    arm = _wheel(tmp_path, "pkg-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", {"pkg/__init__.py": "X = 2\n"})
    _local_index(tmp_path, monkeypatch, [good, arm])
    hashes = frozenset(hashlib.sha256(p.read_bytes()).hexdigest() for p in (good, arm))
    cache = WheelCache(root=tmp_path / "wheels", quiet=True)
    got = cache.fetch(LockedPackage("pkg", "1.0", hashes), PY, PLAT)
    assert got.name == good.name and cache.downloaded == [good.name]
    assert SourceSet({"pkg": got}).read("pkg", "pkg/__init__.py") == "X = 1\n"
    # warm: no network needed at all
    refuse = httpx.MockTransport(lambda request: (_ for _ in ()).throw(AssertionError(f"network used: {request.url}")))
    monkeypatch.setattr(remote, "_CLIENT", httpx.Client(transport=refuse))  # every URL the probes fetch, file:// too
    monkeypatch.setattr(wheels, "_listing", lambda *a, **k: (_ for _ in ()).throw(AssertionError("network used")))
    assert WheelCache(root=tmp_path / "wheels", quiet=True).fetch(LockedPackage("pkg", "1.0", hashes), PY, PLAT) == got


def test_fetch_rejects_bytes_that_are_not_the_locked_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _wheel(tmp_path, "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": ""})
    _local_index(tmp_path, monkeypatch, [w])
    digest = hashlib.sha256(w.read_bytes()).hexdigest()
    w.write_bytes(w.read_bytes() + b"tampered")  # the index still lists the old hash
    with pytest.raises(WheelError, match="is not the locked"):
        WheelCache(root=tmp_path / "wheels", quiet=True).fetch(LockedPackage("pkg", "1.0", frozenset({digest})), PY,
                                                               PLAT)
    assert not list((tmp_path / "wheels").glob("*.whl"))


def test_fetch_without_a_matching_locked_wheel_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _wheel(tmp_path, "pkg-1.0-cp311-cp311-win_amd64.whl", {"pkg/__init__.py": ""})
    _local_index(tmp_path, monkeypatch, [w])
    digest = hashlib.sha256(w.read_bytes()).hexdigest()
    with pytest.raises(WheelError, match="no wheel of pkg==1.0"):
        WheelCache(root=tmp_path / "wheels", quiet=True).choose(LockedPackage("pkg", "1.0", frozenset({digest})), PY,
                                                                PLAT)


# --- toolchain -------------------------------------------------------------------------------------------

FI_SRC = "def norm(major):\n    if major == 12:\n        raise RuntimeError(\"SM 12.x requires CUDA >= 12.9\")\n"


def _rules() -> dict[str, toolchain.Rule]:
    return {r.id: r for r in toolchain.load_rules()}


def _sources(tmp: Path, fi_src: str = FI_SRC, archs: bytes = b"sm_75 sm_80 sm_86 sm_90 sm_100 sm_120") -> SourceSet:
    fi = _wheel(tmp, "flashinfer_python-1-py3-none-any.whl",
                {"flashinfer/compilation_context.py": fi_src, "flashinfer/jit/cpp_ext.py": "def get_cuda_version():\n"})
    lib = b"\x00" * 5000 + b"_cxx11_abi_1\x00" + archs + b"\x00" + b"\x01" * 5000
    torch = _wheel(tmp, "torch-1-cp311-cp311-manylinux_2_28_x86_64.whl",
                   {"torch/cuda/__init__.py": "def _check_capability():\n    pass\n",
                    "torch/lib/libtorch_python.so": lib})
    return SourceSet({"flashinfer-python": fi, "torch": torch})


@pytest.mark.parametrize(("arch", "toolkit", "status"), [
    ("sm_120", "12.8.61", "fail"), ("sm_120", "12.9.86", "pass"), ("sm_120", "13.0.48", "pass"),
    ("sm_90", "12.8.61", "pass"),
])
def test_flashinfer_rule_reads_threshold_from_the_wheel(tmp_path: Path, arch: str, toolkit: str, status: str) -> None:
    res = toolchain.evaluate(_rules()["flashinfer-sm12x-nvcc"], _sources(tmp_path), gpu_arch=arch, toolkit=toolkit,
                             torch_cuda="13.0")
    assert res.status == status, res.reason
    assert res.evidence[0].file == "flashinfer/compilation_context.py" and res.evidence[0].line == 3
    if status == "fail":
        assert res.signature == "flashinfer-sm12x-cuda" and res.fix


def test_flashinfer_rule_threshold_follows_the_source(tmp_path: Path) -> None:
    src = FI_SRC.replace("12.9", "13.1")
    res = toolchain.evaluate(_rules()["flashinfer-sm12x-nvcc"], _sources(tmp_path, src), gpu_arch="sm_120",
                             toolkit="12.9.86", torch_cuda="13.0")
    assert res.status == "fail" and "13.1" in res.reason


def test_rule_skips_when_its_source_is_gone(tmp_path: Path) -> None:
    res = toolchain.evaluate(_rules()["flashinfer-sm12x-nvcc"], _sources(tmp_path, "def norm(): pass\n"),
                             gpu_arch="sm_120", toolkit="12.8.61", torch_cuda="13.0")
    assert res.status == "skip"


@pytest.mark.parametrize(("archs", "target", "status"), [
    (b"sm_75 sm_80 sm_86 sm_90 sm_100 sm_120", "sm_120", "pass"),
    (b"sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90", "sm_120", "fail"),
    (b"sm_80 sm_90 compute_90", "sm_120", "pass"),  # PTX JIT-compiles forward
    (b"sm_80 sm_86 sm_90", "sm_89", "pass"),  # same major, lower minor cubin
])
def test_torch_arch_list_read_without_a_gpu(tmp_path: Path, archs: bytes, target: str, status: str) -> None:
    src = _sources(tmp_path, archs=archs)
    res = toolchain.evaluate(_rules()["torch-compiled-arch"], src, gpu_arch=target, toolkit=None, torch_cuda="13.0",
                             torch_wheel=src.wheels["torch"])
    assert res.status == status, res.reason
    assert archs.decode() in res.evidence[-1].text


def test_arch_list_scan_finds_what_the_regex_finds_over_the_whole_library() -> None:
    """The scan runs the regex only around ' sm_' / ' compute_'; on a blob with noise, decoys and lists at
    both ends it picks what the regex over every byte picks."""
    rnd = random.Random(1)
    noise = bytes(rnd.randrange(256) for _ in range(50_000))
    blob = (b"sm_80 sm_90" + noise + b"\x00compute_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120\x00" + noise
            + b"sm_1 xsm_50 msm_60" + noise[:100] + b"\x00sm_50 sm_60 compute_70")
    full: list[str] = []
    for m in toolchain.ARCH_LIST_RE.finditer(blob):
        if len(m.group().split()) > len(full):
            full = m.group().decode().split()
    assert toolchain._arch_list(blob) == full == ["compute_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100",
                                                  "sm_120"]
    assert toolchain._arch_list(noise) == []


def test_shipped_rules_name_known_walls() -> None:
    from rlstack.probes import signatures

    ids = {s.id for s in signatures.load()}
    assert {r.wall for r in toolchain.load_rules()} <= ids


@pytest.mark.parametrize(("name", "ok"), [
    ("a-1.0-py2.py3-none-any.whl", True),  # compressed tag set
    ("a-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("a-1.0-cp311-cp311-manylinux1_x86_64.whl", True),
    ("a-1.0-cp311-abi3-any.whl", True),
    ("a-1.0-cp311-cp311-linux_x86_64.whl", False),  # not a manylinux promise
    ("a-1.0-pp310-pypy310_pp73-manylinux_2_28_x86_64.whl", False),
    ("a-1.0-py3-abi3-any.whl", False),
    ("a-1.0-cp3-abi3-manylinux_2_28_x86_64.whl", False),
    ("a-1.0-cp311-cp311-musllinux_1_2_x86_64.whl", False),
    ("a-1.0-x-py3-none-any.whl", False),  # a build tag must start with a digit
])
def test_wheel_score_follows_packaging_tags(name: str, ok: bool) -> None:
    assert (wheel_score(name, PY, PLAT) is not None) is ok


def test_wheel_score_order_matches_the_installers() -> None:
    s = lambda n: wheel_score(n, PY, PLAT)  # noqa: E731
    own = s("a-1.0-cp311-cp311-manylinux_2_17_x86_64.whl")
    stable = s("a-1.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    pure = s("a-1.0-py3-none-manylinux_2_28_x86_64.whl")
    assert own is not None and stable is not None and pure is not None
    assert own > stable > pure > s("a-1.0-py3-none-any.whl")  # type: ignore[operator]
    # within one interpreter tag, the newest glibc that fits wins; legacy aliases count as their glibc
    assert s("a-1.0-cp311-cp311-manylinux_2_28_x86_64.whl") > own
    assert s("a-1.0-cp311-cp311-manylinux2014_x86_64.whl") == own
    assert wheel_score("a-1.0-cp311-cp311-manylinux_2_34_x86_64.whl", PY, "x86_64-manylinux_2_34") is not None
    assert wheel_score("a-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", PY, "aarch64-manylinux_2_28") is not None
