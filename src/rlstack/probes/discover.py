"""Discovery: contracts between locked packages found in their sources, not listed by hand.

For each package A among the stack's top-level requirements, and every locked package B it reaches into,
read from the locked wheels (no import, no GPU):

1. replacements: A assigns (or setattr's) onto a module or class attribute of B. A class installed in place
   of B's class must provide what B's code uses on its instances (rlstack.probes.contract's replaced-class
   check, with the receivers found in B: `self.x = Name(...)` in the patched module and the classes that
   inherit from the one holding it); a function installed in place of B's function or method must accept
   the calls B makes to it (positional count and keywords).
2. imports: every name A imports from B (`from B.x import Y`, `import B.x`) and every attribute A reads on
   one of B's modules (`import B.x` then `B.x.Y`, `import B.x as m` then `m.Y`, `from B import x` then `x.Y`
   where x is a submodule: the first name after the longest module prefix, checked like `from B.x import Y`),
   on a path that runs in this stack, under guards evaluated against the lock (`TYPE_CHECKING` is false,
   `is_X_available()` is whether X is locked, version comparisons use the locked version). A guard that does
   not hold removes the path; one that cannot be evaluated, a try that catches the failure, or a function
   body (in-function-import) is a stated suppression, not a finding.
3. pastes: every function whose source A pastes (`container.append(inspect.getsource(f))`) into a code
   template must find its free names in what that template's module binds: the template's own code, the
   other sources pasted with it, and the module the container's key names (`RL_PRE_ITEMS["grpo_trainer"]`
   is exec'd beside trl.trainer.grpo_trainer's names).
4. keywords: every keyword A passes to B's functions and constructors must be a parameter of the callee
   (or the callee takes **kwargs).

A finding that a rule suppresses is counted with the rule's reason (RULES), never dropped silently.

Why not griffe (it loads a package's API from source with parameters, bases and aliases): discovery needs
the use sites (calls, attribute loads on receivers, assignments inside function bodies, the guards around
each), which griffe does not model; the provider side needs the lazy-module and star-import rules below
either way; and one `ast` parse per file, shared with the contract cases, serves both sides without
another dependency in every image.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from rlstack.core.pkgnames import normalize, requirement_name
from rlstack.probes import contract, pyast
from rlstack.probes.contract import Analyzer
from rlstack.probes.model import Evidence, ProbeResult
from rlstack.probes.remote import write_text
from rlstack.probes.wheels import SourceSet, WheelCache, cache_dir
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack

# Suppression rules: a possible finding that one of these covers is counted under it, with this reason.
RULES: dict[str, str] = {
    "caught": "the statement sits in try/except that catches the failure (ImportError, AttributeError, "
              "TypeError, Exception or bare): a missing name takes the fallback, nothing breaks",
    "guard-unknown": "the statement sits under a guard that cannot be evaluated from source (not a version, "
                     "availability or TYPE_CHECKING test)",
    "dynamic-module": "B's module defines module-level __getattr__ or writes globals(): its names exist only "
                      "at runtime (lazy modules such as transformers')",
    "star-from-compiled": "B's module star-imports from a compiled extension or another package's: the names "
                          "cannot be read from source",
    "compiled-module": "the module is a compiled extension in B's wheel: no source to read",
    "decorated-callee": "the callee is wrapped by a decorator that may change its signature",
    "constructor-outside": "the class's constructor comes from a base outside the sources (or a metaclass, "
                           "dataclass-like generator, pydantic, enum)",
    "not-code": "what is assigned is not a class or function of A (a constant, a lambda, an expression): "
                "there is no interface to compare",
    "unresolved": "the name cannot be traced to a class or function in the sources (built at runtime)",
    "in-function-import": "an import (or a read of a module attribute, `B.x.Y`) inside a function body runs only "
                          "when the function is called, and callers guard such deferred uses (a version check, a "
                          "feature flag) in ways a static read cannot follow; module-level ones are checked",
    "installed-by-a": "A itself assigns this name onto B's module elsewhere (a monkeypatch that adds it); whether "
                      "the assignment runs before the read depends on the order A runs them, which a static read "
                      "does not follow",
    "unreferenced-module": "no source of A imports or names this module (a script, a shipped cache of generated "
                           "code that A rewrites before importing): no import path reaches it",
}

TRANSPARENT_DECORATORS = {"wraps", "functools.wraps", "lru_cache", "functools.lru_cache", "cache",
                          "functools.cache", "staticmethod", "classmethod", "no_grad", "torch.no_grad",
                          "torch.inference_mode", "inference_mode", "override", "typing.override",
                          "abstractmethod", "abc.abstractmethod", "deprecated"}
CATCHES = {"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError", "Exception", "BaseException",
           "NameError", "RuntimeError", "ValueError", "KeyError"}


@dataclass
class Finding:
    kind: str  # replacement | import | paste | keyword
    a: str
    b: str
    message: str
    evidence: list[Evidence]
    rule: str | None = None  # a suppression rule id, or None for a real finding
    key: str = ""  # stable id part
    target: tuple[str, str] | None = None  # (B module, name) an import finding looks for


@dataclass
class Tally:
    checked: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)

    def suppressed(self) -> Counter[str]:
        return Counter(f.rule for f in self.findings if f.rule)


@dataclass
class Ctx:
    """Where a statement sits: whether its path runs in this stack, what catches its failure, the function."""

    live: bool | None = True  # True: runs; None: under a guard that cannot be evaluated; False: never
    caught: bool = False
    func: str | None = None
    local: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # name -> (module, attr) imports
    shadow: frozenset[str] = frozenset()  # names the function binds itself (parameters, assignments)


class Discovery:
    def __init__(self, stack: Stack, sources: SourceSet, locked: dict[str, LockedPackage], a_set: list[str]) -> None:
        self.stack, self.src, self.locked, self.a_set = stack, sources, locked, a_set
        self.an = Analyzer(sources)
        self.tally = Tally()
        self._refs: dict[str, set[str]] = {}
        self._consts: dict[tuple[str, str], dict[str, object]] = {}
        # A -> {(B module, name): (file, line)} that A assigns onto B's modules itself
        self._installs: dict[str, dict[tuple[str, str], tuple[str, int]]] = {}
        self._names: dict[tuple[str, str], str] = {}  # name_in_module's answers
        self._compiled: dict[str, frozenset[str]] = {}  # package -> its compiled extensions' module paths
        self._collecting = False

    # -- helpers -----------------------------------------------------------------------------------------
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
        """'yes', 'no', or a suppression rule id, for `from module import name` (memoized: vLLM alone reads
        thousands of torch attributes)."""
        key = (module, name)
        if depth == 0 and key in self._names:
            return self._names[key]
        got = self._name_in_module(module, name, depth)
        if depth == 0:
            self._names[key] = got
        return got

    def _name_in_module(self, module: str, name: str, depth: int) -> str:
        pkg = self.owner(module)
        if pkg is None:
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

    def guard(self, test: ast.expr, versions: dict[str, object]) -> bool | None:
        """Evaluate an if-test against the lock; None when it is not a test this reads."""
        val = self._eval(test, versions)
        return val if isinstance(val, bool) else None

    def _eval(self, e: ast.expr, versions: dict[str, object]) -> object:
        if _is_version_info(e):
            return _PyVersion(tuple(int(x) for x in self.stack.python.split(".")[:2]))
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Tuple):
            items = [self._eval(x, versions) for x in e.elts]
            return tuple(items) if all(isinstance(x, int) and not isinstance(x, bool) for x in items) else None
        if isinstance(e, ast.Name):
            if e.id == "TYPE_CHECKING":
                return False
            return versions.get(e.id)
        if isinstance(e, ast.Attribute):
            if e.attr == "TYPE_CHECKING":
                return False
            if e.attr == "__version__" and isinstance(e.value, ast.Name):
                pkg = self.owner(e.value.id)
                return _v(self.locked[pkg].version) if pkg in self.locked else None
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
            fn = ast.unparse(e.func)
            last = fn.split(".")[-1]
            m = re.fullmatch(r"is_(\w+?)_available", last)
            if m and not e.args:
                name = normalize(m[1])
                if name in self.locked or name.replace("-", "_") in {p.replace("-", "_") for p in self.locked}:
                    return True
                return None if name in {"torch-cuda", "cuda", "gpu", "triton-available"} else False
            if last in ("Version", "parse", "parse_version", "LooseVersion") and e.args:
                v = self._eval(e.args[0], versions)
                return _v(v) if isinstance(v, str) else v if isinstance(v, _V) else None
            if last == "find_spec" and e.args and isinstance(e.args[0], ast.Constant) and \
                    isinstance(e.args[0].value, str):
                top = e.args[0].value.split(".")[0]
                known = self.owner(top) is not None or normalize(top) in self.locked
                return _FOUND if known and "." not in e.args[0].value else None if known else _MISSING
            if "version" in last.lower() and len(e.args) == 1 and \
                    isinstance(e.args[0], ast.Constant) and isinstance(e.args[0].value, str):
                pkg = normalize(e.args[0].value)
                return _v(self.locked[pkg].version) if pkg in self.locked else None
            return None
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            left, right = self._eval(e.left, versions), self._eval(e.comparators[0], versions)
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
                op = e.ops[0]
                return {ast.Lt: lv < rv, ast.LtE: lv <= rv, ast.Gt: lv > rv, ast.GtE: lv >= rv, ast.Eq: lv == rv,
                        ast.NotEq: lv != rv}.get(type(op))
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
        tree = self.an.tree(package, file)
        for node in tree.body if tree else []:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                v = self._eval(node.value, out)
                if isinstance(v, _V | bool):
                    out[node.targets[0].id] = v
            elif isinstance(node, ast.ImportFrom):
                mod = pyast._resolve_relative(node.module, node.level, pyast.relative_base(file))
                pkg = self.owner(mod)
                for a in node.names:
                    if a.name == "__version__" and pkg in self.locked:
                        out[a.asname or a.name] = _v(self.locked[pkg].version)
                    elif (loc := self.module_exists(mod)) and loc != key:
                        if depth >= 3:
                            truncated = True
                            continue
                        got = self.consts(loc[0], loc[1], depth + 1).get(a.name)
                        if got is not None:
                            out[a.asname or a.name] = got
        if truncated:  # read from deep in a chain, without following its imports: not this module's answer
            del self._consts[key]
        return out

    def add(self, kind: str, a: str, b: str, message: str, ev: list[Evidence], rule: str | None, key: str,
            target: tuple[str, str] | None = None) -> None:
        self.tally.findings.append(Finding(kind, a, b, message, ev, rule, key, target))

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

    # -- the walk over A's modules -------------------------------------------------------------------------
    def walk(self, a: str) -> None:
        """Two passes over A's modules: which of them some live path imports, then the checks."""
        files = sorted(n for n in self.src.names(a) if n.endswith(".py") and "/tests/" not in f"/{n}")
        for collecting in (True, False):
            self._collecting = collecting
            for f in files:
                tree = self.an.tree(a, f)
                if tree is None:
                    continue
                if collecting:
                    self._collect_strings(a, tree)
                self._stmts(a, f, tree.body, Ctx(), self.consts(a, f), _module_imports(tree, pyast.relative_base(f)))
        self._collecting = False

    def _stmts(self, a: str, f: str, stmts: list[ast.stmt], ctx: Ctx, versions: dict[str, object],
               imports: dict[str, tuple[str, str | None]]) -> None:
        for s in stmts:
            if ctx.live is False:
                return
            if isinstance(s, ast.If):
                self._chains(a, f, [s.test], ctx, self._scope(imports, ctx))
                g = self.guard(s.test, versions)
                live_body = ctx.live if g is True else False if g is False else None if ctx.live else ctx.live
                live_else = ctx.live if g is False else False if g is True else None if ctx.live else ctx.live
                self._stmts(a, f, s.body, _with(ctx, live=live_body), versions, imports)
                self._stmts(a, f, s.orelse, _with(ctx, live=live_else), versions, imports)
                # an early exit (`if not permitted: return`, `if version < X: raise`): the rest of the block runs
                # only on the path that did not exit, so it is under this guard's negation
                body_exits, else_exits = _exits(s.body), _exits(s.orelse)
                if (body_exits and else_exits) or (body_exits and g is True) or (else_exits and g is False):
                    return
                if (body_exits or else_exits) and g is None and ctx.live:
                    ctx = _with(ctx, live=None)
                continue
            if isinstance(s, ast.Try | ast.TryStar):
                caught = ctx.caught or any(_catches(h) for h in s.handlers)
                self._stmts(a, f, s.body, _with(ctx, caught=caught), versions, imports)
                self._stmts(a, f, s.orelse, _with(ctx, caught=caught), versions, imports)
                self._stmts(a, f, s.finalbody, ctx, versions, imports)
                continue  # except-branches are fallbacks: they run only when the body failed
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
                # decorators and defaults run where the def is, in the enclosing path
                self._chains(a, f, [*s.decorator_list, *s.args.defaults, *(d for d in s.args.kw_defaults if d)],
                             ctx, self._scope(imports, ctx))
                local = dict(ctx.local)
                imports_in, names_in = _function_scope(s, pyast.relative_base(f))
                local.update(imports_in)
                shadow = (ctx.shadow | names_in) - set(local)
                self._stmts(a, f, s.body, Ctx(ctx.live, ctx.caught, s.name, local, shadow), versions, imports)
                continue
            if isinstance(s, ast.ClassDef):
                self._chains(a, f, [*s.decorator_list, *s.bases, *(k.value for k in s.keywords)], ctx,
                             self._scope(imports, ctx))
                self._stmts(a, f, s.body, ctx, versions, imports)
                continue
            if isinstance(s, ast.With | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While):
                heads = [i.context_expr for i in s.items] if isinstance(s, ast.With | ast.AsyncWith) else \
                    [s.test] if isinstance(s, ast.While) else [s.iter]
                self._chains(a, f, heads, ctx, self._scope(imports, ctx))
                self._stmts(a, f, s.body, ctx, versions, imports)
                self._stmts(a, f, getattr(s, "orelse", []), ctx, versions, imports)
                continue
            self._statement(a, f, s, ctx, self._scope(imports, ctx))

    @staticmethod
    def _scope(imports: dict[str, tuple[str, str | None]], ctx: Ctx) -> dict[str, tuple[str, str | None]]:
        """The imports a statement sees: the module's and the function's own, less the names the function
        rebinds (a parameter called `model` is not the module imported as `model`)."""
        scope = {**imports, **ctx.local}
        return {k: v for k, v in scope.items() if k not in ctx.shadow or k in ctx.local} if ctx.shadow else scope

    def _rule(self, ctx: Ctx) -> str | None:
        return "caught" if ctx.caught else "guard-unknown" if ctx.live is None else None

    def _import_rule(self, a: str, f: str, ctx: Ctx) -> str | None:
        if ctx.func:
            return "in-function-import"
        return None if self._referenced(a, f) else "unreferenced-module"

    def _referenced(self, a: str, f: str) -> bool:
        """Whether a source of A imports this module on a path that runs (not under a guard that is false in
        this stack) or names it in a string (a registry, importlib): collected by walk()'s first pass."""
        mod = contract._dotted(f)
        refs = self._refs.get(a, set())
        return "." not in mod or mod in refs or mod.rsplit(".", 1)[1] in refs or any(
            r.startswith(mod + ".") for r in refs)

    def _collect_strings(self, a: str, tree: ast.Module) -> None:
        refs = self._refs.setdefault(a, set())
        for node in pyast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200 \
                    and re.fullmatch(r"[A-Za-z_][\w.]*", node.value):
                refs.add(node.value)

    def _statement(self, a: str, f: str, s: ast.stmt, ctx: Ctx, scope: dict[str, tuple[str, str | None]]) -> None:
        where = f" in {ctx.func}()" if ctx.func else f" when {contract._dotted(f)} is imported"
        if self._collecting:
            if isinstance(s, ast.ImportFrom | ast.Import):
                refs = self._refs.setdefault(a, set())
                for module, attr in _import_bindings(s, pyast.relative_base(f)).values():
                    refs.add(module)
                    if attr:
                        refs.add(f"{module}.{attr}")
                if isinstance(s, ast.Import):
                    refs |= {x.name for x in s.names}
            else:
                self._collect_installs(a, f, s, scope)
            return
        if isinstance(s, ast.ImportFrom | ast.Import):
            for local, (module, attr) in _import_bindings(s, pyast.relative_base(f)).items():
                b = self.owner(module)
                if b is None or b == a or b not in self.src.wheels:
                    continue
                self.tally.checked["import"] += 1
                ev = [Evidence(text=ast.unparse(s)[:200], package=a, file=f, line=s.lineno)]
                if attr is None:
                    full = module if isinstance(s, ast.ImportFrom) else next(
                        x.name for x in s.names if (x.asname or x.name.split(".")[0]) == local)
                    if self.module_exists(full) or self.compiled(b, full):
                        continue
                    root = self.missing_root(full)
                    self.add("import", a, b, f"ModuleNotFoundError: No module named '{root}' ({a} imports {full}"
                             f"{where}; {b} {self.locked[b].version} does not have it)",
                             ev, self._rule(ctx) or self._import_rule(a, f, ctx), root)
                    continue
                got = self.name_in_module(module, attr)
                if got == "yes":
                    continue
                rule = self._rule(ctx) or (got if got in RULES else None) or self._import_rule(a, f, ctx)
                if got == "no-module" and self.compiled(b, module):
                    rule = "compiled-module"
                if rule is None and self._installed_by_a(a, module, attr):
                    rule = "installed-by-a"
                if got == "no-module":
                    root = self.missing_root(module)
                    self.add("import", a, b, f"ModuleNotFoundError: No module named '{root}' ({a} imports {module}"
                             f"{where}; {b} {self.locked[b].version} does not have it)", ev, rule, root)
                    continue
                msg = (f"ImportError: cannot import name '{attr}' from '{module}' ({a} imports it{where}; "
                       f"{b} {self.locked[b].version} does not define it)")
                self.add("import", a, b, msg, ev, rule, f"{module}.{attr}", (module, attr))
            return
        self._chains(a, f, [s], ctx, scope)
        for node in pyast.walk(s):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute):
                        self._replacement(a, f, node, t, ctx, scope)
            elif isinstance(node, ast.Call):
                fn = ast.unparse(node.func)
                if fn == "setattr" and len(node.args) == 3 and isinstance(node.args[1], ast.Constant):
                    target = ast.Attribute(value=node.args[0], attr=str(node.args[1].value), ctx=ast.Store())
                    fake = ast.Assign(targets=[target], value=node.args[2], lineno=node.lineno)
                    self._replacement(a, f, fake, target, ctx, scope)
                elif node.keywords:
                    self._keywords(a, f, node, ctx, scope)

    def _collect_installs(self, a: str, f: str, s: ast.stmt, scope: dict[str, tuple[str, str | None]]) -> None:
        """First pass: every `B.mod.NAME = ...` and `setattr(B.mod, "NAME", ...)` in A, as (module, NAME), with
        where it is."""
        got = self._installs.setdefault(a, {})
        for node in pyast.walk(s):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for t in node.targets if isinstance(t, ast.Attribute)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and \
                    len(node.args) == 3 and isinstance(node.args[1], ast.Constant) and \
                    isinstance(node.args[1].value, str):
                targets = [ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Store())]
            for t in targets:
                assert isinstance(t, ast.Attribute)
                hit = self._module_chain(t, scope)
                if hit is not None and len(hit[1]) == 1:
                    got.setdefault((hit[0], hit[1][0]), (f, getattr(node, "lineno", 0)))

    def _installed_by_a(self, a: str, module: str, name: str) -> bool:
        return (module, name) in self._installs.get(a, {})

    def installed_elsewhere(self, a: str, target: tuple[str, str]) -> list[tuple[str, str, int]]:
        """(package, file, line) where another of the A packages assigns this name onto B's module: a name B
        lacks but a monkeypatch adds, so A's import works only when that package ran first."""
        return [(a2, *sites[target]) for a2, sites in sorted(self._installs.items()) if a2 != a and target in sites]

    # -- attribute chains on B's modules (`import B.x` then `B.x.Y`, `import B.x as m` then `m.Y`) -----------
    def _module_chain(self, node: ast.Attribute, scope: dict[str, tuple[str, str | None]]
                      ) -> tuple[str, list[str]] | None:
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

    def _chains(self, a: str, f: str, nodes: Sequence[ast.AST], ctx: Ctx,
                scope: dict[str, tuple[str, str | None]]) -> None:
        """Every attribute read on one of B's modules in these nodes (not inside nested defs, which _stmts
        walks with their own context) is checked like `from <module> import <name>`: the first name after the
        longest module prefix must be bound there (a submodule, a module-level name, a plain __getattr__ name).
        A store (`B.x.Y = v`) does not need Y; its receiver `B.x` is read and checked."""
        if self._collecting or ctx.live is False or not scope:
            return
        done: set[tuple[str, str]] = set()
        inner: set[int] = set()
        for top in nodes:
            for node in _walk_no_defs(top):
                if not isinstance(node, ast.Attribute):
                    continue
                if isinstance(node.ctx, ast.Load):
                    inner.add(id(node.value))  # only the longest chain is checked: it decides the same name
                if id(node) in inner or not isinstance(node.ctx, ast.Load):
                    continue
                hit = self._module_chain(node, scope)
                if hit is None:
                    continue
                module, rest = hit
                b = self.owner(module)
                if b is None or b == a or b not in self.src.wheels or (module, rest[0]) in done:
                    continue
                done.add((module, rest[0]))
                self._chain_name(a, f, node, module, rest[0], b, ctx)

    def _chain_name(self, a: str, f: str, node: ast.Attribute, module: str, name: str, b: str, ctx: Ctx) -> None:
        self.tally.checked["import"] += 1
        got = self.name_in_module(module, name)
        if got == "yes":
            return
        where = f" in {ctx.func}()" if ctx.func else f" when {contract._dotted(f)} is imported"
        rule = self._rule(ctx) or (got if got in RULES else None) or self._import_rule(a, f, ctx)
        if rule is None and self._installed_by_a(a, module, name):
            rule = "installed-by-a"
        ev = [Evidence(text=ast.unparse(node)[:200], package=a, file=f, line=node.lineno)]
        msg = (f"AttributeError: module '{module}' has no attribute '{name}' ({a} reads {ast.unparse(node)[:120]}"
               f"{where}; {b} {self.locked[b].version} does not define it)")
        self.add("import", a, b, msg, ev, rule, f"{module}.{name}", (module, name))

    # -- replacements --------------------------------------------------------------------------------------
    def _target(self, t: ast.expr, scope: dict[str, tuple[str, str | None]]) -> tuple[str, list[str]] | None:
        """(B module, attribute path inside it) for an assignment target like vllm.lora.worker_manager.X or
        TokenizerGroup.meth (a class imported from B)."""
        e, chain = pyast.attribute_chain(t)
        if not isinstance(e, ast.Name) or e.id not in scope:
            return None
        module, attr = scope[e.id]
        parts = [*([module] if attr is None else [module, attr]), *chain]
        dotted = ".".join(parts) if attr is None else ".".join([module, attr, *chain])
        names = dotted.split(".")
        for i in range(len(names) - 1, 0, -1):
            mod = ".".join(names[:i])
            if self.module_exists(mod):
                return mod, names[i:]
        return None

    def _value(self, a: str, f: str, value: ast.expr, scope: dict[str, tuple[str, str | None]]
               ) -> tuple[str, str, ast.AST] | None:
        """The class or function of A an assigned value names (module-level or imported inside the function)."""
        if not isinstance(value, ast.Name):
            return None
        name = value.id
        if name in scope:
            module, attr = scope[name]
            loc = self.module_exists(module)
            if loc and attr:
                pkg, file, node, status = self.an.lookup(loc[0], loc[1], attr)
                return (pkg, file, node) if status == "found" and node is not None else None
            return None
        pkg, file, node, status = self.an.lookup(a, f, name)
        if status == "found" and node is not None:
            return pkg, file, node
        tree = self.an.tree(a, f)
        for n in pyast.walk(tree) if tree else []:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == name:
                return a, f, n
        return None

    def _replacement(self, a: str, f: str, node: ast.Assign, t: ast.Attribute, ctx: Ctx,
                     scope: dict[str, tuple[str, str | None]]) -> None:
        hit = self._target(t, scope)
        if hit is None:
            return
        module, path = hit
        b = self.owner(module)
        if b is None or b == a or b not in self.src.wheels:
            return
        self.tally.checked["replacement"] += 1
        target = ".".join([module, *path])
        ev = [Evidence(text=f"{a} assigns {target} = {ast.unparse(node.value)[:80]}", package=a, file=f,
                       line=node.lineno)]
        value = self._value(a, f, node.value, scope)
        if value is None or not isinstance(value[2], ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if not isinstance(node.value, ast.Name | ast.Attribute):
                return  # a constant or an expression: counted, nothing to compare
            self.add("replacement", a, b, f"{target} replaced by {ast.unparse(node.value)[:60]}", ev, "unresolved",
                     target)
            return
        vpkg, vfile, vnode = value
        loc = self.module_exists(module)
        assert loc is not None
        if isinstance(vnode, ast.ClassDef) and len(path) == 1:
            self._replaced_class(a, b, f, node, ctx, module, path[0], vpkg, vfile, vnode, loc, ev)
        elif isinstance(vnode, ast.FunctionDef | ast.AsyncFunctionDef):
            self._replaced_function(a, b, module, path, vnode, vpkg, vfile, loc, ctx, ev)

    def _replaced_class(self, a: str, b: str, f: str, node: ast.Assign, ctx: Ctx, module: str, name: str,
                        vpkg: str, vfile: str, vnode: ast.ClassDef, loc: tuple[str, str], ev: list[Evidence]) -> None:
        opkg, ofile, onode, status = self.an.lookup(loc[0], loc[1], name)
        if status != "found" or not isinstance(onode, ast.ClassDef):
            return
        receivers = self._receivers(loc, name)
        if not receivers:
            return
        case = contract.Case(
            id=f"discovered-{name}", kind="replaced_class", wall=None, summary="discovered", requires=[a, b],
            fix=None, replacement=contract.ClassRef(package=vpkg, file=vfile, **{"class": vnode.name}),
            original=contract.ClassRef(package=opkg, file=ofile, **{"class": onode.name}),
            installed_at=[contract.InstallSite(package=a, file=f, target=f"{module}.{name}")],
            used_by=[contract.UseSite(package=b, files=files, receiver=r) for r, files in receivers.items()])
        res = contract.check_replaced_class(case, self.an)
        if res.status == "fail":  # a try around the assignment does not catch what breaks later, in B
            self.add("replacement", a, b, res.reason, res.evidence,
                     "guard-unknown" if ctx.live is None else None, f"{module}.{name}")

    def _receivers(self, loc: tuple[str, str], name: str) -> dict[str, list[str]]:
        """{receiver source: files} where B keeps an instance of `name`: `self.x = name(...)` in the patched
        module, used there and in B's classes that inherit from the class holding it."""
        tree = self.an.tree(*loc)
        out: dict[str, list[str]] = {}
        for cls in pyast.nodes(tree, ast.ClassDef) if tree else []:
            for n in pyast.walk(cls):
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and \
                        ast.unparse(n.value.func).split(".")[-1] == name:
                    for t in n.targets:
                        if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self":
                            out[f"self.{t.attr}"] = [loc[1], *self._subclass_files(loc[0], cls.name)]
        return out

    def _subclass_files(self, package: str, cls: str) -> list[str]:
        """Files of a package that define a class with `cls` among its bases (text search, then ast)."""
        out = []
        rx = re.compile(rf"class \w+\([^)]*\b{re.escape(cls)}\b")
        for n in sorted(self.src.name_set(package)):
            if n.endswith(".py"):
                text = self.src.read(package, n) or ""
                if cls in text and rx.search(text):
                    out.append(n)
        return out

    def _replaced_function(self, a: str, b: str, module: str, path: list[str], vnode: ast.FunctionDef |
                           ast.AsyncFunctionDef, vpkg: str, vfile: str, loc: tuple[str, str], ctx: Ctx,
                           ev: list[Evidence]) -> None:
        tree = self.an.tree(*loc)
        if tree is None:
            return
        method = len(path) == 2
        calls: list[ast.Call] = []
        if method:
            cls = next((n for n in pyast.nodes(tree, ast.ClassDef) if n.name == path[0]), None)
            for n in pyast.walk(cls) if cls else []:
                if isinstance(n, ast.Call) and ast.unparse(n.func) == f"self.{path[1]}":
                    calls.append(n)
        elif len(path) == 1:
            calls = [n for n in pyast.nodes(tree, ast.Call) if isinstance(n.func, ast.Name)
                     and n.func.id == path[0]]
        params = _params(vnode)
        for call in calls:
            bad = _incompatible(params, call, skip_self=method)
            if bad:
                self.add("replacement", a, b,
                         f"TypeError: {vnode.name}() {bad} ({b} calls {'.'.join(path)} at {loc[1]}:{call.lineno}; "
                         f"{a} installs {vnode.name} from {vfile}:{vnode.lineno} in its place)",
                         [*ev, Evidence(text=ast.unparse(call)[:160], package=b, file=loc[1], line=call.lineno),
                          Evidence(text=f"def {vnode.name}{_sig(vnode)}", package=vpkg, file=vfile,
                                   line=vnode.lineno)], self._rule(ctx), f"{module}.{'.'.join(path)}")
                return

    # -- keywords ----------------------------------------------------------------------------------------
    def _keywords(self, a: str, f: str, call: ast.Call, ctx: Ctx, scope: dict[str, tuple[str, str | None]]) -> None:
        kws = [k.arg for k in call.keywords if k.arg]
        if not kws:
            return
        callee = self._callee(call.func, scope)
        if callee is None:
            return
        b, module, name = callee
        if b == a or b not in self.src.wheels:
            return
        loc = self.module_exists(module)
        if loc is None:
            return
        pkg, file, node, status = self.an.lookup(loc[0], loc[1], name)
        if status != "found" or node is None:
            return
        self.tally.checked["keyword"] += 1
        ev = [Evidence(text=ast.unparse(call)[:200], package=a, file=f, line=call.lineno)]
        params, rule, home = self._signature(pkg, file, node)
        if params is None:
            if rule:
                self.add("keyword", a, b, f"{module}.{name}(...) keywords not checked", ev, rule,
                         f"{module}.{name}")
            return
        missing = [k for k in kws if k not in params.names and not params.var_kw]
        if missing:
            ev.append(Evidence(text=f"{name}{params.text}", package=pkg, file=home[0], line=home[1]))
            self.add("keyword", a, b,
                     f"TypeError: {name}() got an unexpected keyword argument '{missing[0]}' ({a} passes "
                     f"{', '.join(missing)}; {b} {self.locked[b].version} does not take it)", ev, self._rule(ctx),
                     f"{module}.{name}({','.join(missing)})")

    def _callee(self, func: ast.expr, scope: dict[str, tuple[str, str | None]]) -> tuple[str, str, str] | None:
        if isinstance(func, ast.Name) and func.id in scope:
            module, attr = scope[func.id]
            b = self.owner(module)
            return (b, module, attr) if b and attr else None
        if isinstance(func, ast.Attribute):
            hit = self._target(func, scope)
            if hit and len(hit[1]) == 1:
                b = self.owner(hit[0])
                return (b, hit[0], hit[1][0]) if b else None
        return None

    def _signature(self, pkg: str, file: str, node: ast.AST) -> tuple[_Params | None, str | None, tuple[str, int]]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any(ast.unparse(d).split("(")[0] not in TRANSPARENT_DECORATORS for d in node.decorator_list):
                return None, "decorated-callee", (file, node.lineno)
            return _params(node), None, (file, node.lineno)
        if isinstance(node, ast.ClassDef):
            init = self._init(pkg, file, node, 0)
            if init is None:
                return None, "constructor-outside", (file, node.lineno)
            _, ifile, inode = init
            if any(ast.unparse(d).split("(")[0] not in TRANSPARENT_DECORATORS for d in inode.decorator_list):
                return None, "decorated-callee", (ifile, inode.lineno)
            p = _params(inode)
            p.names.discard("self")
            return p, None, (ifile, inode.lineno)
        return None, None, (file, 0)

    def _init(self, pkg: str, file: str, cls: ast.ClassDef, depth: int
              ) -> tuple[str, str, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        if depth > 8 or cls.decorator_list or cls.keywords:
            return None  # dataclass-like generators, metaclasses
        for s in cls.body:
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == "__init__":
                return pkg, file, s
        for base in cls.bases:
            bname = ast.unparse(base).split(".")[-1]
            if bname in ("object",):
                continue
            bp, bf, bnode, status = self.an.lookup(pkg, file, bname)
            if status != "found" or not isinstance(bnode, ast.ClassDef):
                return None
            got = self._init(bp, bf, bnode, depth + 1)
            if got is not None:
                return got
            return None
        return None

    # -- pastes --------------------------------------------------------------------------------------------
    def pastes(self, a: str) -> None:
        """Every container A appends getsource() output to, the template that consumes it, and a check per
        pasted function (rlstack.probes.contract's pasted-function check on a discovered case)."""
        files = sorted(n for n in self.src.names(a) if n.endswith(".py"))
        containers: dict[str, str] = {}  # container expression -> file
        for f in files:
            text = self.src.read(a, f) or ""
            if "getsource" not in text or ".append(" not in text:
                continue
            tree = self.an.tree(a, f)
            for node in pyast.walk(tree) if tree else []:
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr == "append" and isinstance(node.func.value, ast.Subscript) and node.args:
                    cont = ast.unparse(node.func.value).replace("'", '"')
                    if pyast.appended_sources(tree, cont):  # type: ignore[arg-type]
                        containers.setdefault(cont, f)
        for cont, f in sorted(containers.items()):
            m = re.fullmatch(r'(\w+)\["(\w+)"\]', cont)
            if not m:
                continue
            base, key = m[1], m[2]
            template = self._template_for(a, files, base)
            if template is None:
                continue
            tfile, tname = template
            parts = [contract.NamespacePart(package=a, file=tfile, template=tname, appended=None),
                     contract.NamespacePart(package=a, file=f, template=None, appended=cont)]
            keymod = self._key_module(key)
            if keymod:
                parts.append(contract.NamespacePart(package=keymod[0], file=keymod[1], template=None, appended=None))
            tree = self.an.tree(a, f)
            for name, _line in pyast.appended_sources(tree, cont) if tree else []:
                home = self._def_home(a, f, name)
                if home is None:
                    continue
                hpkg, hfile, fname = home
                self.tally.checked["paste"] += 1
                case = contract.Case(
                    id=f"discovered-paste-{fname}", kind="pasted_function", wall=None, summary="discovered",
                    requires=[a, hpkg], fix=None,
                    function=contract.FunctionRef(package=hpkg, file=hfile, name=fname),
                    pasted_at=contract.PasteSite(package=a, file=f, container=cont), namespace=parts)
                res = contract.check_pasted_function(case, self.an)
                if res.status == "fail":
                    self.add("paste", a, hpkg, res.reason, res.evidence, None, f"{cont}:{fname}")
                elif res.status == "skip" and "cannot decide" in res.reason:
                    self.add("paste", a, hpkg, res.reason, res.evidence, "star-from-compiled", f"{cont}:{fname}")

    def _template_for(self, a: str, files: list[str], base: str) -> tuple[str, str] | None:
        """(file, template name) of the code template whose .format(...) receives the joined container."""
        for f in files:
            text = self.src.read(a, f) or ""
            if ".format(" not in text or base not in text:
                continue
            tree = self.an.tree(a, f)
            for fn in pyast.nodes(tree, ast.FunctionDef) if tree else []:
                joined = {t.id for n in pyast.walk(fn) if isinstance(n, ast.Assign) and base in ast.unparse(n.value)
                          and ".join(" in ast.unparse(n.value) for t in n.targets if isinstance(t, ast.Name)}
                for n in pyast.walk(fn):
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "format" \
                            and isinstance(n.func.value, ast.Name) and any(
                                isinstance(k.value, ast.Name) and k.value.id in joined for k in n.keywords):
                        tname = n.func.value.id
                        for tf in [f, *files]:
                            tt = self.an.tree(a, tf)
                            if tt is not None and pyast.find_string_assignment(tt, tname):
                                return tf, tname
        return None

    def _key_module(self, key: str) -> tuple[str, str] | None:
        """A locked module named like the container's key (its names are exec'd beside the pasted code)."""
        for pkg in sorted(self.src.wheels):
            for n in self.src.name_set(pkg):
                if n.endswith(f"/{key}.py") and n.count("/") <= 3:
                    return pkg, n
        return None

    def _def_home(self, a: str, f: str, name: str) -> tuple[str, str, str] | None:
        """Where the def whose source `inspect.getsource(name)` returns lives: (package, file, def name)."""
        fname = self.an.source_name(a, f, name)
        for pkg, file in self._candidates(a, f, name):
            tree = self.an.tree(pkg, file)
            if tree and any(isinstance(n, ast.FunctionDef) and n.name == fname for n in tree.body):
                return pkg, file, fname
        return None

    def _candidates(self, a: str, f: str, name: str) -> Iterator[tuple[str, str]]:
        yield a, f
        info = self.an.info(a, f)
        for bnd in info.bindings.get(name, []) if info else []:
            if bnd.kind == "import" and bnd.module and (loc := self.module_exists(bnd.module)):
                yield loc
            if bnd.kind == "assign" and isinstance(bnd.node, ast.Assign):
                reg = contract._registry_lookup(bnd.node.value)
                if reg:
                    hp, hf, _ = self.an._home(a, f, reg[0])
                    yield hp, hf
                    hinfo = self.an.info(hp, hf)
                    for b2 in hinfo.bindings.get(reg[0], []) if hinfo else []:
                        if b2.kind == "import" and b2.module and (loc := self.module_exists(b2.module)):
                            yield loc
        for module, _ in _module_imports(self.an.tree(a, f) or ast.Module(body=[], type_ignores=[]),
                                         pyast.relative_base(f)).values():
            loc = self.module_exists(module)
            if loc:
                yield loc


_FOUND, _MISSING = object(), object()  # importlib.util.find_spec's answer for a module that is / is not locked


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
    return {ast.Lt: lv < rv, ast.LtE: lv <= rv, ast.Gt: lv > rv, ast.GtE: lv >= rv, ast.Eq: lv == rv,
            ast.NotEq: lv != rv}.get(type(op))


class _V:
    def __init__(self, v: object) -> None:
        self.v = v if isinstance(v, Version) else Version(str(v))


def _v(text: str) -> _V | None:
    try:
        return _V(text)
    except InvalidVersion:
        return None


@dataclass
class _Params:
    names: set[str]
    positional: int  # how many positional parameters (including self)
    var_pos: bool
    var_kw: bool
    text: str


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> _Params:
    a = fn.args
    pos = [x.arg for x in [*a.posonlyargs, *a.args]]
    return _Params(names={*(x.arg for x in a.args), *(x.arg for x in a.kwonlyargs)}, positional=len(pos),
                   var_pos=a.vararg is not None, var_kw=a.kwarg is not None, text=_sig(fn))


def _sig(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return "(" + ast.unparse(fn.args)[:200] + ")"


def _incompatible(p: _Params, call: ast.Call, *, skip_self: bool) -> str | None:
    """Why a call does not fit the parameters, or None."""
    if any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords):
        return None
    npos = len(call.args) + (1 if skip_self else 0)
    if npos > p.positional and not p.var_pos:
        return f"takes {p.positional} positional arguments but {npos} were given"
    for k in call.keywords:
        if k.arg not in p.names and not p.var_kw:
            return f"got an unexpected keyword argument '{k.arg}'"
    return None


def _catches(h: ast.ExceptHandler) -> bool:
    if h.type is None:
        return True
    names = [ast.unparse(x).split(".")[-1] for x in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])]
    return any(n in CATCHES for n in names)


