"""Fuzzing the stack-file parser: any bytes in stack.toml give a StackFileError (with the file named) or
a valid Stack, never another exception."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstack import stacks
from rlstack.core.errors import StackFileError

ROOT = Path(__file__).resolve().parents[2]
REAL = (ROOT / "images" / "fp8" / "stack.toml").read_text()


def _check(tmp: Path, text: str) -> None:
    folder = tmp / "fp8"
    folder.mkdir(exist_ok=True)
    (folder / "requirements.in").write_text("vllm==0.21.0\n")
    path = folder / "stack.toml"
    path.write_text(text)
    try:
        stack = stacks.load_stack_file(path)
    except StackFileError as exc:
        assert str(path) in str(exc)
    else:
        assert stack.name == "fp8"


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(text=st.text(max_size=400))
def test_random_text(tmp_path: Path, text: str) -> None:
    _check(tmp_path, text)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(cut=st.integers(min_value=0, max_value=len(REAL)), junk=st.text(max_size=20))
def test_truncated_and_spliced_real_file(tmp_path: Path, cut: int, junk: str) -> None:
    _check(tmp_path, REAL[:cut] + junk)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    key=st.sampled_from(["python", "gpu_archs", "gpu_required", "max_image_gb", "base_image", "name", "fp8_rl"]),
    value=st.one_of(st.integers(), st.text(max_size=10), st.booleans(), st.lists(st.text(max_size=5), max_size=3)),
)
def test_wrong_types(tmp_path: Path, key: str, value: object) -> None:
    import json

    lines = [ln for ln in REAL.splitlines() if not ln.startswith(f"{key} =")]
    lines.insert(0, f"{key} = {json.dumps(value)}")
    _check(tmp_path, "\n".join(lines) + "\n")


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_any_bytes(tmp_path: Path, data: bytes) -> None:
    """Binary or non-UTF-8 bytes as a stack file: a StackFileError that names the file, never a traceback."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    (folder / "stack.toml").write_bytes(data)
    try:
        stacks.load_stack_file(folder / "stack.toml")
    except StackFileError as exc:
        assert "stack.toml" in str(exc)
