"""The one check of a user-given name that becomes a folder, and the one way rlstack makes such a name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlstack.core.names import MAX_LENGTH, InvalidNameError, check_name, to_name


@pytest.mark.parametrize("name", ["a", "run-1", "smoke_cpu.v2", "A" * MAX_LENGTH, "0x"])
def test_good_names_pass_unchanged(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(("name", "why"), [
    ("", "is empty"), ("..", "is a path"), (".", "is a path"), ("../escape", "is a path"), ("a/b", "is a path"),
    ("a\\b", "is a path"), ("x" * 300, "300 characters"), ("two words", "whitespace"), ("tab\tx", "whitespace"),
    ("ünïcode", "non-ASCII"), ("a:b", "':'"), ("a;rm", "';'"), (".hidden", "starts with"), ("-x", "starts with"),
])
def test_bad_names_say_what_is_wrong(name: str, why: str) -> None:
    with pytest.raises(InvalidNameError, match="--adapter-name") as exc:
        check_name(name, "--adapter-name")
    assert why in exc.value.message and "ASCII letters, digits" in str(exc.value.hint)


@given(st.text(max_size=300))
def test_any_text_is_a_name_or_a_clear_error(text: str) -> None:
    try:
        assert check_name(text) == text
    except InvalidNameError as exc:
        assert exc.hint
        return
    assert "/" not in text and text not in (".", "..") and len(text) <= MAX_LENGTH


@given(st.text(max_size=400))
def test_to_name_always_makes_a_valid_name(text: str) -> None:
    assert check_name(to_name(text)) == to_name(text)


def test_to_name_keeps_what_it_can() -> None:
    assert to_name("embedded:smollm2-135m") == "embedded-smollm2-135m"
    assert to_name("Qwen/Qwen3-0.6B") == "Qwen-Qwen3-0.6B"
    assert to_name("../..") == "run"
