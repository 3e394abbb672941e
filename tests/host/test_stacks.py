from __future__ import annotations

from pathlib import Path

import pytest

from rlstack import stacks
from rlstack.core.errors import StackFileError, UnknownStackError


def test_all_real_stacks_load() -> None:
    loaded = {s.name: s for s in stacks.load_all()}
    assert set(loaded) == {"cpu", "portable", "fp8", "fp8-report"}
    assert loaded["portable"].torch.version == "2.10.0"
    for name in ("fp8", "fp8-report"):
        assert loaded[name].torch.version == "2.11.0"
        assert loaded[name].torch.cuda == "13.0"
        assert "sm_120" in loaded[name].gpu_archs
    assert not loaded["cpu"].gpu_required


def test_fp8_rl_is_data_in_the_stack_file() -> None:
    """Which stacks take Unsloth's FP8 RL path in the runtime probes is a stack.toml field, not a name."""
    assert {s.name for s in stacks.load_all() if s.fp8_rl} == {"fp8", "fp8-report"}


def test_unknown_stack_lists_valid_ones() -> None:
    with pytest.raises(UnknownStackError) as exc:
        stacks.load_stack("portabel")
    assert "cpu, fp8, fp8-report, portable" in str(exc.value)


def test_resolve_names_validates_each() -> None:
    assert stacks.resolve_names("cpu,fp8") == ["cpu", "fp8"]
    assert stacks.resolve_names(None) == ["cpu", "fp8", "fp8-report", "portable"]
    with pytest.raises(UnknownStackError):
        stacks.resolve_names("cpu,nope")


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ('python = "3.11"', 'python = "three"', "python", "pattern"),
        ('gpu_archs = ["sm_90", "sm_100", "sm_120"]', 'gpu_archs = ["hopper"]', "gpu_archs", "sm_90"),
        ('version = "2.11.0"', 'version = 2', "torch.version", "string"),
        ("max_image_gb = 24", "max_image_gb = -1", "max_image_gb", "greater than 0"),
        ('name = "fp8"', 'name = "fp8"\ncolour = "blue"', "colour", "Extra inputs"),
        ("gpu_required = true", "gpu_required = true\n", "", ""),  # still valid: control case
    ],
)
def test_malformed_stack_names_file_and_field(stack_tree: Path, old: str, new: str, field: str, words: str) -> None:
    path = stack_tree / "images" / "fp8" / "stack.toml"
    _edit(path, old, new)
    if not field:
        assert stacks.load_stack("fp8").name == "fp8"
        return
    with pytest.raises(StackFileError) as exc:
        stacks.load_stack("fp8")
    msg = str(exc.value)
    assert str(path) in msg
    assert f"field '{field}'" in msg
    assert words in msg


def test_missing_field_is_named(stack_tree: Path) -> None:
    path = stack_tree / "images" / "cpu" / "stack.toml"
    _edit(path, 'base_image = "debian:bookworm-slim"\n', "")
    with pytest.raises(StackFileError, match="field 'base_image': Field required"):
        stacks.load_stack("cpu")


def test_bad_toml_syntax(stack_tree: Path) -> None:
    path = stack_tree / "images" / "cpu" / "stack.toml"
    path.write_text(path.read_text() + "\nthis is not toml\n")
    with pytest.raises(StackFileError, match="not valid TOML"):
        stacks.load_stack("cpu")


def test_gpu_stack_needs_archs(stack_tree: Path) -> None:
    path = stack_tree / "images" / "portable" / "stack.toml"
    _edit(path, 'gpu_archs = ["sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]', "gpu_archs = []")
    with pytest.raises(StackFileError, match="gpu_archs is empty"):
        stacks.load_stack("portable")


def test_name_must_match_folder(stack_tree: Path) -> None:
    _edit(stack_tree / "images" / "cpu" / "stack.toml", 'name = "cpu"', 'name = "laptop"')
    with pytest.raises(StackFileError, match="folder is 'cpu'"):
        stacks.load_stack("cpu")


def test_torch_pin_belongs_to_stack_toml(stack_tree: Path) -> None:
    req = stack_tree / "images" / "cpu" / "requirements.in"
    req.write_text(req.read_text() + "torch==2.9.0\n")
    with pytest.raises(StackFileError, match="stack.toml owns"):
        stacks.load_stack("cpu")


def test_derived_pins_come_from_stack_toml() -> None:
    # nvcc, then the rest of its release that stack.toml pins as components (sorted by name)
    assert stacks.load_stack("fp8").derived_pins() == ["torch==2.11.0", "nvidia-cuda-nvcc==13.0.88",
                                                       "nvidia-cuda-cccl==13.0.85", "nvidia-cuda-crt==13.0.88",
                                                       "nvidia-nvvm==13.0.88"]
    assert stacks.load_stack("portable").derived_pins() == ["torch==2.10.0"]  # its cu12 wheel holds no nvcc
    assert stacks.load_stack("fp8-report").derived_pins() == ["torch==2.11.0", "nvidia-cuda-nvcc-cu12==12.8.61"]
    assert stacks.load_stack("cpu").derived_pins() == ["torch==2.10.0"]
