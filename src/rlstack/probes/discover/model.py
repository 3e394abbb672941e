"""The locked wheels' APIs, as discovery's passes ask about them: which package owns a module, whether a
module exists (as source or as a compiled extension), whether a module binds a name, where an attribute chain
or an assignment target lands in B, and what parameters a callee takes.

Built once per run over a SourceSet and shared by every pass (rlstack.probes.discover.sites walks A's uses;
the passes compare them with this), so each answer is computed once however many passes ask: vLLM alone
reads thousands of torch attributes.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Mapping
from dataclasses import dataclass

from rlstack.probes import pyast
from rlstack.probes.contract import Analyzer
from rlstack.probes.wheels import SourceSet
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack

# what a local name is bound to by an import: (module, attribute or None for the module itself)
Bound = tuple[str, str | None]
Scope = Mapping[str, Bound]

TRANSPARENT_DECORATORS = {"wraps", "functools.wraps", "lru_cache", "functools.lru_cache", "cache",
                          "functools.cache", "staticmethod", "classmethod", "no_grad", "torch.no_grad",
                          "torch.inference_mode", "inference_mode", "override", "typing.override",
                          "abstractmethod", "abc.abstractmethod", "deprecated"}


# Attributes every module object has, whatever its source binds (`m.__dict__`, `m.__file__`, `pkg.__path__`):
# the import machinery sets them, so reading one is never a missing name. `__version__` is not among them.
MODULE_DUNDERS = frozenset(dir(types.ModuleType) + dir(types.ModuleType("m"))) | {"__file__", "__path__", "__cached__",
                                                                               "__builtins__"}


@dataclass
class Params:
    """A callee's parameters, as far as a call's fit is concerned."""

    names: set[str]
    positional: int  # how many positional parameters (including self)
    var_pos: bool
    var_kw: bool
    text: str


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Params:
    a = fn.args
    pos = [x.arg for x in [*a.posonlyargs, *a.args]]
    return Params(names={*(x.arg for x in a.args), *(x.arg for x in a.kwonlyargs)}, positional=len(pos),
                  var_pos=a.vararg is not None, var_kw=a.kwarg is not None, text=signature_text(fn))


def signature_text(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return "(" + ast.unparse(fn.args)[:200] + ")"


class ApiModel:
    """The APIs of the locked wheels in `sources`, read from source (no import), with the lock's versions."""

    def __init__(self, stack: Stack, sources: SourceSet, locked: dict[str, LockedPackage]) -> None:
        self.stack, self.src, self.locked = stack, sources, locked
        self.an = Analyzer(sources)
        self._names: dict[tuple[str, str], str] = {}  # name_in_module's answers
        self._compiled: dict[str, frozenset[str]] = {}  # package -> its compiled extensions' module paths

    def version(self, package: str) -> str:
        return self.locked[package].version

    def owner(self, module: str) -> str | None:
        return self.src.package_of(module) if module else None

    def module_exists(self, module: str) -> tuple[str, str] | None:
        return self.src.module_file(module)

    def compiled(self, package: str, module: str) -> bool:
        """The module, or a package above it, is a compiled extension (torch._C._autograd lives in torch/_C.so)."""
        if not package:
            return False
        if package not in self._compiled:  # 'torch/_C' for torch/_C.cpython-311-x86_64-linux-gnu.so, once
            self._compiled[package] = frozenset(
                n[: n.rfind("/") + 1] + n[n.rfind("/") + 1:].split(".", 1)[0]
                for n in self.src.name_set(package) if n.endswith((".so", ".pyd")))
        mods = self._compiled[package]
        parts = module.split(".")
        return any("/".join(parts[:i]) in mods for i in range(len(parts), 0, -1))

    def name_in_module(self, module: str, name: str, depth: int = 0) -> str:
        """'yes', 'no', 'no-module', or a suppression rule id, for `from module import name` (memoized: vLLM
        alone reads thousands of torch attributes)."""
        key = (module, name)
        if depth == 0 and key in self._names:
            return self._names[key]
        got = self._name_in_module(module, name, depth)
        if depth == 0:
            self._names[key] = got
        return got

    def _name_in_module(self, module: str, name: str, depth: int) -> str:
        pkg = self.owner(module)
        if pkg is None or name in MODULE_DUNDERS:
            return "yes"
        loc = self.module_exists(module)
        if self.module_exists(f"{module}.{name}") or (pkg and self.compiled(pkg, f"{module}.{name}")):
            return "yes"
        if loc is None:
            return "compiled-module" if self.compiled(pkg, module) else "no-module"
        info = self.an.info(*loc)
        text = self.src.read(*loc) or ""
        if info is None:
            return "unresolved"
        if name in info.bindings:
            return "yes"
        if "__getattr__" in info.bindings:
            dyn = _getattr_names(info)
            if dyn is None:
                return "dynamic-module"
            if name in dyn:
                return "yes"
        elif "globals()" in text or "sys.modules[__name__]" in text:
            return "dynamic-module"
        for star in info.star_imports:
            if pyast.stdlib_names(star) is not None:
                if name in (pyast.stdlib_names(star) or set()):
                    return "yes"
                continue
            if self.owner(star) is None or self.module_exists(star) is None:
                return "star-from-compiled"
            if depth < 6:
                got = self.name_in_module(star, name, depth + 1)
                if got != "no":
                    return got
        return "no"

    def missing_root(self, module: str) -> str:
        """The first dotted prefix of a module that is not in its package (what ModuleNotFoundError names):
        `transformers.models.gemma4.configuration_gemma4` -> `transformers.models.gemma4`. One finding per
        missing module, however many names are imported from it or its submodules."""
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if self.module_exists(prefix) is None and not self.compiled(self.owner(prefix) or "", prefix):
                return prefix
        return module

    # -- where a name used in A lands in B ---------------------------------------------------------------------
    def module_chain(self, node: ast.Attribute, scope: Scope) -> tuple[str, list[str]] | None:
        """(the longest module prefix, the names after it) of an attribute chain whose root name is bound to a
        module (`import B.x`, `import B.x as m`, `from B import x` where x is a submodule); None otherwise."""
        e, chain = pyast.attribute_chain(node)
        if not isinstance(e, ast.Name) or e.id not in scope:
            return None
        module, attr = scope[e.id]
        root = module if attr is None else f"{module}.{attr}"
        if not root or self.owner(root) is None or self.module_exists(root) is None:
            return None  # not a module of the sources (a class or function imported by name, or a stdlib module)
        names = [*root.split("."), *chain]
        base = len(root.split("."))
        for i in range(len(names) - 1, base - 1, -1):
            if self.module_exists(".".join(names[:i])):
                return ".".join(names[:i]), names[i:]
        return None  # pragma: no cover - root itself is a module

    def target(self, t: ast.expr, scope: Scope) -> tuple[str, list[str]] | None:
        """(B module, attribute path inside it) for an assignment target or callee like
        vllm.lora.worker_manager.X or TokenizerGroup.meth (a class imported from B)."""
        e, chain = pyast.attribute_chain(t)
        if not isinstance(e, ast.Name) or e.id not in scope:
            return None
        module, attr = scope[e.id]
        names = ".".join([module, *chain] if attr is None else [module, attr, *chain]).split(".")
        for i in range(len(names) - 1, 0, -1):
            mod = ".".join(names[:i])
            if self.module_exists(mod):
                return mod, names[i:]
        return None

    # -- signatures ----------------------------------------------------------------------------------------
    def signature(self, pkg: str, file: str, node: ast.AST) -> tuple[Params | None, str | None, tuple[str, int]]:
        """(the parameters a call to this def or class takes, or None with the rule that says why they cannot be
        read, and where they are defined as (file, line))."""
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if _decorated(node):
                return None, "decorated-callee", (file, node.lineno)
            return params(node), None, (file, node.lineno)
        if isinstance(node, ast.ClassDef):
            init = self._init(pkg, file, node, 0)
            if init is None:
                return None, "constructor-outside", (file, node.lineno)
            ifile, inode = init
            if _decorated(inode):
                return None, "decorated-callee", (ifile, inode.lineno)
            p = params(inode)
            p.names.discard("self")
            return p, None, (ifile, inode.lineno)
        return None, None, (file, 0)

    def _init(self, pkg: str, file: str, cls: ast.ClassDef, depth: int
              ) -> tuple[str, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        """(file, def) of the __init__ a class's constructor runs: its own, or its first base's, when every
        step can be read from the sources."""
        if depth > 8 or cls.decorator_list or cls.keywords:
            return None  # dataclass-like generators, metaclasses
        for s in cls.body:
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == "__init__":
                return file, s
        for base in cls.bases:
            bname = ast.unparse(base).split(".")[-1]
            if bname in ("object",):
                continue
            bp, bf, bnode, status = self.an.lookup(pkg, file, bname)
            if status != "found" or not isinstance(bnode, ast.ClassDef):
                return None
            return self._init(bp, bf, bnode, depth + 1)
        return None


def _decorated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A decorator that may change the signature (any but the known transparent ones)."""
    return any(ast.unparse(d).split("(")[0] not in TRANSPARENT_DECORATORS for d in fn.decorator_list)


def _getattr_names(info: pyast.ModuleInfo) -> set[str] | None:
    """The names a module-level __getattr__ serves, when it says so plainly: it compares `name` with string
    constants (or looks them up in a module-level dict) and otherwise raises AttributeError. None when it may
    serve anything."""
    fn = next((b.node for b in info.bindings.get("__getattr__", []) if isinstance(b.node, ast.FunctionDef)), None)
    if fn is None or not fn.args.args:
        return None
    arg = fn.args.args[0].arg
    last = fn.body[-1] if fn.body else None
    if not (isinstance(last, ast.Raise) and last.exc is not None and "AttributeError" in ast.unparse(last.exc)):
        return None
    names: set[str] = set()
    for n in pyast.walk(fn):
        if isinstance(n, ast.Compare) and ast.unparse(n.left) == arg:
            for c in n.comparators:
                for k in pyast.walk(c):
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        names.add(k.value)
        if isinstance(n, ast.Compare) and any(ast.unparse(c) == arg for c in n.comparators) and \
                isinstance(n.left, ast.Name):
            for b in info.bindings.get(n.left.id, []):
                if isinstance(b.node, ast.Assign) and isinstance(b.node.value, ast.Dict):
                    names |= {k.value for k in b.node.value.keys if isinstance(k, ast.Constant)
                              and isinstance(k.value, str)}
                elif isinstance(b.node, ast.Assign):
                    return None
    return names
