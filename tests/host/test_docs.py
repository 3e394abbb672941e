from __future__ import annotations

import pytest

from rlstack.core.errors import RlstackError
from rlstack.host import commands, docs


def test_readme_sections_are_current() -> None:
    assert set(commands.readme_sections()) == {"stacks", "tasks", "compat-matrix"}
    assert docs.stale_sections(commands.readme_sections()) == [], "run: invoke docs"


def test_the_task_table_shows_real_defaults_and_the_namespaces() -> None:
    table = commands.tasks_section()
    assert "None" not in table
    assert "`invoke train [--stack cpu]`" in table and "`invoke stacks [--stack STACK]`" in table
    assert "`invoke ci.probe-job --stack STACK`" in table and "`invoke dev.lint`" in table
    assert "`invoke shell [--stack cpu] [-- CMD]`" in table and "`invoke diagnose LOG`" in table


def test_replace_section_only_between_markers() -> None:
    text = "a\n<!-- x:start -->\nold\n<!-- x:end -->\nb\n"
    assert docs.replace_section(text, "x", "new") == "a\n<!-- x:start -->\nnew\n<!-- x:end -->\nb\n"


def test_missing_markers_say_what_to_add() -> None:
    with pytest.raises(RlstackError, match="x:start"):
        docs.replace_section("no markers", "x", "body")


def test_no_link_leaves_the_repository() -> None:
    """A user's clone has only the repository: every relative link in the README and docs/ resolves inside
    it (the report is cited by name and its facts are in docs/report.md)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(root) and resolved.exists(), f"{page.name} links {target}"
