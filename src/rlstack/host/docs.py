"""Generated sections of README.md. A section lives between `<!-- NAME:start -->` and `<!-- NAME:end -->`
and is rewritten from data, never edited by hand; `stale_sections` names the ones that drifted. This module
renders the stacks table and the compat matrix into the README (the matrix package itself knows nothing of the
README). Sections rendered from what imports this module, such as the task table of the commands, are passed
in with the rest (rlstack.host.commands.readme_sections), so this module imports nothing above it."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

from rlstack import stacks
from rlstack.core.errors import LockError, RlstackError
from rlstack.core.fileio import write_atomic
from rlstack.core.paths import project_root
from rlstack.core.pkgnames import normalize
from rlstack.core.tables import markdown_table
from rlstack.stacks import locks
from rlstack.stacks.model import Stack

HEADERS = ["stack", "python", "torch", "cuda", "nvcc", "gpu archs", "key packages", "lock"]


def stack_row(stack: Stack) -> list[str]:
    try:
        versions = locks.locked_versions(stack)
        lock_id = locks.lock_hash(stack)[:12]
    except (LockError, FileNotFoundError):
        versions, lock_id = {}, "missing"
    keys = ", ".join(f"{p} {versions.get(normalize(p), '?')}" for p in stack.key_packages)
    return [
        stack.name,
        stack.python,
        stack.torch.version,
        stack.cuda_label,
        stack.cuda_toolkit.version if stack.cuda_toolkit else "-",
        " ".join(stack.gpu_archs) or "cpu only",
        keys,
        lock_id,
    ]


def stacks_section() -> str:
    return markdown_table(HEADERS, [stack_row(s) for s in stacks.load_all()])


def matrix_section() -> str:
    from rlstack.matrix import render, store

    return render.render_markdown(store.load())


Generators = Mapping[str, Callable[[], str]]
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


def render_readme(generators: Generators, path: Path | None = None, sections: list[str] | None = None) -> Path:
    """Rewrite the generated sections (all of `generators`, or the named ones) of the README in place."""
    path = path or project_root() / "README.md"
    text = path.read_text()
    for name, gen in generators.items():
        if sections is None or name in sections:
            text = replace_section(text, name, gen())
    write_atomic(path, text)
    return path


def stale_sections(generators: Generators, path: Path | None = None) -> list[str]:
    """The sections of `generators` whose text in the README differs from what they render now."""
    path = path or project_root() / "README.md"
    text = path.read_text()
    return [name for name, gen in generators.items() if replace_section(text, name, gen()) != text]


def publish_matrix(files: list[Path], path: Path | None = None, *, init: bool = False, drop: list[str] | None = None,
                   readme: bool = True) -> int:
    """Merge probe reports into the matrix file (when there are any, or rows to drop), then render the page
    and the README section from what the file now holds."""
    from rlstack.matrix import render, store

    path = path or store.matrix_path()
    if files or drop:
        m, dropped = store.merge(files, path, init=init, drop=drop or [])
        for r in dropped:
            print(f"dropped row {r.stack} {(r.lock_hash or '-')[:12]} {r.gpu_arch or '-'} {r.source} {r.date[:10]}")
        print(f"merged {len(files)} result file(s) into {path} ({len(m.rows)} rows)")
    else:
        m = store.load(path, init=init)
        if init and not path.is_file():
            store.write(m, path)
            print(f"started {path} (no rows yet)")
    page = path.parent / render.HTML_FILE
    page.parent.mkdir(parents=True, exist_ok=True)
    print(f"wrote {write_atomic(page, render.render_html(m))}")
    if readme:
        readme_path = path.parent / "README.md"
        text = readme_path.read_text()
        new = replace_section(text, "compat-matrix", render.render_markdown(m))
        if new != text:
            write_atomic(readme_path, new)
        print(f"wrote {readme_path}")
    return 0
