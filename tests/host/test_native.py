"""Native runs on a GPU host without Docker: what to carry (plan), the parts (split, verify, join), the
install with pip --target from handmade wheels, and the environment record that a runtime report carries."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rlstack.host import native
from rlstack.host.locks import LockedPackage, parse_locked
from rlstack.host.stacks import load_stack
from rlstack.probes import environment


def make_wheel(folder: Path, name: str, version: str, body: str = "VALUE = 1\n") -> Path:
    """A minimal, valid pure-Python wheel with one module named like the package."""
    mod = name.replace("-", "_")
    dist = f"{mod}-{version}.dist-info"
    files = {
        f"{mod}/__init__.py": body,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    whl = folder / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return whl


class FakeCache:
    """Stands in for WheelCache: hands out a handmade wheel per locked package (no network)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.fetched: list[str] = []

    def fetch(self, pkg: LockedPackage, python: str, platform: str) -> Path:
        self.fetched.append(pkg.name)
        return make_wheel(self.folder, f"rlstest-{pkg.name}", pkg.version, f"NAME = {pkg.name!r}\n")


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


def stage_cpu(tmp_path: Path, part_mb: int = 1) -> tuple[Path, FakeCache, dict[str, str]]:
    """Stage the cpu stack against a host that has every locked package but two."""
    locked = parse_locked(load_stack("cpu").lock_file.read_text())
    carried = sorted(locked)[:2]
    host = tmp_path / "host.json"
    host.write_text(json.dumps([{"name": n, "version": p.version} for n, p in locked.items() if n not in carried]))
    cache = FakeCache(tmp_path / "wheels")
    cache.folder.mkdir(exist_ok=True)
    out = tmp_path / "stage" / "cpu"
    native.stage("cpu", host, out, python="3.12", part_mb=part_mb, cache=cache)
    return out, cache, {n: locked[n].version for n in carried}


def test_stage_then_install_round_trip(tmp_path: Path) -> None:
    out, cache, carried = stage_cpu(tmp_path)
    assert sorted(cache.fetched) == sorted(carried)
    index = json.loads((out / native.PARTS_FILE).read_text())
    assert index["stack"] == "cpu" and index["carry"] == 2 and index["python"] == "3.12"
    assert native.verify_parts(out)["tar_sha256"] == index["tar_sha256"]
    target = tmp_path / "site"
    manifest = native.install(out, target)
    assert sorted(w["name"] for w in manifest["wheels"]) == sorted(carried)
    name = sorted(carried)[0]
    mod = f"rlstest_{name}".replace("-", "_")
    probe = subprocess.run([sys.executable, "-c", f"import {mod}; print({mod}.NAME)"], text=True,
                           capture_output=True, env={"PYTHONPATH": str(target)})
    assert probe.stdout.strip() == name, probe.stderr
    assert json.loads((target / ".rlstack-native.json").read_text())["stack"] == "cpu"


def test_damaged_missing_and_mixed_parts_are_named(tmp_path: Path) -> None:
    out, _, _ = stage_cpu(tmp_path)
    part = out / "part-000"
    good = part.read_bytes()
    part.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(native.NativeError, match="part-000 damaged"):
        native.verify_parts(out)
    part.unlink()
    with pytest.raises(native.NativeError, match="part-000 missing") as exc:
        native.install(out, tmp_path / "site")
    assert "carry those parts again" in str(exc.value)
    part.write_bytes(good)
    # a parts.json from another staging: every part checks out against itself, the whole does not
    index = json.loads((out / native.PARTS_FILE).read_text())
    index["tar_sha256"] = "0" * 64
    (out / native.PARTS_FILE).write_text(json.dumps(index))
    with pytest.raises(native.NativeError, match="different stagings"):
        native.install(out, tmp_path / "site")


def test_restage_replaces_the_folder_whole(tmp_path: Path) -> None:
    out, _, _ = stage_cpu(tmp_path)
    (out / "part-999").write_text("stale")
    stage_cpu(tmp_path)
    assert not (out / "part-999").exists()
    assert not list(out.parent.glob(".cpu.*")), "no half-written staging folder is left behind"


def test_native_cli_reports_errors_with_exit_code(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rlstack.host.native", "verify", "--parts", str(tmp_path)], text=True,
                          capture_output=True)
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
    monkeypatch.setattr(environment, "_nvcc_on_path", lambda: "13.0.88")
    monkeypatch.setenv("RLSTACK_STACK", "fp8-report")
    env = environment.capture(stack, locked, installed)
    if sys.version_info[:2] == (3, 11):
        assert env.lock_match and env.deviations == [] and env.where == "image"
    assert env.toolkit == "12.8.61" and env.toolkit_from == "nvidia-cuda-nvcc-cu12 wheel"
    assert env.versions["vllm"] == "0.21.0"
    monkeypatch.delenv("RLSTACK_STACK")
    del installed["nvidia-cuda-nvcc-cu12"]
    installed["numpy"] = "2.5.2"
    monkeypatch.setattr(environment, "_torch_cuda", lambda version: "12.8")
    env = environment.capture(stack, locked, installed)
    assert env.where == "native" and not env.lock_match
    assert env.deviations[0] == "torch CUDA 12.8 (stack 13.0)"
    assert "numpy 2.5.2 (lock 2.3.5)" in env.deviations
    assert "nvcc 13.0.88 from nvcc on PATH (stack 12.8.61)" in env.deviations
    assert env.toolkit == "13.0.88"


def test_installed_versions_sees_this_interpreter() -> None:
    found = environment.installed_versions()
    assert found["pydantic"] and found["pyyaml"]
