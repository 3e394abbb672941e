"""What an image export leaves to the GPU host, and the run spec it gets (rlstack.host.rootfs)."""

from __future__ import annotations

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
