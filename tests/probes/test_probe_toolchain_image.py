"""The CUDA toolkit FlashInfer's JIT finds: its lookup (CUDA_HOME / CUDA_PATH, `which nvcc`, /usr/local/cuda) in
a process's environment (rlstack.probes.environment, runtime reports) and over a model of a stack's image built
from its toolkit wheels' file lists (rlstack.probes.toolchain.Image, the static toolchain rules)."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest

from rlstack.probes import environment, toolchain
from rlstack.probes.environment import Found
from rlstack.probes.model import ProbeResult
from rlstack.probes.wheels import SourceSet
from rlstack.stacks.model import Stack, ToolkitSpec, load_stack

# --- the lookup in a process's environment ---------------------------------------------------------------


def _toolkit(root: Path, version: str) -> Path:
    """A folder with bin/nvcc: a script that answers --version as nvcc does."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    release = ".".join(version.split(".")[:2])
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{version}'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return root


@pytest.fixture
def no_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """/usr/local/cuda replaced by a folder of the test's (absent unless a test makes it)."""
    default = tmp_path / "usr-local-cuda"
    monkeypatch.setattr(environment, "DEFAULT_CUDA_HOME", str(default))
    return default


def test_cuda_home_answers_first_with_its_nvcc_version(tmp_path: Path, no_default: Path) -> None:
    home = _toolkit(tmp_path / "cuda", "13.0.88")
    other = _toolkit(tmp_path / "other", "12.8.61")
    found = environment.jit_toolkit({"CUDA_HOME": str(home), "PATH": str(other / "bin")})
    assert found == Found(str(home), f"CUDA_HOME={home}", str(home / "bin" / "nvcc"), "13.0.88")
    assert environment.toolkit({"CUDA_HOME": str(home)}) == ("13.0.88", f"{home}/bin/nvcc (CUDA_HOME={home})")


def test_an_empty_cuda_home_falls_to_cuda_path(tmp_path: Path, no_default: Path) -> None:
    home = _toolkit(tmp_path / "cuda", "12.9.86")
    found = environment.jit_toolkit({"CUDA_HOME": "", "CUDA_PATH": str(home), "PATH": ""})
    assert found.version == "12.9.86" and found.how == f"CUDA_PATH={home}"


def test_nvcc_on_path_gives_its_grandparent(tmp_path: Path, no_default: Path) -> None:
    home = _toolkit(tmp_path / "t", "12.8.61")
    found = environment.jit_toolkit({"PATH": f"{tmp_path / 'empty'}:{home / 'bin'}"})
    assert found.home == str(home) and found.version == "12.8.61" and "`which nvcc`" in found.how


def test_usr_local_cuda_answers_last_and_then_nothing(tmp_path: Path, no_default: Path) -> None:
    assert environment.jit_toolkit({"PATH": str(tmp_path)}) == Found(
        None, f"no CUDA_HOME or CUDA_PATH, no nvcc on PATH, no {no_default}")
    version, where = environment.toolkit({"PATH": str(tmp_path)})
    assert version is None and where.endswith("FlashInfer reads torch.version.cuda")
    _toolkit(no_default, "13.0.88")
    assert environment.jit_toolkit({"PATH": str(tmp_path)}).version == "13.0.88"


def test_a_cuda_home_without_nvcc_has_no_version(tmp_path: Path, no_default: Path) -> None:
    (tmp_path / "cuda").mkdir()
    found = environment.jit_toolkit({"CUDA_HOME": str(tmp_path / "cuda")})
    assert found.home == str(tmp_path / "cuda") and found.nvcc is None and found.version is None
    assert found.describe().startswith(f"no nvcc at {tmp_path}/cuda/bin/nvcc (CUDA_HOME=")


def _stack(version: str = "13.0.88") -> Stack:
    return load_stack("fp8").model_copy(update={"cuda_toolkit": ToolkitSpec(version=version,
                                                                           package="nvidia-cuda-nvcc")})


def test_runtime_deviation_when_the_toolkit_found_is_not_the_stacks(tmp_path: Path, no_default: Path) -> None:
    """A GPU host's /usr/local/cuda of the same version is still not the stack's wheel; no nvcc at all, or another
    version, are deviations too; the pinned wheel's own nvcc is none."""
    host = _toolkit(no_default, "13.0.88")
    wheel = _toolkit(tmp_path / "site" / "nvidia" / "cu13", "13.0.88")
    stack = _stack()
    native = environment.jit_toolkit({"PATH": ""})
    dev = environment.toolkit_deviation(stack, native, (wheel / "bin" / "nvcc").resolve())
    assert dev is not None and f"{host}/bin/nvcc" in dev and "not the stack's nvidia-cuda-nvcc wheel" in dev
    image = environment.jit_toolkit({"CUDA_HOME": str(wheel)})
    assert environment.toolkit_deviation(stack, image, (wheel / "bin" / "nvcc").resolve()) is None
    missing = environment.toolkit_deviation(stack, Found(None, "nothing"), None)
    assert missing is not None and missing.startswith("nvcc missing")
    older = environment.toolkit_deviation(_stack("12.9.86"), image, (wheel / "bin" / "nvcc").resolve())
    assert older is not None and older.startswith("nvcc 13.0.88 from") and "stack nvidia-cuda-nvcc 12.9.86" in older


