"""Small static-analysis helpers over Python source text: module-level bindings, class attributes with
their bases resolved across files, free names of a function, attribute uses on a receiver expression.

They read source with `ast` only; nothing is imported, so a wheel for another CUDA or platform is fine.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import gc
import importlib
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import TypeVar

BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__builtins__", "__class__"}


@dataclass
class Binding:
    """A module-level name: where it is bound and how (a class/def, an import, a plain assignment)."""

    name: str
    line: int
    kind: str  # "class" | "def" | "import" | "assign"
    node: ast.AST | None = None
    module: str | None = None  # for imports: the module it comes from
    attr: str | None = None  # for `from m import attr as name`
    in_try: bool = False


@dataclass
class ModuleInfo:
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)

    def add(self, b: Binding) -> None:
        self.bindings.setdefault(b.name, []).append(b)


# Nodes of each parsed module grouped by type, built by one walk and kept with the tree (trees are shared and
# never mutated: walk(live=True) prunes without copying): the checks ask "every Call", "every Assign" of a
# 6,000-line module many times, and a fresh ast.walk each time was most of a cold probe's CPU.
_INDEX: dict[int, tuple[ast.AST, dict[type, list[ast.AST]]]] = {}
_INDEX_LOCK = threading.Lock()
_N = TypeVar("_N", bound=ast.AST)


def nodes(tree: ast.AST, kind: type[_N]) -> list[_N]:
    """Every node of exactly this type in the tree, in ast.walk's order. Indexed once per module tree; a
    subtree (a function) is walked."""
    if not isinstance(tree, ast.Module):
        return [n for n in ast.walk(tree) if type(n) is kind]
    entry = _INDEX.get(id(tree))
    if entry is None or entry[0] is not tree:
        by: dict[type, list[ast.AST]] = {}
        for n in walk(tree):
            by.setdefault(type(n), []).append(n)
        entry = (tree, by)
        with _INDEX_LOCK:
            if len(_INDEX) > 4000:
                _INDEX.clear()
            _INDEX[id(tree)] = entry
    return entry[1].get(kind, [])  # type: ignore[return-value]


def walk(node: ast.AST, *, live: bool = False) -> list[ast.AST]:
    """The nodes ast.walk yields, in its order (breadth first), as a list: about twice as fast (no generator
    per node). `live`: statements after a return or raise in the same block are left out (code that never
    runs), at every level, without copying the tree."""
    out = [node]
    i = 0
    while i < len(out):
        n = out[i]
        i += 1
        for name in n._fields:
            v = getattr(n, name, None)
            if isinstance(v, ast.AST):
                out.append(v)
            elif isinstance(v, list):
                if live and name in ("body", "orelse", "finalbody") and v and isinstance(v[0], ast.stmt):
                    v = reachable(v)
                out.extend(x for x in v if isinstance(x, ast.AST))
    return out


def last_name(e: ast.expr) -> str:
    """The last dotted part of an expression's source (`a.b.c` -> 'c'), as ast.unparse(e).split('.')[-1]
    would give it, without unparsing the common cases."""
    if isinstance(e, ast.Attribute):
        return e.attr
    if isinstance(e, ast.Name):
        return e.id
    return ast.unparse(e).split(".")[-1]


def attribute_chain(node: ast.expr) -> tuple[ast.expr, list[str]]:
    """The root of `a.b.c` and the attribute names after it (`a`, ["b", "c"]); a non-attribute is its own root."""
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.insert(0, node.attr)
        node = node.value
    return node, chain


def call_lines(tree: ast.AST, name: str) -> list[int]:
    """Lines of every call whose callee's last dotted part is `name` (`patch_vllm(...)`, `x.patch_vllm(...)`)."""
    return sorted(n.lineno for n in nodes(tree, ast.Call) if last_name(n.func) == name)


_REGISTRIES: dict[int, tuple[ast.Module, dict[tuple[str, str], str]]] = {}


def registry_values(tree: ast.Module) -> dict[tuple[str, str], str]:
    """{(REG, key): name} for every module-wide `REG["key"] = name` (the last one stored wins); once per tree."""
    got = _REGISTRIES.get(id(tree))
    if got is None or got[0] is not tree:
        if len(_REGISTRIES) > 4000:
            _REGISTRIES.clear()
        got = _REGISTRIES[id(tree)] = (tree, _registry_values(tree))
    return got[1]


