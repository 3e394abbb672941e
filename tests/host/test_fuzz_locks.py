"""Fuzzing the lock parser and its self-check: any bytes as a stack's lock give a LockError (with the file and
the fix named) or a lock that checks, never another exception; and any edit of a committed lock that changes
what it pins or hashes fails the check."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstack import stacks
from rlstack.core.errors import LockError
from rlstack.stacks import locks

ROOT = Path(__file__).resolve().parents[2]
REAL = (ROOT / "images" / "build-backend.lock").read_text()
CPU = (ROOT / "images" / "cpu" / "requirements.lock").read_text()
FUZZ = settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=400), other=st.text(max_size=200))
def test_parser_takes_any_text(text: str, other: str) -> None:
    parsed = locks.parse_locked(text)
    assert all(isinstance(p, locks.LockedPackage) and p.name for p in parsed.values())
    assert isinstance(locks.set_digest(text), str) and isinstance(locks.describe_edits(text, other), list)
    try:
        locks.verify_digest(Path("x.lock"), text, "run: invoke lock", lambda: other)
    except locks.EditedLockError as exc:
        assert "x.lock" in exc.message and exc.hint == "run: invoke lock"


@FUZZ
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_as_a_stacks_lock(stack_tree: Path, data: bytes) -> None:
    cpu = stacks.load_stack("cpu")
    cpu.lock_file.write_bytes(data)
    with pytest.raises(LockError) as exc:
        locks.check(cpu)
    assert exc.value.hint and "invoke lock --stack cpu" in exc.value.hint


@FUZZ
@given(cut=st.integers(min_value=0, max_value=len(CPU)), junk=st.text(max_size=30))
def test_truncated_and_spliced_real_lock(stack_tree: Path, cut: int, junk: str) -> None:
    cpu = stacks.load_stack("cpu")
    cpu.lock_file.write_text(CPU[:cut] + junk)
    try:
        locks.check(cpu)
    except LockError as exc:
        assert exc.hint
    else:  # only what leaves every pin and hash as it was (a comment, a blank) can pass
        assert locks.set_digest(CPU[:cut] + junk) == locks.set_digest(CPU)


@FUZZ
@given(data=st.data())
def test_any_deleted_or_changed_line_that_moves_a_pin_or_hash_fails(stack_tree: Path, data: st.DataObject) -> None:
    lines = REAL.splitlines(keepends=True)
    start = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    stop = data.draw(st.integers(min_value=start, max_value=min(len(lines), start + 6)))
    repl = data.draw(st.sampled_from(["", "x", "0", "a", "1"]))
    col = data.draw(st.integers(min_value=0, max_value=max(0, len(lines[start]) - 2)))
    if data.draw(st.booleans()):
        new = lines[:start] + lines[stop:]  # lines deleted
    else:
        line = lines[start]
        new = [*lines[:start], line[:col] + repl + line[col + 1:], *lines[start + 1:]]  # one character changed
    text = "".join(new)
    path = locks.build_backend_lock_file(stack_tree)
    path.write_text(text)
    sealed = locks.DIGEST_RE.search(text)
    if locks.set_digest(text) == locks.set_digest(REAL) and sealed and sealed["digest"] == locks.set_digest(REAL) \
            and locks.read_header(text).get("inputs") == locks.read_header(REAL)["inputs"] \
            and not locks.stray_lines(text):  # a comment that lost its '#' is text pip would read: an edit
        locks.check_build_backend(stack_tree)  # a comment, a blank or the header's other words changed
    else:
        with pytest.raises(LockError):
            locks.check_build_backend(stack_tree)