def _with(ctx: Ctx, **kw: object) -> Ctx:
    return Ctx(**{**ctx.__dict__, **kw})


def _exits(stmts: list[ast.stmt]) -> bool:
    """The block always leaves its enclosing block (return, raise, continue or break on every path through it)."""
    if not stmts:
        return False
    last = pyast.reachable(stmts)[-1]
    if isinstance(last, ast.Return | ast.Raise | ast.Continue | ast.Break):
        return True
    return isinstance(last, ast.If) and _exits(last.body) and _exits(last.orelse)


def _walk_no_defs(node: ast.AST) -> Iterator[ast.AST]:
    """pyast.walk, but not into nested function, lambda or class bodies (they run later, in another context)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if n is not node and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(n))))


def _function_scope(fn: ast.FunctionDef | ast.AsyncFunctionDef, current: str
                    ) -> tuple[dict[str, tuple[str, str | None]], frozenset[str]]:
    """In one walk: the imports anywhere in a function ({local name: (module, attr)}), and the names it binds
    itself (parameters, assignments, loop and with targets, less those it declares global), which inside it
    hide module-level imports of the same name."""
    a = fn.args
    names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                              *([a.kwarg] if a.kwarg else [])]}
    glob: set[str] = set()
    imports: dict[str, tuple[str, str | None]] = {}
    for n in pyast.walk(fn):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Global | ast.Nonlocal):
            glob |= set(n.names)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            imports.update(_import_bindings(n, current))
    return imports, frozenset(names - glob)


def _import_bindings(s: ast.Import | ast.ImportFrom, current: str) -> dict[str, tuple[str, str | None]]:
    """{local name: (module, attribute or None)} an import statement binds (`current`: pyast.relative_base)."""
    out: dict[str, tuple[str, str | None]] = {}
    if isinstance(s, ast.Import):
        for x in s.names:
            out[x.asname or x.name.split(".")[0]] = (x.name if x.asname else x.name.split(".")[0], None)
    else:
        mod = pyast._resolve_relative(s.module, s.level, current)
        for x in s.names:
            if x.name != "*":
                out[x.asname or x.name] = (mod, x.name)
    return out


def _module_imports(tree: ast.Module, current: str) -> dict[str, tuple[str, str | None]]:
    out: dict[str, tuple[str, str | None]] = {}
    for s in tree.body:
        for node in pyast.walk(s) if isinstance(s, ast.If | ast.Try | ast.TryStar) else [s]:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.update(_import_bindings(node, current))
    return out


# -- running it on a stack -----------------------------------------------------------------------------------

def a_set(stack: Stack, locked: dict[str, LockedPackage]) -> list[str]:
    """The packages discovery reads as A: the stack's top-level requirements that are locked."""
    return sorted({requirement_name(line) for line in stack.top_level} & set(locked))


