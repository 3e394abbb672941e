"""Guards evaluated against the lock: whether an `if` around a statement holds in this stack.

A statement under `if TYPE_CHECKING:`, `if is_X_available():`, `if Version(X.__version__) >= Version("5"):`,
`if sys.version_info >= (3, 12):` or `if importlib.util.find_spec("X") is None:` runs or not depending on
what is locked, so discovery decides it from the lock (and the stack's Python) instead of reporting breaks on
paths that never run. A guard this cannot read is None: the statement is still checked, under the
guard-unknown rule.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from rlstack.core.pkgnames import normalize
from rlstack.probes import pyast
from rlstack.probes.discover.model import ApiModel

_FOUND, _MISSING = object(), object()  # importlib.util.find_spec's answer for a module that is / is not locked
_OPS: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
    ast.NotEq: operator.ne}


class Guards:
    """Evaluates if-tests and module-level flags against the lock, for the modules of one ApiModel."""

    def __init__(self, model: ApiModel) -> None:
        self.model = model
        self._consts: dict[tuple[str, str], dict[str, object]] = {}
        self._has: Callable[[ast.expr, str], bool | None] | None = None  # set for one guard() call

    def guard(self, test: ast.expr, versions: dict[str, object],
              has: Callable[[ast.expr, str], bool | None] | None = None) -> bool | None:
        """Evaluate an if-test against the lock; None when it is not a test this reads. `has` answers
        `hasattr(x, "name")` for the x the caller can resolve (a module of B, through the statement's imports)."""
        self._has = has
        try:
            val = self._eval(test, versions)
        finally:
            self._has = None
        return val if isinstance(val, bool) else None

    def operands(self, test: ast.expr, versions: dict[str, object],
                 has: Callable[[ast.expr, str], bool | None] | None = None) -> list[ast.expr]:
        """The parts of an if-test that are evaluated on this lock: an `and` stops at its first operand that is
        false here (`hasattr(m, "x") and m.x.y`: m.x is read only where m has x)."""
        if not isinstance(test, ast.BoolOp) or not isinstance(test.op, ast.And):
            return [test]
        out = []
        for v in test.values:
            out.append(v)
            if self.guard(v, versions, has) is False:
                break
        return out

    def _locked_version(self, package: str | None) -> _V | None:
        return _v(self.model.version(package)) if package in self.model.locked else None

    def _eval(self, e: ast.expr, versions: dict[str, object]) -> object:
        if _is_version_info(e):
            return _PyVersion(tuple(int(x) for x in self.model.stack.python.split(".")[:2]))
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Tuple):
            items = [self._eval(x, versions) for x in e.elts]
            return tuple(items) if all(isinstance(x, int) and not isinstance(x, bool) for x in items) else None
        if isinstance(e, ast.Name):
            return False if e.id == "TYPE_CHECKING" else versions.get(e.id)
        if isinstance(e, ast.Attribute):
            if e.attr == "TYPE_CHECKING":
                return False
            if ast.unparse(e) == "sys.platform":
                return _Str("linux")  # every stack is a Linux one ('x86_64-manylinux_2_28')
            if e.attr == "__version__" and isinstance(e.value, ast.Name):
                return self._locked_version(self.model.owner(e.value.id))
            return None
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            v = self._eval(e.operand, versions)
            return (not v) if isinstance(v, bool) else None
        if isinstance(e, ast.BoolOp):
            vals = [self._eval(x, versions) for x in e.values]
            if isinstance(e.op, ast.And):
                return False if any(v is False for v in vals) else True if all(v is True for v in vals) else None
            return True if any(v is True for v in vals) else False if all(v is False for v in vals) else None
        if isinstance(e, ast.Call):
            return self._call(e, versions)
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            return self._compare(e, versions)
        return None

    def _call(self, e: ast.Call, versions: dict[str, object]) -> object:
        """is_X_available(), Version(...)/parse(...), find_spec("X"), version("X")."""
        func = ast.unparse(e.func)
        last = func.split(".")[-1]
        locked = self.model.locked
        if func == "hasattr" and len(e.args) == 2 and isinstance(e.args[1], ast.Constant) and \
                isinstance(e.args[1].value, str):
            return self._has(e.args[0], e.args[1].value) if self._has is not None else None
        if func in ("platform.system", "platform.machine") and not e.args:
            return _Str("Linux" if last == "system" else "aarch64" if "aarch64" in self.model.stack.platform
                        else "x86_64")
        if isinstance(e.func, ast.Attribute) and e.func.attr == "startswith" and len(e.args) == 1 and \
                isinstance(e.args[0], ast.Constant) and isinstance(e.args[0].value, str):
            s = self._eval(e.func.value, versions)
            return s.v.startswith(e.args[0].value) if isinstance(s, _Str) else None
        m = re.fullmatch(r"is_(\w+?)_available", last)
        if m and not e.args:
            name = normalize(m[1])
            if name in locked or name.replace("-", "_") in {p.replace("-", "_") for p in locked}:
                return True
            return None if name in {"torch-cuda", "cuda", "gpu", "triton-available"} else False
        if last in ("Version", "parse", "parse_version", "LooseVersion") and e.args:
            v = self._eval(e.args[0], versions)
            return _v(v) if isinstance(v, str) else v if isinstance(v, _V) else None
        if last == "find_spec" and e.args and isinstance(e.args[0], ast.Constant) and \
                isinstance(e.args[0].value, str):
            top = e.args[0].value.split(".")[0]
            known = self.model.owner(top) is not None or normalize(top) in locked
            return _FOUND if known and "." not in e.args[0].value else None if known else _MISSING
        if "version" in last.lower() and len(e.args) == 1 and \
                isinstance(e.args[0], ast.Constant) and isinstance(e.args[0].value, str):
            return self._locked_version(normalize(e.args[0].value))
        return None

    def _compare(self, e: ast.Compare, versions: dict[str, object]) -> object:
        left, right = self._eval(e.left, versions), self._eval(e.comparators[0], versions)
        if isinstance(left, _Str) or isinstance(right, _Str):  # sys.platform == "darwin", platform.system() != ...
            lv, rv = (x.v if isinstance(x, _Str) else x for x in (left, right))
            if isinstance(lv, str) and isinstance(rv, str) and isinstance(e.ops[0], ast.Eq | ast.NotEq):
                return (lv == rv) == isinstance(e.ops[0], ast.Eq)
            return None
        if isinstance(left, _PyVersion) or isinstance(right, _PyVersion):
            return _compare_python(left, right, e.ops[0])
        if isinstance(e.ops[0], ast.Is | ast.IsNot) and left in (_FOUND, _MISSING) and \
                isinstance(e.comparators[0], ast.Constant) and e.comparators[0].value is None:
            return (left is _MISSING) == isinstance(e.ops[0], ast.Is)
        if isinstance(left, _V) or isinstance(right, _V):
            try:
                lv = left.v if isinstance(left, _V) else Version(str(left))
                rv = right.v if isinstance(right, _V) else Version(str(right))
            except InvalidVersion:
                return None
            return _apply(e.ops[0], lv, rv)
        return None

    def consts(self, package: str, file: str, depth: int = 0) -> dict[str, object]:
        """Module-level names whose value this can evaluate against the lock: versions (`x = version("vllm")`,
        `Version(vllm.__version__)`) and flags (`is_v5 = parse(transformers.__version__) >= parse("5")`),
        also when imported from another module of the sources (`from peft.import_utils import is_v5`)."""
        key = (package, file)
        if key in self._consts:
            return self._consts[key]
        out: dict[str, object] = {}
        self._consts[key] = out  # a module importing from one that imports from it sees what is known so far
        truncated = False
        tree = self.model.an.tree(package, file)
        for node in tree.body if tree else []:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                v = self._eval(node.value, out)
                if isinstance(v, _V | bool):
                    out[node.targets[0].id] = v
            elif isinstance(node, ast.ImportFrom):
                mod = pyast._resolve_relative(node.module, node.level, pyast.relative_base(file))
                pkg = self.model.owner(mod)
                for a in node.names:
                    if a.name == "__version__" and pkg in self.model.locked:
                        out[a.asname or a.name] = self._locked_version(pkg)
                    elif (loc := self.model.module_exists(mod)) and loc != key:
                        if depth >= 3:
                            truncated = True
                            continue
                        got = self.consts(loc[0], loc[1], depth + 1).get(a.name)
                        if got is not None:
                            out[a.asname or a.name] = got
        if truncated:  # read from deep in a chain, without following its imports: not this module's answer
            del self._consts[key]
        return out


