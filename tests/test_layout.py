"""The layout says where code runs, and these tests hold it to that (docs/decisions/0001-layers.md).

Layers, imports pointing down only (an import inside a function counts as much as one at the top: a lazy import
is still a dependency):

    cli        rlstack.cli and tasks.py: the command lines
    host       Docker, images, containers, native staging, CI jobs, README rendering
    matrix     compat_matrix.yaml: schema, merge, rendering
    probes     static analyses of locked wheels; runtime probes (run inside a stack)
    payload    runs inside a stack: recipes, data, rewards, train, evaluate, fastgen
    stacks     the pure stack model: stack files, lock parsing, uv resolution, machine settings
    scripts    runs where rlstack is not installed (by path in `docker build`, on a bare GPU host): stdlib only
    core       errors, paths, file helpers, the command runner
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "rlstack"
LAYERS = ["core", "scripts", "stacks", "payload", "probes", "matrix", "host", "cli"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer(module: str) -> str:
    """The layer of an rlstack module: its top package, `cli` for rlstack.cli, `core` for the package's face."""
    parts = module.split(".")
    if len(parts) == 1:
        return "core"  # rlstack/__init__.py: the version string
    return "cli" if parts[1] == "cli" else parts[1]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every rlstack module the file imports, anywhere in it: `from rlstack.x import y` names rlstack.x.y where
    that is a module, else rlstack.x."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "rlstack"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "rlstack":
                continue
            for a in node.names:
                out.append((node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base))
    return out


def test_the_layers_cover_every_package() -> None:
    assert {layer(m) for m in MODULES} <= set(LAYERS), "a new package needs its place in LAYERS (and the decision)"


@pytest.mark.parametrize("package", LAYERS)
def test_imports_point_down_only(package: str) -> None:
    rank = LAYERS.index(package)
    bad = [f"{path.relative_to(SRC)}:{line} imports {name} ({layer(name)} is above {package})"
           for mod, path in MODULES.items() if layer(mod) == package
           for line, name in imported_modules(path) if LAYERS.index(layer(name)) > rank]
    assert not bad, "\n".join(bad)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_circles_are_found() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_source_files() -> None:
    """A package's __init__ re-exporting its modules is not a circle with them: a module importing its own
    package's face is what is counted."""
    graph = {mod: {name for _, name in imported_modules(path) if name in MODULES and name != mod}
             for mod, path in MODULES.items()}
    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def _stdlib_only(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `code` with no site-packages at all (-S -I): a third-party import fails there."""
    return subprocess.run([sys.executable, "-S", "-I", "-c", code], text=True, capture_output=True, cwd=cwd)


def test_the_bare_host_installer_needs_only_the_standard_library(tmp_path: Path) -> None:
    proc = _stdlib_only(f"import sys; sys.path.insert(0, {str(SRC)!r}); import rlstack.scripts.native_install as m; "
                        "print(sorted(n for n in sys.modules if n.startswith('rlstack')))", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rlstack.scripts.native_install" in proc.stdout


def test_the_image_build_check_runs_by_path_alone(tmp_path: Path) -> None:
    """images/Dockerfile mounts this one file into the build, before rlstack is installed."""
    script = shutil.copy(PKG / "scripts" / "image_checks.py", tmp_path / "image_checks.py")
    proc = subprocess.run([sys.executable, "-S", "-I", str(script), "--help"], text=True, capture_output=True,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rlstack" not in {n.split(".")[0] for _, n in imported_modules(PKG / "scripts" / "image_checks.py")}


def test_the_command_lines_start_without_the_ml_libraries() -> None:
    """Heavy imports stay inside the functions that need them: `rlstack --help` and invoke's task list must not
    wait for torch, and a host without the ML libraries must still list and build stacks."""
    heavy = ("torch", "transformers", "trl", "peft", "unsloth", "vllm", "triton", "accelerate")
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; import rlstack.cli, rlstack.host.commands, rlstack.payload.commands, "
                           "rlstack.payload.fastgen, rlstack.probes.commands; "
                           f"print(sorted(m for m in {heavy!r} if m in sys.modules))"],
                          text=True, capture_output=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
