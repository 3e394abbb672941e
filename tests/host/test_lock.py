from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlstack.cli import main
from rlstack.core.errors import LockError, StaleLockError
from rlstack.host import locks, stacks


def test_committed_locks_are_fresh_and_hashed() -> None:
    for stack in stacks.load_all():
        locks.check(stack)
        text = stack.lock_file.read_text()
        pins = locks.parse_pins(text)
        assert pins["torch"] == stack.torch.version
        # every pinned package carries at least one sha256
        assert text.count("==") <= text.count("--hash=sha256:")


def test_fp8_lock_has_the_reports_versions() -> None:
    pins = locks.locked_versions(stacks.load_stack("fp8"))
    assert pins["vllm"] == "0.21.0"
    assert pins["unsloth"] == "2026.3.11"  # what vllm 0.21 allows, as in the report
    assert pins["unsloth-zoo"] == "2026.6.1"
    assert pins["nvidia-cuda-nvcc-cu12"] == "12.8.61"


def test_changed_pin_makes_lock_stale(stack_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = stack_tree / "images" / "cpu" / "requirements.in"
    req.write_text(req.read_text().replace("trl==0.24.0", "trl==0.23.0"))
    with pytest.raises(StaleLockError) as exc:
        locks.check(stacks.load_stack("cpu"))
    assert "stack 'cpu'" in str(exc.value)
    assert "invoke lock --stack cpu" in str(exc.value)
    assert main(["lock", "--check"]) == StaleLockError.exit_code
    captured = capsys.readouterr()
    err = captured.err
    assert "STALE" in err and "cpu" in err
    assert "lock ok: fp8" in captured.out


def test_stack_toml_change_makes_lock_stale(stack_tree: Path) -> None:
    path = stack_tree / "images" / "fp8" / "stack.toml"
    path.write_text(path.read_text().replace('version = "12.8.61"', 'version = "12.9.86"'))
    with pytest.raises(StaleLockError, match="stack 'fp8'"):
        locks.check(stacks.load_stack("fp8"))


def test_purpose_edit_keeps_lock_fresh(stack_tree: Path) -> None:
    path = stack_tree / "images" / "cpu" / "stack.toml"
    path.write_text(path.read_text().replace("GRPO training", "GRPO training (edited)"))
    locks.check(stacks.load_stack("cpu"))


def test_missing_lock_and_missing_header(stack_tree: Path) -> None:
    cpu = stacks.load_stack("cpu")
    body = cpu.lock_file.read_text()
    cpu.lock_file.unlink()
    with pytest.raises(StaleLockError, match="missing"):
        locks.check(cpu)
    cpu.lock_file.write_text("\n".join(body.splitlines()[2:]))
    with pytest.raises(StaleLockError, match="no rlstack-lock header"):
        locks.check(cpu)


def test_hand_edited_torch_is_caught(stack_tree: Path) -> None:
    cpu = stacks.load_stack("cpu")
    cpu.lock_file.write_text(cpu.lock_file.read_text().replace("torch==2.10.0", "torch==2.9.1"))
    with pytest.raises(LockError, match="torch is 2.9.1"):
        locks.check(cpu)


def test_wrong_cuda_build_is_caught(stack_tree: Path) -> None:
    path = stack_tree / "images" / "cpu" / "stack.toml"
    path.write_text(path.read_text().replace('cuda = "12.8"', 'cuda = "12.6"'))
    cpu = stacks.load_stack("cpu")
    with pytest.raises(LockError, match="CUDA runtime 12.8"):
        locks.check_lock_consistency(cpu)


def test_explain_failure_keeps_the_resolvers_words() -> None:
    stderr = (
        "Using Python 3.11\n  x No solution found when resolving dependencies:\n"
        "  cause: Because vllm==0.21.0 depends on torch==2.11.0 and you require torch==2.10.0, ...\n"
    )
    out = locks.explain_failure(stderr)
    assert "vllm==0.21.0 depends on torch==2.11.0" in out
    assert "Using Python" not in out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv not installed")
def test_conflicting_pins_fail_with_names() -> None:
    """Needs PyPI. torch 2.10 and vllm 0.21 cannot share an environment."""
    res = locks.resolve(["vllm==0.21.0", "torch==2.10.0"], "3.11", "x86_64-manylinux_2_28", hashes=False)
    assert not res.ok
    assert "torch==2.11.0" in res.text and "torch==2.10.0" in res.text