@dataclass(frozen=True)
class _PyVersion:
    """sys.version_info of the stack's Python, as (major, minor): what a `sys.version_info >= (3, 10)` guard
    is decided by (the stack's python in stack.toml, not this machine's)."""

    v: tuple[int, ...]


def _is_version_info(e: ast.expr) -> bool:
    """`sys.version_info` or `sys.version_info[:2]` (also imported bare as version_info)."""
    if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Slice) and e.slice.lower is None and \
            isinstance(e.slice.upper, ast.Constant) and e.slice.upper.value in (2, 3):
        e = e.value
    return (isinstance(e, ast.Attribute) and e.attr == "version_info" and isinstance(e.value, ast.Name)
            and e.value.id == "sys") or (isinstance(e, ast.Name) and e.id == "version_info")


def _apply(op: ast.cmpop, left: object, right: object) -> bool | None:
    """An ordering or equality comparison; None for any other operator (`in`, `is`)."""
    fn = _OPS.get(type(op))
    return fn(left, right) if fn is not None else None


def _compare_python(left: object, right: object, op: ast.cmpop) -> bool | None:
    """A comparison of the stack's Python version with a tuple of ints; None for anything else (a patch
    level, a release level: the stack pins only major.minor)."""
    def as_tuple(x: object) -> tuple[int, ...] | None:
        if isinstance(x, _PyVersion):
            return x.v
        if isinstance(x, tuple) and x and all(isinstance(i, int) for i in x):
            return x
        return None

    lv, rv = as_tuple(left), as_tuple(right)
    if lv is None or rv is None or len(lv) > 2 or len(rv) > 2:
        return None
    return _apply(op, lv, rv)


@dataclass(frozen=True)
class _Str:
    """A string the stack's platform decides (sys.platform, platform.system()): an Apple-only or Windows-only
    branch is a dead path on a Linux stack, not a guard that cannot be read."""

    v: str


class _V:
    """A version read from the lock or from a constant, as a guard's operand."""

    def __init__(self, v: object) -> None:
        self.v = v if isinstance(v, Version) else Version(str(v))


def _v(text: str) -> _V | None:
    try:
        return _V(text)
    except InvalidVersion:
        return None
