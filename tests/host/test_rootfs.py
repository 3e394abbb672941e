"""What an image export leaves to the GPU host, and the run spec it gets (rlstack.host.rootfs)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from rlstack import stacks
from rlstack.host import containers, rootfs


def test_only_python_independent_wheels_at_the_hosts_version_come_from_the_host() -> None:
    site = "/opt/venv/lib/python3.11/site-packages"
    dists = [
        {"name": "nvidia-cublas", "version": "13.1.0.3", "site": site, "tags": ["py3-none-manylinux_2_27_x86_64"],
         "files": ["nvidia/cu13/lib/libcublas.so.13", "nvidia_cublas-13.1.0.3.dist-info/RECORD",
                   "nvidia/__pycache__/x.cpython-311.pyc"]},
        {"name": "torch", "version": "2.11.0", "site": site, "tags": ["cp311-cp311-manylinux_2_28_x86_64"],
         "files": ["torch/lib/libtorch_cuda.so"]},
        {"name": "vllm", "version": "0.21.0", "site": site, "tags": ["cp38-abi3-manylinux_2_31_x86_64"],
         "files": ["vllm/_C.abi3.so", "../../../bin/vllm"]},
        {"name": "flashinfer-python", "version": "0.6.8.post1", "site": site, "tags": ["py3-none-any"],
         "files": ["flashinfer/__init__.py"]},
    ]
    host = {"nvidia-cublas": "13.1.0.3", "torch": "2.11.0", "vllm": "0.21.0", "flashinfer-python": "0.6.8"}
    got = rootfs.host_supplied(dists, host)
    assert got == {f"{site.lstrip('/')}/nvidia/cu13/lib/libcublas.so.13": "nvidia/cu13/lib/libcublas.so.13",
                   f"{site.lstrip('/')}/vllm/_C.abi3.so": "vllm/_C.abi3.so"}


def test_the_run_spec_is_invoke_trains() -> None:
    stack = stacks.load_stack("fp8")
    config = {"Env": ["PATH=/opt/venv/bin:/usr/bin", "CUDA_HOME=/opt/cuda"], "User": "1000:1000",
              "WorkingDir": "/opt/rlstack", "Entrypoint": ["rlstack"]}
    spec = rootfs.run_spec(stack, "rlstack/fp8:abc", config)
    docker = containers.run_command(containers.spec_for(stack, "rlstack/fp8:abc", []))
    assert spec["read_only_root"] and "--read-only" in docker
    assert {t["path"] for t in spec["tmpfs"]} == {"/tmp", containers.USER_HOME}
    assert {v["target"] for v in spec["volumes"]} == {containers.ADAPTERS_MOUNT, containers.HF_CACHE_MOUNT,
                                                      containers.RUNS_MOUNT, containers.KERNEL_CACHE_MOUNT}
    assert spec["gpus"] is True and spec["user"] == "1000:1000" and spec["entrypoint"] == ["rlstack"]
    assert spec["env"]["CUDA_HOME"] == "/opt/cuda" and containers.PATH_MAP_ENV in spec["env"]


def _export(folder: Path, manifest: bool = True) -> Path:
    """An export folder as rootfs-export writes it: xz parts named in parts.json, the manifest and the spec."""
    folder.mkdir(parents=True)
    part = folder / "part-000"
    part.write_bytes(b"not really xz")
    (folder / "parts.json").write_text(json.dumps({"format": "xz", "tar_sha256": "0" * 64, "parts": [
        {"name": "part-000", "sha256": hashlib.sha256(part.read_bytes()).hexdigest(), "size": part.stat().st_size}]}))
    if manifest:
        with gzip.open(folder / "rootfs-manifest.json.gz", "wt") as f:
            json.dump({"format": 1, "image": "rlstack/fp8:abc", "entries": []}, f)
    (folder / "rootfs-spec.json").write_text("{}")
    return folder


def test_check_finds_what_did_not_travel_before_anything_starts(tmp_path: Path) -> None:
    """The manifest, each part (by sha256) and the spec: each one missing or damaged is named, with what to carry."""
    from rlstack.scripts import rootfs as runner

    exp = _export(tmp_path / "fp8-a")
    manifest, spec = exp / runner.MANIFEST, exp / "rootfs-spec.json"
    assert runner.check(manifest, [exp], spec) == {"image": "rlstack/fp8:abc", "exports": 1, "parts": 1}
    (exp / "part-000").write_bytes(b"changed")
    with pytest.raises(runner.NativeError, match="part-000 damaged"):
        runner.check(manifest, [exp], spec)
    (exp / "part-000").unlink()
    with pytest.raises(runner.NativeError, match="part-000 missing") as err:
        runner.check(manifest, [exp], spec)
    assert err.value.hint and "carry" in err.value.hint
    spec.write_text("{")
    with pytest.raises(runner.RootfsError, match="unreadable run spec"):
        runner.check(manifest, [], spec)
    with pytest.raises(runner.RootfsError, match="unreadable manifest"):
        runner.check(tmp_path / "nowhere.json.gz", [exp])


def test_image_run_start_refuses_in_the_call_when_the_manifest_did_not_travel(tmp_path: Path) -> None:
    """`image_run.sh start` checks before it puts the assembly in the background: a missing manifest is an exit
    code and a message in the call that started it, and nothing is left running or half made."""
    root = Path(__file__).resolve().parents[2]
    stash = tmp_path / "stash"
    _export(stash / "fp8-a", manifest=False)
    proc = subprocess.run(["bash", "bench/transport/image_run.sh", "start", "fp8", "bench/transport/jobs/fp8_image.sh",
                           "fp8-a"], cwd=root, env={**os.environ, "RLSTACK_STASH": str(stash)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9 and "unreadable manifest" in proc.stderr and "carry the manifest" in proc.stderr
    assert not (stash / "snap-fp8").exists() and not (stash / "start-fp8.log").exists()
