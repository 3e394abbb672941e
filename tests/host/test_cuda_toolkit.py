"""The image's CUDA_HOME, derived from the toolkit wheels' own file lists (rlstack.scripts.cuda_toolkit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack.scripts import cuda_toolkit as ct

CU13 = {
    "nvidia-cuda-nvcc": ["nvidia/cu13/bin/nvcc", "nvidia/cu13/bin/ptxas", "nvidia/cu13/bin/nvcc.profile",
                         "nvidia/cu13/include/crt/host_config.h"],
    "nvidia-nvvm": ["nvidia/cu13/nvvm/bin/cicc", "nvidia/cu13/nvvm/libdevice/libdevice.10.bc"],
    "nvidia-cuda-runtime": ["nvidia/cu13/include/cuda_runtime.h", "nvidia/cu13/lib/libcudart.so.13"],
    "nvidia-cuda-cccl": ["nvidia/cu13/include/cccl/cub/cub.cuh"],
    "nvidia-cudnn-cu13": ["nvidia/cudnn/include/cudnn.h", "nvidia/cudnn/lib/libcudnn.so.9"],
    "torch": ["torch/__init__.py"],
}
CU12 = {
    "nvidia-cuda-nvcc-cu12": ["nvidia/cuda_nvcc/bin/nvcc", "nvidia/cuda_nvcc/nvvm/bin/cicc",
                              "nvidia/cuda_nvcc/include/crt/host_config.h"],
    "nvidia-cuda-runtime-cu12": ["nvidia/cuda_runtime/include/cuda_runtime.h",
                                 "nvidia/cuda_runtime/lib/libcudart.so.12"],
}


def test_cu13_layout_is_one_folder_with_ccl_and_an_unversioned_cudart() -> None:
    layout = ct.plan(CU13, "nvidia-cuda-nvcc")
    assert layout.nvcc_root == "nvidia/cu13"
    assert layout.resolve("bin/nvcc") == "nvidia/cu13/bin/nvcc"
    assert layout.resolve("include/cuda_runtime.h") == "nvidia/cu13/include/cuda_runtime.h"
    assert layout.resolve("include/cccl/cub/cub.cuh") == "nvidia/cu13/include/cccl/cub/cub.cuh"
    assert layout.resolve("lib64/libcudart.so") == "nvidia/cu13/lib/libcudart.so.13"  # what -lcudart needs
    assert layout.resolve("include/cudnn.h") is None  # cuDNN is not the toolkit


def test_cu12_layout_merges_the_component_folders() -> None:
    layout = ct.plan(CU12, "nvidia-cuda-nvcc-cu12")
    assert layout.resolve("bin/nvcc") == "nvidia/cuda_nvcc/bin/nvcc"
    assert layout.resolve("nvvm/bin/cicc") == "nvidia/cuda_nvcc/nvvm/bin/cicc"
    assert layout.resolve("include/cuda_runtime.h") == "nvidia/cuda_runtime/include/cuda_runtime.h"
    assert layout.resolve("include/crt/host_config.h") == "nvidia/cuda_nvcc/include/crt/host_config.h"
    assert layout.resolve("lib64/libcudart.so") == "nvidia/cuda_runtime/lib/libcudart.so.12"


@pytest.mark.parametrize("broken", ["no-nvcc-wheel", "no-nvcc-binary"])
def test_a_broken_layout_fails(broken: str) -> None:
    dists = {k: list(v) for k, v in CU13.items()}
    if broken == "no-nvcc-wheel":
        del dists["nvidia-cuda-nvcc"]
    else:
        dists["nvidia-cuda-nvcc"].remove("nvidia/cu13/bin/nvcc")
    with pytest.raises(ct.ToolkitError):
        ct.plan(dists, "nvidia-cuda-nvcc")


def test_build_makes_absolute_links_and_refuses_a_missing_target(tmp_path: Path) -> None:
    site = tmp_path / "site"
    for files in CU13.values():
        for f in files:
            (site / f).parent.mkdir(parents=True, exist_ok=True)
            (site / f).write_text("x")
    home = tmp_path / "cuda"
    n = ct.build(ct.plan(CU13, "nvidia-cuda-nvcc"), site, home)
    assert n > 5 and (home / "bin" / "nvcc").resolve() == (site / "nvidia/cu13/bin/nvcc").resolve()
    assert (home / "lib64" / "libcudart.so").resolve() == (site / "nvidia/cu13/lib/libcudart.so.13").resolve()
    (site / "nvidia/cu13/lib/libcudart.so.13").unlink()
    with pytest.raises(ct.ToolkitError, match="not installed"):
        ct.build(ct.plan(CU13, "nvidia-cuda-nvcc"), site, tmp_path / "cuda2")


def test_check_fails_unless_every_lookup_answers_the_stacks_toolkit() -> None:
    home = Path("/opt/cuda")
    good = {"flashinfer get_cuda_path()": "/opt/cuda", "flashinfer get_cuda_version()": "13.0",
            "torch.utils.cpp_extension.CUDA_HOME": "/opt/cuda"}
    assert ct.check(home, "13.0.88", good, "13.0", "/usr/bin/c++") == []
    # today's image before the fix: no CUDA_HOME, no nvcc on PATH, no /usr/local/cuda
    bad = {**good, "flashinfer get_cuda_path()": "error: Could not find nvcc",
           "flashinfer get_cuda_version()": "13.0", "torch.utils.cpp_extension.CUDA_HOME": "None"}
    problems = ct.check(home, "12.8.61", bad, None, None)
    assert any("get_cuda_path" in p for p in problems)
    assert any("get_cuda_version() = 13.0, expected 12.8" in p for p in problems)
    assert any("CUDA_HOME = None" in p for p in problems)
    assert any("host C++ compiler" in p for p in problems)