def test_capture_records_the_deviation(tmp_path: Path, no_default: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _toolkit(no_default, "13.0.88")
    monkeypatch.setattr(environment, "wheel_nvcc", lambda package: None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    env = environment.capture(_stack(), {}, installed={})
    assert env.toolkit == "13.0.88" and env.toolkit_from.startswith(f"{no_default}/bin/nvcc")
    assert not env.lock_match and any("not the stack's nvidia-cuda-nvcc wheel" in d for d in env.deviations)


# --- the lookup over a model of the image ----------------------------------------------------------------

CU13 = {
    "nvidia-cuda-nvcc": ["nvidia/cu13/bin/nvcc", "nvidia/cu13/bin/ptxas", "nvidia/cu13/bin/nvcc.profile"],
    "nvidia-nvvm": ["nvidia/cu13/nvvm/bin/cicc"],
    "nvidia-cuda-crt": ["nvidia/cu13/include/crt/host_config.h"],
    "nvidia-cuda-runtime": ["nvidia/cu13/include/cuda_runtime.h", "nvidia/cu13/lib/libcudart.so.13"],
    "nvidia-cuda-cccl": ["nvidia/cu13/include/cccl/cub/cub.cuh"],
}
VERSIONS = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-nvvm": "13.0.88", "nvidia-cuda-crt": "13.0.88",
            "nvidia-cuda-runtime": "13.0.96", "nvidia-cuda-cccl": "13.0.85"}
# nvidia-cuda-nvcc-cu12 12.8.61 as PyPI has it: ptxas and libnvvm, but no nvcc
CU12_NO_NVCC = {"nvidia-cuda-nvcc-cu12": ["nvidia/cuda_nvcc/bin/ptxas", "nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so",
                                          "nvidia/cuda_nvcc/include/crt/host_config.h"]}

FI_068 = {
    "flashinfer/compilation_context.py": 'def n(major):\n    if major == 12:\n'
                                         '        raise RuntimeError("SM 12.x requires CUDA >= 12.9")\n',
    "flashinfer/jit/cpp_ext.py": 'def get_cuda_path() -> str:\n    pass\n'
                                 '        return Version(torch.version.cuda)\n'
                                 'def get_system_includes(cuda_home):\n'
                                 '    return ["$cuda_home/include",\n        "$cuda_home/include/cccl"]\n',
}
FI_071 = {
    "flashinfer/compilation_context.py": (
        'def n(major, minor):\n    if minor == 0:\n        raise RuntimeError("SM 120 requires CUDA >= 12.8")\n'
        '    raise RuntimeError("SM 12.1+ requires CUDA >= 12.9")\n'),
    "flashinfer/jit/cpp_ext.py": 'def get_cuda_path() -> str:\n    pass\n        return Version(torch.version.cuda)\n'
                                 'def get_system_includes(cuda_home):\n    return ["$cuda_home/include"]\n',
    "flashinfer/data/cccl/cub/cub/cub.cuh": "",
}


def _flashinfer(tmp: Path, files: dict[str, str]) -> SourceSet:
    tmp.mkdir(parents=True, exist_ok=True)
    p = tmp / "flashinfer_python-1-py3-none-any.whl"
    with zipfile.ZipFile(p, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return SourceSet({"flashinfer-python": p})


def _rules() -> dict[str, toolchain.Rule]:
    return {r.id: r for r in toolchain.load_rules()}


def _eval(rule: str, image: toolchain.Image, src: SourceSet, arch: str = "sm_120",
          torch_cuda: str = "13.0") -> ProbeResult:
    return toolchain.evaluate(_rules()[rule], src, gpu_arch=arch, toolkit=image.found().version,
                              torch_cuda=torch_cuda, image=image)


def test_fp8s_image_finds_its_pinned_nvcc_with_cccl_and_one_release(tmp_path: Path) -> None:
    image = toolchain.image_of(load_stack("fp8"), VERSIONS, CU13)
    found = image.found()
    assert found == Found("/opt/cuda", "CUDA_HOME=/opt/cuda", "/opt/cuda/bin/nvcc", "13.0.88")
    src = _flashinfer(tmp_path, FI_068)
    for rule in ("flashinfer-jit-nvcc", "flashinfer-cccl", "nvcc-release", "flashinfer-sm12x-nvcc"):
        res = _eval(rule, image, src)
        assert res.status == "pass", (rule, res.reason)
    assert "/opt/cuda/include/cccl/cub/cub.cuh" in _eval("flashinfer-cccl", image, src).reason


def test_fp8_report_wall_from_the_image_when_its_toolkit_folder_holds_nvcc_12_8(tmp_path: Path) -> None:
    """The report's wall as the image would meet it: nvcc 12.8 at CUDA_HOME, below FlashInfer's 12.9."""
    stack = load_stack("fp8-report")
    files = {"nvidia-cuda-nvcc-cu12": [*CU12_NO_NVCC["nvidia-cuda-nvcc-cu12"], "nvidia/cuda_nvcc/bin/nvcc"]}
    image = toolchain.image_of(stack, {"nvidia-cuda-nvcc-cu12": "12.8.61"}, files)
    res = _eval("flashinfer-sm12x-nvcc", image, _flashinfer(tmp_path, FI_068))
    assert res.status == "fail" and res.signature == "flashinfer-sm12x-cuda"
    assert "requires CUDA >= 12.9" in res.reason and "12.8.61" in res.reason
    assert "/opt/cuda/bin/nvcc (CUDA_HOME=/opt/cuda)" in res.reason
    assert _eval("flashinfer-sm12x-nvcc", image, _flashinfer(tmp_path / "x", FI_068), arch="sm_90").status == "pass"


def test_fp8_report_as_locked_has_no_nvcc_and_reads_torchs_cuda(tmp_path: Path) -> None:
    """The CUDA 12 'nvcc' wheel carries no nvcc: the image build cannot make CUDA_HOME, FlashInfer finds no
    compiler, and its version gate reads torch's 13.0 (so the report's 12.9 gate passes, the compile fails)."""
    image = toolchain.image_of(load_stack("fp8-report"), {"nvidia-cuda-nvcc-cu12": "12.8.61"}, CU12_NO_NVCC)
    assert image.problem and image.found().nvcc is None
    src = _flashinfer(tmp_path, FI_068)
    jit = _eval("flashinfer-jit-nvcc", image, src)
    assert jit.status == "fail" and jit.signature == "flashinfer-jit-no-nvcc" and jit.fix
    assert "finds no nvcc in the image" in jit.reason and "reads torch's CUDA 13.0" in jit.reason
    gate = _eval("flashinfer-sm12x-nvcc", image, src)
    assert gate.status == "pass" and "torch.version.cuda" in gate.reason


def test_no_cuda_home_means_no_compiler(tmp_path: Path) -> None:
    """Without CUDA_HOME the lookup goes on: no nvcc on the image's PATH, no /usr/local/cuda in Debian."""
    stack = load_stack("fp8")
    env = {k: v for k, v in stack.image_env().items() if k != "CUDA_HOME"}
    image = toolchain.image_of(stack, VERSIONS, CU13, env=env)
    found = image.found()
    assert found.home is None and "no nvcc on PATH, no /usr/local/cuda" in found.how
    src = _flashinfer(tmp_path, FI_068)
    res = _eval("flashinfer-jit-nvcc", image, src)
    assert res.status == "fail" and res.reason == ("FlashInfer's JIT finds no nvcc in the image; its version "
                                                   "check reads torch's CUDA 13.0")
    assert _eval("flashinfer-cccl", image, src).status == "skip"
    gate = _eval("flashinfer-sm12x-nvcc", image, src, torch_cuda="12.8")
    assert gate.status == "fail" and "torch.version.cuda" in gate.reason


def test_an_nvcc_script_on_the_venvs_path_is_found_by_which(tmp_path: Path) -> None:
    stack = load_stack("fp8")
    env = {k: v for k, v in stack.image_env().items() if k != "CUDA_HOME"}
    files = {"nvidia-cuda-nvcc": ["nvidia_cuda_nvcc-13.0.88.data/scripts/nvcc"]}
    found = toolchain.image_of(stack, {"nvidia-cuda-nvcc": "13.0.88"}, files, env=env).found()
    assert found.home == "/opt/venv" and found.nvcc == "/opt/venv/bin/nvcc" and found.version == "13.0.88"


def test_no_cccl_fails_with_the_component_fix(tmp_path: Path) -> None:
    files = {k: v for k, v in CU13.items() if k != "nvidia-cuda-cccl"}
    image = toolchain.image_of(load_stack("fp8"), VERSIONS, files)
    res = _eval("flashinfer-cccl", image, _flashinfer(tmp_path, FI_068))
    assert res.status == "fail" and res.signature == "cuda-toolkit-no-cccl"
    assert "/opt/cuda/include/cub/cub.cuh" in res.reason and "/opt/cuda/include/cccl/cub/cub.cuh" in res.reason
    assert res.fix and "nvidia-cuda-cccl" in res.fix and "components" in res.fix
    assert [e.line for e in res.evidence[:2]] == [5, 6]  # the include folders, as its source names them


def test_a_flashinfer_that_carries_cccl_needs_none_from_the_toolkit(tmp_path: Path) -> None:
    files = {k: v for k, v in CU13.items() if k != "nvidia-cuda-cccl"}
    image = toolchain.image_of(load_stack("fp8"), VERSIONS, files)
    res = _eval("flashinfer-cccl", image, _flashinfer(tmp_path, FI_071))
    assert res.status == "pass" and "flashinfer/data/cccl/cub/cub/cub.cuh" in res.reason


@pytest.mark.parametrize(("part", "version"), [("nvidia-nvvm", "13.5.37"), ("nvidia-cuda-crt", "13.5.37")])
def test_nvcc_parts_of_another_release_fail(part: str, version: str) -> None:
    image = toolchain.image_of(load_stack("fp8"), {**VERSIONS, part: version}, CU13)
    res = toolchain.evaluate(_rules()["nvcc-release"], SourceSet({}), gpu_arch="sm_120", toolkit="13.0.88",
                             torch_cuda="13.0", image=image)
    assert res.status == "fail" and res.signature == "nvcc-release-mismatch"
    assert f"{part} {version}" in res.reason and "CUDA 13.0" in res.reason
    assert res.fix and part in res.fix


def test_nvcc_parts_inside_its_own_wheel_pass() -> None:
    stack = load_stack("fp8").model_copy(update={"cuda_toolkit": ToolkitSpec(version="13.0.88",
                                                                            package="nvidia-cuda-nvcc")})
    image = toolchain.image_of(stack, {"nvidia-cuda-nvcc": "13.0.88"}, {"nvidia-cuda-nvcc": CU13["nvidia-cuda-nvcc"]})
    res = toolchain.evaluate(_rules()["nvcc-release"], SourceSet({}), gpu_arch="sm_90", toolkit="13.0.88",
                             torch_cuda="13.0", image=image)
    assert res.status == "pass" and "come in nvidia-cuda-nvcc itself" in res.reason


@pytest.mark.parametrize(("arch", "nvcc", "status", "threshold"), [
    ("sm_120", "12.8.61", "pass", "12.8"), ("sm_120", "12.6.85", "fail", "12.8"),
    ("sm_121", "12.8.61", "fail", "12.9"), ("sm_121", "12.9.86", "pass", "12.9"), ("sm_90", "12.6.85", "pass", None)])
def test_flashinfer_071s_gate_per_arch_read_from_its_source(tmp_path: Path, arch: str, nvcc: str, status: str,
                                                            threshold: str | None) -> None:
    """0.7.1 relaxed SM 12.0 to CUDA 12.8 and kept 12.9 for SM 12.1+: each line binds its own range."""
    res = toolchain.evaluate(_rules()["flashinfer-sm12x-nvcc"], _flashinfer(tmp_path, FI_071), gpu_arch=arch,
                             toolkit=nvcc, torch_cuda="13.0")
    assert res.status == status, res.reason
    if threshold:
        assert f"requires CUDA >= {threshold}" in res.evidence[0].text


def test_the_image_inputs_change_with_the_home_and_a_candidate_nvcc() -> None:
    stack = load_stack("fp8")
    assert stack.cuda_toolkit is not None
    moved = stack.model_copy(update={"cuda_toolkit": stack.cuda_toolkit.model_copy(update={"home": "/usr/local/cuda"})})
    keys = [toolchain.image_inputs(stack, None), toolchain.image_inputs(moved, None),
            toolchain.image_inputs(stack, "13.1.80")]
    assert len({str(k) for k in keys}) == 3


def test_image_wheels_are_the_toolkit_wheels_and_components() -> None:
    from rlstack.stacks.locks import LockedPackage

    locked = {n: LockedPackage(n, "1", frozenset()) for n in
              ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cublas", "nvidia-cudnn-cu13", "torch", "nvidia-cuda-crt")}
    names = toolchain.image_wheels(load_stack("fp8"), locked, toolchain.load_rules())
    assert names == {"nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cublas", "nvidia-cuda-crt"}