def _registry_values(tree: ast.Module) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for node in nodes(tree, ast.Assign):
        if isinstance(node.value, ast.Name):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and \
                        isinstance(t.slice, ast.Constant):
                    out[(t.value.id, t.slice.value)] = node.value.id  # type: ignore[index]
    return out


_PARSE_LOCK = threading.Lock()


def parse(text: str) -> ast.Module:
    """ast.parse, one at a time, with the cyclic garbage collector paused.

    One at a time: CPython 3.11 keeps the recursion depth of its C-to-Python AST conversion in state that all
    threads share, so two threads parsing at once can fail with "SystemError: AST constructor recursion depth
    mismatch" (cpython gh-106905, seen here in the probes' thread pools). Parsing holds the GIL throughout, so
    the lock costs no parallelism. Collector paused: a parse allocates hundreds of thousands of nodes, none of
    them garbage, and with the cached trees of other modules alive each collection it triggers walks them all
    (measured: 2/3 of the parse time of a 400 KB module)."""
    with _PARSE_LOCK:
        was = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(text)
        finally:
            if was:
                gc.enable()


def relative_base(file: str) -> str:
    """What relative imports in a file resolve against, as a dotted name whose last part is dropped for level 1:
    `pkg/mod.py` -> 'pkg.mod' (`from . import x` is pkg.x), `pkg/__init__.py` -> 'pkg.__init__' (`from .core
    import *` in a package's __init__ is pkg.core: the package is its own parent's child, not its sibling)."""
    mod = file[:-3] if file.endswith(".py") else file
    return mod.replace("/", ".")


def _resolve_relative(module: str | None, level: int, current: str) -> str:
    """The absolute module of `from <level dots><module> import ...` in the module `current` (relative_base)."""
    if level == 0:
        return module or ""
    parts = current.split(".")
    base = parts[: len(parts) - level] if level <= len(parts) else []
    return ".".join([*base, module] if module else base)


def module_info(tree: ast.Module, current: str = "") -> ModuleInfo:
    """Every name bound at module level, descending into if/try/with/for blocks but not into functions."""
    info = ModuleInfo()

    def targets(node: ast.AST) -> list[ast.Name]:
        return [n for n in ast.walk(node) if isinstance(n, ast.Name)]

    def visit(stmts: list[ast.stmt], in_try: bool) -> None:
        for s in stmts:
            if isinstance(s, ast.ClassDef):
                info.add(Binding(s.name, s.lineno, "class", s, in_try=in_try))
            elif isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
                info.add(Binding(s.name, s.lineno, "def", s, in_try=in_try))
            elif isinstance(s, ast.Import):
                for a in s.names:
                    info.add(Binding(a.asname or a.name.split(".")[0], s.lineno, "import",
                                     module=a.name if a.asname else a.name.split(".")[0], in_try=in_try))
            elif isinstance(s, ast.ImportFrom):
                mod = _resolve_relative(s.module, s.level, current)
                for a in s.names:
                    if a.name == "*":
                        info.star_imports.append(mod)
                    else:
                        info.add(Binding(a.asname or a.name, s.lineno, "import", module=mod, attr=a.name,
                                         in_try=in_try))
            elif isinstance(s, ast.Assign | ast.AnnAssign | ast.AugAssign):
                tgts = s.targets if isinstance(s, ast.Assign) else [s.target]
                for t in tgts:
                    for n in targets(t):
                        info.add(Binding(n.id, s.lineno, "assign", s, in_try=in_try))
            elif isinstance(s, ast.If):
                visit(s.body, in_try)
                visit(s.orelse, in_try)
            elif isinstance(s, ast.Try | ast.TryStar):
                visit(s.body, True)
                for h in s.handlers:
                    visit(h.body, True)
                visit(s.orelse, True)
                visit(s.finalbody, in_try)
            elif isinstance(s, ast.With | ast.AsyncWith):
                for item in s.items:
                    if item.optional_vars is not None:
                        for n in targets(item.optional_vars):
                            info.add(Binding(n.id, s.lineno, "assign", s, in_try=in_try))
                visit(s.body, in_try)
            elif isinstance(s, ast.For | ast.AsyncFor | ast.While):
                if not isinstance(s, ast.While):
                    for n in targets(s.target):
                        info.add(Binding(n.id, s.lineno, "assign", s, in_try=in_try))
                visit(s.body, in_try)
                visit(s.orelse, in_try)
    visit(tree.body, False)
    return info


