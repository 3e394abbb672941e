from __future__ import annotations

import pytest

from rlstack.core.errors import RlstackError
from rlstack.host import docs


def test_readme_sections_are_current() -> None:
    assert docs.stale_sections() == [], "run: invoke docs"


def test_replace_section_only_between_markers() -> None:
    text = "a\n<!-- x:start -->\nold\n<!-- x:end -->\nb\n"
    assert docs.replace_section(text, "x", "new") == "a\n<!-- x:start -->\nnew\n<!-- x:end -->\nb\n"


def test_missing_markers_say_what_to_add() -> None:
    with pytest.raises(RlstackError, match="x:start"):
        docs.replace_section("no markers", "x", "body")
