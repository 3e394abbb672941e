"""Generated sections of README.md. A section lives between `<!-- NAME:start -->` and `<!-- NAME:end -->`
and is rewritten from data, never edited by hand; `check_sections` fails when the file has drifted."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from rlstack.core.errors import RlstackError
from rlstack.core.paths import project_root
from rlstack.core.tables import markdown_table
from rlstack.host import stacks
from rlstack.host.stack_table import HEADERS, stack_row


def stacks_section() -> str:
    return markdown_table(HEADERS, [stack_row(s) for s in stacks.load_all()])


def matrix_section() -> str:
    from rlstack import matrix

    return matrix.render_markdown(matrix.load())


GENERATORS: dict[str, Callable[[], str]] = {"stacks": stacks_section, "compat-matrix": matrix_section}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {re.escape(name)}:start -->\n)(.*?)(<!-- {re.escape(name)}:end -->)", re.S)


def replace_section(text: str, name: str, body: str) -> str:
    pat = _pattern(name)
    if not pat.search(text):
        raise RlstackError(
            f"README has no '{name}' section", f"add '<!-- {name}:start -->' and '<!-- {name}:end -->' lines"
        )
    return pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(3), text, count=1)


def render_readme(path: Path | None = None) -> Path:
    path = path or project_root() / "README.md"
    text = path.read_text()
    for name, gen in GENERATORS.items():
        text = replace_section(text, name, gen())
    path.write_text(text)
    return path


def stale_sections(path: Path | None = None) -> list[str]:
    path = path or project_root() / "README.md"
    text = path.read_text()
    return [name for name, gen in GENERATORS.items() if replace_section(text, name, gen()) != text]
