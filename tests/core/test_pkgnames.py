"""One home for package names: the PEP 503 normaliser and the name of a requirement line."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement

from rlstack import stacks
from rlstack.core.errors import StackFileError
from rlstack.core.pkgnames import normalize, requirement_name


@pytest.mark.parametrize(("line", "name"), [
    ("trl==0.24.0", "trl"),
    ("Unsloth_Zoo==2026.6.1", "unsloth-zoo"),
    ("unsloth<=2026.6.1", "unsloth"),
    ("zope.interface[test] >= 5 ; python_version >= '3.8'", "zope-interface"),
    ("requests", "requests"),
    ("pkg @ https://example.org/pkg-1.0-py3-none-any.whl", "pkg"),
])
def test_requirement_name(line: str, name: str) -> None:
    assert requirement_name(line) == name == normalize(name)


def test_requirement_name_rejects_options() -> None:
    with pytest.raises(InvalidRequirement):
        requirement_name("--index-url https://example.org/simple")


def test_stack_file_catches_owned_pins_by_their_real_name(stack_tree: Path) -> None:
    req = stack_tree / "images" / "cpu" / "requirements.in"
    original = req.read_text()
    req.write_text(original + "Torch[opt] >= 2 ; sys_platform == 'linux'\n")
    with pytest.raises(StackFileError, match="which stack.toml owns"):
        stacks.load_stack("cpu")
    req.write_text(original + "--extra-index-url https://example.org/simple\n")
    with pytest.raises(StackFileError, match="is not a requirement"):
        stacks.load_stack("cpu")
