"""The layout shows the architecture: the payload (what runs in a stack) and the shared core never reach into
the host side, and the compat matrix never into the README generator (the old docs <-> matrix circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "rlstack"
FORBIDDEN = {
    "core": ("rlstack.host", "rlstack.payload", "rlstack.probes", "rlstack.matrix"),
    "payload": ("rlstack.host", "rlstack.probes", "rlstack.matrix"),
    "matrix": ("rlstack.host", "rlstack.payload"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_across_the_boundary(package: str) -> None:
    bad = [f"{path.relative_to(SRC)}:{line} imports {name}"
           for path in sorted((SRC / package).rglob("*.py")) for line, name in _imports(path)
           if name.startswith(FORBIDDEN[package])]
    assert not bad, "\n".join(bad)