def stdlib_names(module: str) -> set[str] | None:
    """Public names of a standard-library module (for `from typing import *`); importing stdlib is cheap
    and safe. None for anything else."""
    if module.split(".")[0] not in sys.stdlib_module_names:
        return None
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return set(getattr(mod, "__all__", [n for n in dir(mod) if not n.startswith("_")]))


@dataclass
class Use:
    name: str
    line: int


def function_free_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> list[Use]:
    """Names a function (or class body) loads that nothing inside it binds and that are not builtins: the
    names it needs from whatever namespace it is executed in (code after a return is ignored). First use
    of each, in source order."""
    every = walk(fn, live=True)  # no copy of the function: a pasted loss is hundreds of lines
    bound: set[str] = set()
    for node in every:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node is not fn:
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                bound.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
    seen: dict[str, int] = {}
    for node in every:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in bound or node.id in BUILTINS:
                continue
            if node.id not in seen or node.lineno < seen[node.id]:
                seen[node.id] = node.lineno
    return [Use(n, ln) for n, ln in sorted(seen.items(), key=lambda kv: kv[1])]


def attribute_uses(tree: ast.AST, receiver: str) -> dict[str, list[int]]:
    """{attr: [lines]} for every `<receiver>.attr` in the tree, `receiver` given as source ('self.x')."""
    out: dict[str, list[int]] = {}
    last = receiver.rsplit(".", 1)[-1]
    for node in nodes(tree, ast.Attribute):
        v = node.value
        if (isinstance(v, ast.Attribute | ast.Name) and last_name(v) != last) or ast.unparse(v) != receiver:
            continue  # the cheap test first: most attributes are read on other receivers
        out.setdefault(node.attr, []).append(node.lineno)
    return out


def class_members(cls: ast.ClassDef) -> dict[str, int]:
    """Names a class body defines (methods, properties, class attributes) and instance attributes its
    methods assign on self; {name: line}."""
    out: dict[str, int] = {}
    for s in cls.body:
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.setdefault(s.name, s.lineno)
        elif isinstance(s, ast.Assign | ast.AnnAssign):
            for t in s.targets if isinstance(s, ast.Assign) else [s.target]:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, s.lineno)
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            out.setdefault(node.attr, node.lineno)
    return out


def find_string_assignment(tree: ast.Module, var: str) -> tuple[str, int] | None:
    """(value, line) of a module-level `var = '''...'''` (a code template)."""
    for node in nodes(tree, ast.Assign):
        if any(isinstance(t, ast.Name) and t.id == var for t in node.targets):
            v = node.value
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                return v.value, node.lineno
    return None


PLACEHOLDER_LINE = re.compile(r"^\s*\{(\w+)\}\s*$")
PLACEHOLDER = re.compile(r"(?<!\{)\{(\w+)\}(?!\})")


def template_code(template: str) -> tuple[str, list[str]]:
    """A str.format code template as parseable Python: whole-line `{X}` placeholders (pasted code) become
    `pass` and are returned, inline `{X}` become the identifier `X`, `{{`/`}}` become braces."""
    placeholders: list[str] = []
    lines = []
    for line in template.splitlines():
        m = PLACEHOLDER_LINE.match(line)
        if m:
            placeholders.append(m[1])
            lines.append(line[: len(line) - len(line.lstrip())] + "pass")
            continue
        line = PLACEHOLDER.sub(lambda mm: mm[1], line)
        lines.append(line.replace("{{", "{").replace("}}", "}"))
    return "\n".join(lines), placeholders


