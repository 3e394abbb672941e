"""Native runs on a GPU host without Docker: what to carry (plan), the parts (split, verify, join), the
install with pip --target from handmade wheels, and the environment record that a runtime report carries."""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rlstack.host import native
from rlstack.probes import environment
from rlstack.scripts import native_install
from rlstack.stacks.locks import LockedPackage, parse_locked
from rlstack.stacks.model import load_stack


def make_wheel(folder: Path, name: str, version: str, body: str = "VALUE = 1\n", *,
               extra: dict[str, bytes] | None = None, tamper: dict[str, bytes] | None = None,
               unlisted: dict[str, bytes] | None = None) -> Path:
    """A minimal, valid pure-Python wheel with one module named like the package, deflated as builders write
    them. `extra`: more members (listed in RECORD); `tamper`: members whose bytes differ from what RECORD
    says; `unlisted`: members RECORD does not name."""
    mod = name.replace("-", "_")
    dist = f"{mod}-{version}.dist-info"
    files: dict[str, bytes] = {
        f"{mod}/__init__.py": body.encode(),
        **(extra or {}),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files.update(tamper or {})
    files.update(unlisted or {})
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    whl = folder / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return whl


class FakeCache:
    """Stands in for WheelCache: hands out a handmade wheel per locked package (no network). `members`:
    keyword arguments of make_wheel for every wheel (extra, tamper, unlisted members)."""

    def __init__(self, folder: Path, **members: dict[str, bytes]) -> None:
        self.folder = folder
        self.members = members
        self.fetched: list[str] = []

    def fetch(self, pkg: LockedPackage, python: str, platform: str) -> Path:
        self.fetched.append(pkg.name)
        return make_wheel(self.folder, f"rlstest-{pkg.name}", pkg.version, f"NAME = {pkg.name!r}\n",
                          **self.members)


def test_plan_uses_host_copies_skips_and_keeps() -> None:
    locked = {"torch": "2.11.0", "numpy": "2.3.5", "vllm": "0.21.0", "tilelang": "0.1.9", "peft": "0.21.2"}
    host = {"torch": "2.11.0+cu130", "numpy": "2.5.2", "peft": "0.21.0"}
    picks = {p.name: p for p in native.plan(locked, host, skip={"tilelang": "not needed"}, keep_host={"numpy"})}
    assert picks["torch"].action == "host"  # a local label is the same release
    assert picks["numpy"].action == "host" and "2.5.2" in picks["numpy"].why
    assert picks["tilelang"].action == "skip" and picks["tilelang"].why == "not needed"
    assert picks["vllm"].action == "carry" and picks["vllm"].why == "not on the host"
    assert picks["peft"].action == "carry" and "0.21.0" in picks["peft"].why
    with pytest.raises(native.NativeError, match="not in the lock: nosuch"):
        native.plan(locked, host, skip={"nosuch": "x"})


def test_host_package_list_formats(tmp_path: Path) -> None:
    j = tmp_path / "pip.json"
    j.write_text(json.dumps([{"name": "Torch", "version": "2.11.0"}, {"name": "unsloth_zoo", "version": "1"}]))
    assert native.read_host_packages(j) == {"torch": "2.11.0", "unsloth-zoo": "1"}
    f = tmp_path / "freeze.txt"
    f.write_text("# comment\nPeft==0.21.0\n\n")
    assert native.read_host_packages(f) == {"peft": "0.21.0"}
    bad = tmp_path / "bad.txt"
    bad.write_text("torch==2\nnonsense here\n")
    with pytest.raises(native.NativeError, match=r"bad.txt:2: 'nonsense here'"):
        native.read_host_packages(bad)
    with pytest.raises(native.NativeError, match="pip list --format=json"):
        native.read_host_packages(tmp_path / "missing.json")


def test_split_cuts_exact_parts(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    out = tmp_path / "parts"
    out.mkdir()
    parts = native.split(blob, out, 4096)
    assert [p["size"] for p in parts] == [4096, 4096, 2048]
    assert b"".join((out / p["name"]).read_bytes() for p in parts) == blob.read_bytes()


def stage_cpu(tmp_path: Path, part_mb: int = 1, compress: str = "xz", cache: FakeCache | None = None
              ) -> tuple[Path, FakeCache, dict[str, str]]:
    """Stage the cpu stack against a host that has every locked package but two."""
    locked = parse_locked(load_stack("cpu").lock_file.read_text())
    carried = sorted(locked)[:2]
    host = tmp_path / "host.json"
    host.write_text(json.dumps([{"name": n, "version": p.version} for n, p in locked.items() if n not in carried]))
    cache = cache or FakeCache(tmp_path / "wheels")
    cache.folder.mkdir(exist_ok=True)
    out = tmp_path / "stage" / "cpu"
    native.stage("cpu", host, out, python="3.12", part_mb=part_mb, compress=compress, cache=cache)
    return out, cache, {n: locked[n].version for n in carried}


# ~1.3 MiB that xz cannot shrink: with 1 MiB parts the compressed staging takes several parts
NOISE = {"rlstest_data/noise.bin": random.Random(0).randbytes(1_300_000)}


@pytest.mark.parametrize("compress", ["xz", "none"])
def test_stage_then_install_round_trip(tmp_path: Path, compress: str) -> None:
    cache = FakeCache(tmp_path / "wheels", extra=NOISE)
    out, cache, carried = stage_cpu(tmp_path, compress=compress, cache=cache)
    assert sorted(cache.fetched) == sorted(carried)
    index = json.loads((out / native.PARTS_FILE).read_text())
    assert index["stack"] == "cpu" and index["carry"] == 2 and index["python"] == "3.12"
    assert index["format"] == {"xz": "xz", "none": "tar"}[compress]
    assert len(index["parts"]) >= 3 and all(p["size"] <= 1 << 20 for p in index["parts"])
    assert native_install.verify_parts(out)["tar_sha256"] == index["tar_sha256"]
    if compress == "xz":  # each part a whole xz file on its own; joined, the tar parts.json hashes
        raw = [lzma.decompress((out / p["name"]).read_bytes()) for p in index["parts"]]
        assert [len(r) for r in raw] == [p["raw_size"] for p in index["parts"]]
        assert hashlib.sha256(b"".join(raw)).hexdigest() == index["tar_sha256"]
    target = tmp_path / "site"
    manifest = native_install.install(out, target)
    assert sorted(w["name"] for w in manifest["wheels"]) == sorted(carried)
    name = sorted(carried)[0]
    mod = f"rlstest_{name}".replace("-", "_")
    probe = subprocess.run([sys.executable, "-c", f"import {mod}; print({mod}.NAME)"], text=True,
                           capture_output=True, env={"PYTHONPATH": str(target)})
    assert probe.stdout.strip() == name, probe.stderr
    assert json.loads((target / ".rlstack-native.json").read_text())["stack"] == "cpu"
    assert (target / "rlstest_data" / "noise.bin").read_bytes() == NOISE["rlstest_data/noise.bin"]
    if compress == "xz":
        assert all(w["members_checked"] == 4 for w in manifest["wheels"])


def test_stored_wheel_keeps_every_member_byte_for_byte(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path, "rlstest-pkg", "1.0", extra={"rlstest_pkg/lib.so": bytes(5000) + b"x" * 5000})
    with zipfile.ZipFile(whl, "a") as z:  # a directory entry and an executable bit, as real wheels have
        z.writestr(zipfile.ZipInfo("rlstest_pkg/data/"), b"")
    stored = tmp_path / "stored.whl"
    assert native.store_wheel(whl, stored) == 4  # all but RECORD and the folder
    with zipfile.ZipFile(whl) as a, zipfile.ZipFile(stored) as b:
        assert [i.filename for i in a.infolist()] == [i.filename for i in b.infolist()]
        for x, y in zip(a.infolist(), b.infolist(), strict=True):
            assert y.compress_type == zipfile.ZIP_STORED
            assert (x.date_time, x.external_attr, x.CRC) == (y.date_time, y.external_attr, y.CRC)
            assert a.read(x) == b.read(y)
    assert stored.stat().st_size > whl.stat().st_size


def test_xz_parts_end_at_block_edges_within_the_limit(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(300_000) + b"text " * 200_000 + random.Random(2).randbytes(250_000)
    with native.XzParts(tmp_path, 200_000, threads=2) as sink:
        for i in range(0, len(data), 7777):  # tarfile writes in pieces of its own size
            sink.write(data[i:i + 7777])
    assert sink.size == len(data) and sink.sha256 == hashlib.sha256(data).hexdigest()
    assert len(sink.parts) == 3 and all(0 < p["size"] <= 200_000 for p in sink.parts)
    assert sink.parts[1]["raw_size"] > 4 * sink.parts[1]["size"]  # the text, packed by its compressed size
    assert b"".join(lzma.decompress((tmp_path / p["name"]).read_bytes()) for p in sink.parts) == data
    assert sum(p["blocks"] for p in sink.parts) == -(-len(data) // sink.block)


@pytest.mark.parametrize(("members", "message"), [
    ({"tamper": {"rlstest_data/x.txt": b"changed"}}, r"x.txt: sha256 \S+, RECORD says"),
    ({"unlisted": {"rlstest_data/y.txt": b"smuggled"}}, "y.txt: not listed in RECORD"),
])
def test_stage_refuses_a_wheel_that_does_not_match_its_record(tmp_path: Path, members: dict[str, dict[str, bytes]],
                                                              message: str) -> None:
    cache = FakeCache(tmp_path / "wheels", extra={"rlstest_data/x.txt": b"original"}, **members)
    with pytest.raises(native.NativeError, match=message) as exc:
        stage_cpu(tmp_path, cache=cache)
    assert "rlstest_" in str(exc.value) and ".whl" in str(exc.value) and "--compress none" in str(exc.value)
    assert not (tmp_path / "stage" / "cpu").exists() and not list((tmp_path / "stage").glob(".cpu.*"))
    out, _, _ = stage_cpu(tmp_path, compress="none", cache=cache)  # the plain format carries it as it is
    assert json.loads((out / native.PARTS_FILE).read_text())["format"] == "tar"


def test_stage_refuses_unknown_compression_and_presets(tmp_path: Path) -> None:
    with pytest.raises(native.NativeError, match="--compress zstd"):
        stage_cpu(tmp_path, compress="zstd")
    with pytest.raises(native.NativeError, match="presets are 0 to 9"):
        native.stage("cpu", tmp_path / "host.json", tmp_path / "out", python="3.12", preset=10)


def test_plain_parts_from_before_xz_still_install(tmp_path: Path) -> None:
    out, _, carried = stage_cpu(tmp_path, compress="none")
    index = json.loads((out / native.PARTS_FILE).read_text())
    del index["format"]  # parts.json as the stager wrote it before the xz format existed
    (out / native.PARTS_FILE).write_text(json.dumps(index))
    manifest = native_install.install(out, tmp_path / "site")
    assert sorted(w["name"] for w in manifest["wheels"]) == sorted(carried)
    index["format"] = "zstd"
    (out / native.PARTS_FILE).write_text(json.dumps(index))
    with pytest.raises(native.NativeError, match="format 'zstd'"):
        native_install.verify_parts(out)


def test_corrupt_compressed_part_is_named(tmp_path: Path) -> None:
    out, _, _ = stage_cpu(tmp_path, cache=FakeCache(tmp_path / "wheels", extra=NOISE))
    index = json.loads((out / native.PARTS_FILE).read_text())
    part = out / "part-001"
    good = part.read_bytes()
    bad = good[:100] + bytes([good[100] ^ 0xFF]) + good[101:]
    part.write_bytes(bad)
    with pytest.raises(native.NativeError, match=r"1 of \d+ parts unusable: part-001 damaged") as exc:
        native_install.install(out, tmp_path / "site")
    assert "carry those parts again" in str(exc.value)
    # a part that matches a parts.json edited to fit it is still refused when it decompresses: named too
    index["parts"][1]["sha256"] = hashlib.sha256(bad).hexdigest()
    (out / native.PARTS_FILE).write_text(json.dumps(index))
    with pytest.raises(native.NativeError, match="part-001: not valid xz"):
        native_install.install(out, tmp_path / "site")
    part.write_bytes(good[:-50])  # cut short
    index["parts"][1].update(sha256=hashlib.sha256(good[:-50]).hexdigest(), size=len(good) - 50)
    (out / native.PARTS_FILE).write_text(json.dumps(index))
    with pytest.raises(native.NativeError, match=r"part-001: .*(cut short|not valid xz)"):
        native_install.install(out, tmp_path / "site")
    assert not (tmp_path / "site" / ".rlstack-native.json").exists()


def test_damaged_missing_and_mixed_parts_are_named(tmp_path: Path) -> None:
    out, _, _ = stage_cpu(tmp_path)
    part = out / "part-000"
    good = part.read_bytes()
    part.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(native.NativeError, match="part-000 damaged"):
        native_install.verify_parts(out)
    part.unlink()
    with pytest.raises(native.NativeError, match="part-000 missing") as exc:
        native_install.install(out, tmp_path / "site")
    assert "carry those parts again" in str(exc.value)
    part.write_bytes(good)
    # a parts.json from another staging: every part checks out against itself, the whole does not
    index = json.loads((out / native.PARTS_FILE).read_text())
    index["tar_sha256"] = "0" * 64
    (out / native.PARTS_FILE).write_text(json.dumps(index))
    with pytest.raises(native.NativeError, match="different stagings"):
        native_install.install(out, tmp_path / "site")


def test_restage_replaces_the_folder_whole(tmp_path: Path) -> None:
    out, _, _ = stage_cpu(tmp_path)
    (out / "part-999").write_text("stale")
    stage_cpu(tmp_path)
    assert not (out / "part-999").exists()
    assert not list(out.parent.glob(".cpu.*")), "no half-written staging folder is left behind"


def test_native_cli_reports_errors_with_exit_code(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rlstack.scripts.native_install", "verify", "--parts", str(tmp_path)],
                          text=True, capture_output=True)
    assert proc.returncode == native.NativeError.exit_code
    assert "parts.json" in proc.stderr and "invoke native-stage" in proc.stderr


# --- the environment a runtime report records ------------------------------------------------------------

LOCK = {"torch": LockedPackage("torch", "2.11.0", frozenset()), "numpy": LockedPackage("numpy", "2.3.5", frozenset()),
        "vllm": LockedPackage("vllm", "0.21.0", frozenset())}


def test_deviations_name_missing_and_other_versions() -> None:
    installed = {"torch": "2.11.0+cu130", "numpy": "2.5.2"}
    assert environment.deviations(LOCK, installed) == ["numpy 2.5.2 (lock 2.3.5)", "vllm missing (lock 0.21.0)"]
    assert environment.deviations(LOCK, {"torch": "2.11.0", "numpy": "2.3.5", "vllm": "0.21.0"}) == []


def test_fingerprint_follows_what_is_installed() -> None:
    a = {"torch": "2.11.0", "numpy": "2.3.5", "vllm": "0.21.0"}
    fp = environment.fingerprint("3.12.3", "13.0", LOCK, a)
    assert fp == environment.fingerprint("3.12.3", "13.0", LOCK, dict(a, unrelated="9"))
    assert fp != environment.fingerprint("3.12.3", "13.0", LOCK, dict(a, numpy="2.5.2"))
    assert fp != environment.fingerprint("3.11.7", "13.0", LOCK, a)
    assert fp != environment.fingerprint("3.12.3", "12.8", LOCK, a)


def test_capture_in_image_and_native(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = load_stack("fp8-report")  # its lock: numpy 2.3.5, nvcc 12.8.61 from nvidia-cuda-nvcc-cu12
    locked = parse_locked(stack.lock_file.read_text())
    installed = {n: p.version for n, p in locked.items()}
    monkeypatch.setattr(environment, "_torch_cuda", lambda version: "13.0")
    # in the image FlashInfer's lookup finds CUDA_HOME's nvcc, a link to the pinned wheel's
    monkeypatch.setattr(environment, "jit_toolkit", lambda env=None: environment.Found(
        "/opt/cuda", "CUDA_HOME=/opt/cuda", "/opt/cuda/bin/nvcc", "12.8.61"))
    monkeypatch.setattr(environment, "wheel_nvcc", lambda package: Path("/opt/cuda/bin/nvcc").resolve())
    monkeypatch.setenv("RLSTACK_STACK", "fp8-report")
    monkeypatch.setenv("RLSTACK_IMAGE", "rlstack/fp8-report:0123456789ab")
    env = environment.capture(stack, locked, installed)
    assert env.image == "rlstack/fp8-report:0123456789ab"  # the matrix says which image ran
    if sys.version_info[:2] == (3, 11):
        assert env.lock_match and env.deviations == [] and env.where == "image"
    assert env.toolkit == "12.8.61" and env.toolkit_from == "/opt/cuda/bin/nvcc (CUDA_HOME=/opt/cuda)"
    assert env.versions["vllm"] == "0.21.0"
    monkeypatch.delenv("RLSTACK_STACK")
    monkeypatch.delenv("RLSTACK_IMAGE")
    del installed["nvidia-cuda-nvcc-cu12"]
    installed["numpy"] = "2.5.2"
    monkeypatch.setattr(environment, "_torch_cuda", lambda version: "12.8")
    monkeypatch.setattr(environment, "jit_toolkit", lambda env=None: environment.Found(  # a GPU host's own toolkit
        "/usr/local/cuda", "no CUDA_HOME, no nvcc on PATH; /usr/local/cuda exists", "/usr/local/cuda/bin/nvcc",
        "13.0.88"))
    env = environment.capture(stack, locked, installed)
    assert env.where == "native" and not env.lock_match
    assert env.deviations[0] == "torch CUDA 12.8 (stack 13.0)"
    assert "numpy 2.5.2 (lock 2.3.5)" in env.deviations
    assert ("nvcc 13.0.88 from /usr/local/cuda/bin/nvcc (no CUDA_HOME, no nvcc on PATH; /usr/local/cuda exists) "
            "(stack nvidia-cuda-nvcc-cu12 12.8.61)") in env.deviations
    assert env.toolkit == "13.0.88"


def test_installed_versions_sees_this_interpreter() -> None:
    found = environment.installed_versions()
    assert found["pydantic"] and found["pyyaml"]