def results(stack: Stack, *, locked: dict[str, LockedPackage], cache: WheelCache) -> list[ProbeResult]:
    """Discovery's findings as probe results (one per finding, then one summary with the counts and the
    suppression rules that applied), cached under the wheels' sha256 and the probes' code."""
    from rlstack.probes import suite

    a = a_set(stack, locked)
    # B: every locked package with Python sources that an A imports from; found from A's imports' top names
    sources, _, _ = suite.fetch_sources(stack, set(a), locked, cache)
    tops: set[str] = set()
    try:
        for pkg in a:
            for n in sources.name_set(pkg):
                if n.endswith(".py"):
                    for m in re.finditer(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", sources.read(pkg, n) or "", re.M):
                        tops.add(m[1])
    finally:
        sources.close()
    b = {p for p in locked if p.replace("-", "_") in tops or p in tops} - set(a)
    key = {"stack": stack.name, "a": a,
           "locked": sorted(f"{n}=={p.version}" for n, p in locked.items() if n in b | set(a)),
           "python": stack.python, "platform": stack.platform, "code": suite.code_hash()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = cache_dir() / "results" / f"discover-{digest}.json"
    if path.is_file():
        return [ProbeResult.model_validate(r) for r in json.loads(path.read_text())]
    sources, errors, _ = suite.fetch_sources(stack, set(a) | b, locked, cache,
                                                   prefetch_skip=frozenset())
    try:
        d = Discovery(stack, sources, locked, a)
        for pkg in a:
            if pkg in sources.wheels:
                d.walk(pkg)
                d.pastes(pkg)
        out = _as_results(d, errors)
    finally:
        sources.close()
    if not any(r.undecided for r in out):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps([r.model_dump(mode="json") for r in out]))
    return out


def _as_results(d: Discovery, errors: dict[str, str]) -> list[ProbeResult]:
    out: list[ProbeResult] = []
    seen: set[str] = set()
    real = [f for f in d.tally.findings if f.rule is None]
    by_id: dict[str, ProbeResult] = {}
    for f in real:
        pid = f"discovered:{f.a}->{f.b}:{f.kind}:{f.key}"
        if pid in by_id:  # the same break reached from another site: one finding, every site as evidence
            if len(by_id[pid].evidence) < 12 and f.evidence[0] not in by_id[pid].evidence:
                by_id[pid].evidence.append(f.evidence[0])
            continue
        seen.add(pid)
        reason, ev = f.message, f.evidence[:8]
        others = d.installed_elsewhere(f.a, f.target) if f.target else []
        if others:  # say who papers over it, and that it holds only in that import order
            pkg, file, line = others[0]
            reason += (f"; {pkg} assigns {'.'.join(f.target or ())} itself ({file}:{line}), so this works only when "
                       f"{pkg} is imported before {f.a}")
            ev = [*ev, *(Evidence(text=f"{p} assigns {'.'.join(f.target or ())}", package=p, file=fl, line=ln)
                         for p, fl, ln in others[:3])]
        by_id[pid] = ProbeResult(id=pid, layer="contract", status="fail", reason=reason, evidence=ev)
        out.append(by_id[pid])
    sup = d.tally.suppressed()
    checked = d.tally.checked
    reason = (f"discovery read {', '.join(d.a_set)} against the locked packages they reach: "
              f"{sum(checked.values())} contracts checked ("
              + ", ".join(f"{checked[k]} {k}s" for k in ("replacement", "import", "paste", "keyword")) +
              f"); {len(seen)} finding(s); {sum(sup.values())} suppressed by a rule ("
              + (", ".join(f"{r}: {n}" for r, n in sup.most_common()) or "none") + ")")
    ev = [Evidence(text=f"rule {r} ({n}): {RULES[r]}") for r, n in sup.most_common()]
    for f in [x for x in d.tally.findings if x.rule][:200]:
        e = f.evidence[0]
        ev.append(Evidence(text=f"suppressed [{f.rule}] {f.kind} {f.a}->{f.b}: {f.message[:200]}", package=e.package,
                           file=e.file, line=e.line))
    undecided = sorted(errors)
    status = "skip" if undecided else "pass"
    if undecided:
        reason += f"; UNDECIDED: cannot read {', '.join(undecided)}"
    out.append(ProbeResult(id="discovered:summary", layer="contract", status=status,  # type: ignore[arg-type]
                           reason=reason, evidence=ev, undecided=bool(undecided)))
    return out