def parse_lenient(code: str) -> ast.Module:
    """Parse code; when a template's filled-in shape does not parse as a whole, parse it top-level
    statement by top-level statement and keep the ones that do (their bindings are what matters)."""
    try:
        return parse(code)
    except SyntaxError:
        pass
    body: list[ast.stmt] = []
    chunk: list[str] = []

    def flush() -> None:
        if chunk:
            with contextlib.suppress(SyntaxError):
                body.extend(parse("\n".join(chunk)).body)
            chunk.clear()

    for line in code.splitlines():
        starts = line[:1] not in ("", " ", "\t", ")", "]", "}", "#") and not line.startswith(("else", "elif", "except",
                                                                                           "finally"))
        if starts and not (chunk and chunk[-1].rstrip().endswith(("\\", ",", "(", "["))) and \
                not (chunk and chunk[-1].lstrip().startswith("@")):
            flush()
        chunk.append(line)
    flush()
    return ast.Module(body=body, type_ignores=[])


def reachable(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """Statements up to and including the first return/raise: code after it never runs."""
    out = []
    for s in stmts:
        out.append(s)
        if isinstance(s, ast.Return | ast.Raise):
            break
    return out


def getsource_targets(tree: ast.Module) -> dict[str, str]:
    """{var: name} for every `var = inspect.getsource(name)` (how a template's `{var}` gets `name` pasted)."""
    out = {}
    for node in nodes(tree, ast.Assign):
        if isinstance(node.value, ast.Call) and len(node.targets) == 1:
            call, t = node.value, node.targets[0]
            if isinstance(t, ast.Name) and ast.unparse(call.func) in ("inspect.getsource", "getsource") \
                    and call.args and isinstance(call.args[0], ast.Name):
                out[t.id] = call.args[0].id
    return out


def appended_sources(tree: ast.Module, container: str) -> list[tuple[str, int]]:
    """[(name, line)] for every `<container>.append(inspect.getsource(name))`."""
    out = []
    # module functions that take a function and paste its source (they call inspect.getsource inside)
    pasters = _pasters(tree)
    for node in _appends(tree, container):
        # the source may be transformed before it is appended: f(inspect.getsource(name)) or a paster(name)
        for sub in ast.walk(node.args[0]):
            if not (isinstance(sub, ast.Call) and sub.args and isinstance(sub.args[0], ast.Name)):
                continue
            if ast.unparse(sub.func) in ("inspect.getsource", "getsource") or ast.unparse(sub.func) in pasters:
                out.append((sub.args[0].id, node.lineno))
    return out


_PASTERS: dict[int, tuple[ast.Module, frozenset[str]]] = {}


def _pasters(tree: ast.Module) -> frozenset[str]:
    """Module functions whose source mentions getsource (the test ast.unparse(f) would answer: names,
    attributes, strings, parameters), found once per tree."""
    got = _PASTERS.get(id(tree))
    if got is None or got[0] is not tree:
        names = frozenset(f.name for f in tree.body if isinstance(f, ast.FunctionDef) and _mentions(f, "getsource"))
        if len(_PASTERS) > 4000:
            _PASTERS.clear()
        got = _PASTERS[id(tree)] = (tree, names)
    return got[1]


def _mentions(node: ast.AST, word: str) -> bool:
    for n in ast.walk(node):
        text = (n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute)
                else n.value if isinstance(n, ast.Constant) and isinstance(n.value, str)
                else n.name if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                else n.arg if isinstance(n, ast.arg | ast.keyword) else None)
        if text and word in text:
            return True
        if isinstance(n, ast.alias) and (word in n.name or (n.asname and word in n.asname)):
            return True
    return False


def _appends(tree: ast.Module, container: str) -> list[ast.Call]:
    want = container.replace("'", '"')
    return [node for node in nodes(tree, ast.Call) if isinstance(node.func, ast.Attribute)
            and node.func.attr == "append" and node.args
            and ast.unparse(node.func.value).replace("'", '"') == want]


def appended_code(tree: ast.Module, container: str) -> list[tuple[str, int]]:
    """[(code, line)] for every literal code string appended to `container` (pasted verbatim)."""
    out = []
    for node in _appends(tree, container):
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.append((arg.value, node.lineno))
    return out


def assignment_lines(tree: ast.Module, target: str) -> list[int]:
    """Lines where `target` (dotted, e.g. 'vllm.lora.worker_manager.X') is assigned anywhere in the tree."""
    last = target.rsplit(".", 1)[-1]
    return [node.lineno for node in nodes(tree, ast.Assign)
            if any(isinstance(t, ast.Attribute | ast.Name) and last_name(t) == last and ast.unparse(t) == target
                   for t in node.targets)]
