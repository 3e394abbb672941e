"""A's use sites: one walk over each A package's modules that records every statement on a path that runs
in this stack, with where it sits (the guards around it, what catches its failure, the function, the names
in scope), for the passes to check against the ApiModel.

The walk is the one place that decides which paths run (guards evaluated against the lock by
rlstack.probes.discover.guards; an early exit guards the rest of its block; a try whose import fails on this
lock runs its handler, which is walked and checked like any other path, while the handler of a try that runs
through is read only for what it binds in its place: a stub, or a working alternative) and which names a statement sees
(module imports, a function's own imports, less the names it rebinds), so the passes agree on both. It also
collects what a pass needs about A as a whole before checking any of it: the modules A references (an import
or a string naming them), the names A assigns onto B's modules itself, and the calls A surely makes, which
decide the function bodies A reaches (reached_names): a missing name there is a finding, elsewhere in a
function body it is excused (in-function-import).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from rlstack.probes import contract, pyast
from rlstack.probes.discover.guards import Guards
from rlstack.probes.discover.model import ApiModel, Bound, Scope

# what the handler of a catching try binds a name to: "stub" (a placeholder class, a def that only raises: the
# failure moves to where the name is used), "alternative" (another import, a shim with a body), "none" (None or
# a flag the code tests before use)
Fallback = tuple[str, int, str]  # (kind, line, source text)

# the methods a call of their class runs (Ctx.callers)
CONSTRUCTORS = frozenset({"__init__", "__new__", "__post_init__"})

CATCHES = {"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError", "Exception", "BaseException",
           "NameError", "RuntimeError", "ValueError", "KeyError"}


@dataclass(frozen=True, eq=False)
class Ctx:
    """Where a statement sits: in which of A's files, whether its path runs in this stack, what catches its
    failure, the function, and the imports it sees."""

    a: str
    file: str
    imports: Scope  # the module's imports ({local name: (module, attr)}), wherever in the module they are
    live: bool | None = True  # True: runs; None: under a guard that cannot be evaluated; False: never
    caught: bool = False
    func: str | None = None
    # what calling reaches each enclosing function's body, outermost first (callee_key): `module:name` for a
    # function outside a class and for a constructor (`__init__`, `__new__`, `__post_init__` run when the class
    # is called: `module:Class`), `.name` for any other method
    callers: tuple[str, ...] = ()
    cls: str | None = None  # the class whose body the statement is in, directly
    local: Scope = field(default_factory=dict)  # the enclosing functions' own imports
    shadow: frozenset[str] = frozenset()  # names the function binds itself (parameters, assignments)
    # what the handlers of the enclosing catching trys bind each name to, innermost first
    fallback: Mapping[str, Fallback] = field(default_factory=dict)
    # string values a name of the enclosing function can take (its str default, the constants it is compared
    # with): what an f-string handed to eval/exec/import_module can be resolved with
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @cached_property
    def scope(self) -> Scope:
        """The imports a statement sees: the module's and the function's own, less the names the function
        rebinds (a parameter called `model` is not the module imported as `model`). Shared by every statement
        of a block, so computed once per block."""
        scope = {**self.imports, **self.local}
        return {k: v for k, v in scope.items() if k not in self.shadow or k in self.local} if self.shadow else scope

    @property
    def rule(self) -> str | None:
        """The suppression rule any finding here falls under, whatever its kind."""
        return "caught" if self.caught else "guard-unknown" if self.live is None else None

    def stub(self, names: Iterable[str]) -> Fallback | None:
        """The stub a catching handler binds one of these names to, if it does: a missing name there is a
        finding, not 'caught' (the placeholder defers the failure to where the name is used)."""
        if not self.caught:
            return None
        return next((fb for n in names if (fb := self.fallback.get(n)) and fb[0] == "stub"), None)

    @property
    def where(self) -> str:
        """When the statement runs, for a finding's message."""
        return f" in {self.func}()" if self.func else f" when {contract._dotted(self.file)} is imported"


@dataclass(frozen=True, slots=True)
class Site:
    """One place in A that runs in this stack: a simple statement (`statement`, an import or anything else
    that is not a block), or the expressions a block statement evaluates where it stands (its test, its
    decorators and defaults, its bases, its with-items or loop iterable), in `reads`."""

    seq: int  # the order of the walk, over all A packages: findings are rendered in this order
    ctx: Ctx
    statement: ast.stmt | None
    reads: tuple[ast.AST, ...]
    # the statement's assignments and the calls that may assign or pass keywords, with their place in
    # pyast.walk's order: found by the walk's one pass over the statement, so no pass walks it again
    nodes: tuple[tuple[int, ast.Assign | ast.Call], ...] = ()


@dataclass
class Uses:
    """Every live site of the A packages, in walk order, and what was collected about each A on the way."""

    sites: list[Site] = field(default_factory=list)
    refs: dict[str, set[str]] = field(default_factory=dict)  # A -> the modules (and names) it references
    # A -> {(B module, name): (file, line)} that A assigns onto B's modules itself on a path that runs here
    installs: dict[str, dict[tuple[str, str], tuple[str, int]]] = field(default_factory=dict)
    # A -> {(B module, name): [(file, line, function or None, live)]}: every such assignment, wherever it is
    install_sites: dict[str, dict[tuple[str, str], list[tuple[str, int, str | None, bool | None]]]] = field(
        default_factory=dict)
    end: dict[str, int] = field(default_factory=dict)  # A -> a seq after all its sites (where its pastes go)
    # A -> {what A calls (call_keys of `f(...)`, `x.f(...)`, `@f`, `k[grid](...)`): the Ctx.callers of each place
    # it does so} where the call surely runs once its statement does: on a path that runs here, not caught, not
    # in an and/or operand after the first, a branch of `x if c else y` or a comprehension's body (Uses.reached)
    calls: dict[str, dict[str, set[tuple[str, ...]]]] = field(default_factory=dict)
    _reached: dict[str, frozenset[str]] = field(default_factory=dict)  # A -> reached_names(A), computed once

    def referenced(self, a: str, f: str) -> bool:
        """Whether a source of A imports this module on a path that runs (not under a guard that is false in
        this stack) or names it in a string (a registry, importlib)."""
        mod = contract._dotted(f)
        refs = self.refs.get(a, set())
        return "." not in mod or mod in refs or mod.rsplit(".", 1)[1] in refs or any(
            r.startswith(mod + ".") for r in refs)

    def reached(self, ctx: Ctx) -> bool:
        """Whether the function bodies around a statement are reached: each enclosing function's key
        (Ctx.callers) is in reached_names."""
        if ctx.a not in self._reached:
            self._reached[ctx.a] = reached_names(self.calls.get(ctx.a, {}))
        got = self._reached[ctx.a]
        return bool(ctx.callers) and all(c in got for c in ctx.callers)

    def import_rule(self, ctx: Ctx, conditional: bool = False) -> str | None:
        """The rule a missing name read at module level or in a function falls under, beyond ctx.rule: in a
        function that A calls (Uses.reached), on the function's own path that runs here (guards inside it are
        ctx.live), a missing name is a finding like a module-level one, unless the read sits in a part of its
        expression that only some paths evaluate (`conditional`)."""
        if ctx.func and (conditional or not self.reached(ctx)):
            return "in-function-import"
        return None if self.referenced(ctx.a, ctx.file) else "unreferenced-module"

    def installed_by_a(self, ctx: Ctx, module: str, name: str, line: int) -> str | None:
        """The rule a read of a name B lacks falls under because A assigns that name onto B itself: only an
        assignment that runs in this stack counts ('installed-by-a'; under a guard this cannot read:
        'guard-unknown'), and not one later in the same module than a module-level read (it runs after the read
        failed). None when no such assignment excuses it."""
        rule = None
        for file, at, func, live in self.install_sites.get(ctx.a, {}).get((module, name), []):
            if live is False or (file == ctx.file and func is None and ctx.func is None and at > line):
                continue
            if live:
                return "installed-by-a"
            rule = "guard-unknown"
        return rule

    def statement_nodes(self) -> Iterator[tuple[Site, int, ast.Assign | ast.Call]]:
        """(site, place, node) for the assignments and calls of every simple statement but an import, in
        pyast.walk's order (the place orders findings inside one statement)."""
        for site in self.sites:
            for i, node in site.nodes:
                yield site, i, node


def walk(model: ApiModel, a_set: Sequence[str], only: Mapping[str, Collection[str]] | None = None,
         known: Uses | None = None) -> Uses:
    """The use sites of every A package with sources, in a_set's order. `only` ({A: files}) walks just those
    files of each A, and `known` supplies what is collected about A as a whole (references, installs) from a
    full walk of the same A sources: how a rerun after a change to B's sources stays as cheap as the files
    that change can reach (bench/probe_mutation)."""
    walker = _Walker(model)
    for a in a_set:
        if a in model.src.wheels and (only is None or a in only):
            walker.package(a, None if only is None else only[a])
    if known is not None:
        walker.uses.refs, walker.uses.installs = known.refs, known.installs
        walker.uses.install_sites, walker.uses.calls = known.install_sites, known.calls
        walker.uses._reached = known._reached
    return walker.uses


class _Walker:
    def __init__(self, model: ApiModel) -> None:
        self.model = model
        self.guards = Guards(model)
        self.uses = Uses()
        self._seq = 0

    def package(self, a: str, only: Collection[str] | None = None) -> None:
        files = sorted(n for n in self.model.src.names(a) if n.endswith(".py") and "/tests/" not in f"/{n}"
                       and (only is None or n in only))
        self.uses.refs.setdefault(a, set())
        self.uses.installs.setdefault(a, {})
        self.uses.calls.setdefault(a, {})
        for f in files:
            tree = self.model.an.tree(a, f)
            if tree is None:
                continue
            self._collect_strings(a, tree)
            ctx = Ctx(a, f, module_imports(tree, pyast.relative_base(f)))
            self._stmts(tree.body, ctx, self.guards.consts(a, f))
        self.uses.end[a] = self._seq  # no site of A's has it, nor any of the next A's
        self._seq += 1

    def _site(self, ctx: Ctx, statement: ast.stmt | None, reads: Sequence[ast.AST],
              nodes: tuple[tuple[int, ast.Assign | ast.Call], ...] = ()) -> None:
        if reads:
            self.uses.sites.append(Site(self._seq, ctx, statement, tuple(reads), nodes))
            self._seq += 1
            if ctx.live is True and not ctx.caught:
                calls = self.uses.calls[ctx.a]
                for top in reads:
                    for node, conditional in walk_paths(top):
                        if isinstance(node, ast.Call) and not conditional:
                            f = node.func.value if isinstance(node.func, ast.Subscript) else node.func  # k[grid](...)
                            for key in call_keys(f, ctx):
                                calls.setdefault(key, set()).add(ctx.callers)

    def _stmts(self, stmts: list[ast.stmt], ctx: Ctx, versions: dict[str, object]) -> None:
        for s in stmts:
            if ctx.live is False:
                return
            if isinstance(s, ast.If):
                has = functools.partial(self._has, ctx)
                self._site(ctx, None, self.guards.operands(s.test, versions, has))
                g = self.guards.guard(s.test, versions, has)
                live_body = ctx.live if g is True else False if g is False else None if ctx.live else ctx.live
                live_else = ctx.live if g is False else False if g is True else None if ctx.live else ctx.live
                self._stmts(s.body, dataclasses.replace(ctx, live=live_body), versions)
                self._stmts(s.orelse, dataclasses.replace(ctx, live=live_else), versions)
                # an early exit (`if not permitted: return`, `if version < X: raise`): the rest of the block runs
                # only on the path that did not exit, so it is under this guard's negation
                body_exits, else_exits = _exits(s.body), _exits(s.orelse)
                if (body_exits and else_exits) or (body_exits and g is True) or (else_exits and g is False):
                    return
                if (body_exits or else_exits) and g is None and ctx.live:
                    ctx = dataclasses.replace(ctx, live=None)
            elif isinstance(s, ast.Try | ast.TryStar):
                catching = [h for h in s.handlers if _catches(h)]
                fallback = {**ctx.fallback, **fallbacks(catching)} if catching else ctx.fallback
                caught = dataclasses.replace(ctx, caught=ctx.caught or bool(catching), fallback=fallback)
                self._stmts(s.body, caught, versions)
                if catching and self._fails(s.body, ctx):
                    # an import of the body fails on this lock: the handler is the path that runs, and is checked
                    for h in catching:
                        self._stmts(h.body, ctx, versions)
                else:  # the body runs through: the handlers never do here, the else-branch does
                    self._stmts(s.orelse, caught, versions)
                self._stmts(s.finalbody, ctx, versions)
            elif isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
                # decorators and defaults run where the def is, in the enclosing path; a decorator is called there
                self._site(ctx, None, [*s.decorator_list, *s.args.defaults, *(d for d in s.args.kw_defaults if d)])
                self._decorators(ctx, s.decorator_list)
                imports_in, names_in = function_scope(s, pyast.relative_base(ctx.file))
                local = {**ctx.local, **imports_in}
                shadow = (ctx.shadow | names_in) - set(local)
                caller = callee_key(ctx, s.name)
                self._stmts(s.body, dataclasses.replace(ctx, func=s.name, callers=(*ctx.callers, caller), cls=None,
                                                        local=local, shadow=shadow,
                                                        values={**ctx.values, **string_values(s)}), versions)
            elif isinstance(s, ast.ClassDef):
                self._site(ctx, None, [*s.decorator_list, *s.bases, *(k.value for k in s.keywords)])
                self._decorators(ctx, s.decorator_list)
                self._stmts(s.body, dataclasses.replace(ctx, cls=s.name), versions)
            elif isinstance(s, ast.With | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While):
                heads = [i.context_expr for i in s.items] if isinstance(s, ast.With | ast.AsyncWith) else \
                    [s.test] if isinstance(s, ast.While) else [s.iter]
                self._site(ctx, None, heads)
                self._stmts(s.body, ctx, versions)
                self._stmts(getattr(s, "orelse", []), ctx, versions)
            else:
                self._site(ctx, s, [s], self._collect(ctx, s))

    def _decorators(self, ctx: Ctx, decorators: list[ast.expr]) -> None:
        """A bare decorator (`@f`, `@mod.f`) is called where the def stands: a call of f (Uses.calls)."""
        if ctx.live is True and not ctx.caught:
            for d in decorators:
                for key in call_keys(d, ctx):
                    self.uses.calls[ctx.a].setdefault(key, set()).add(ctx.callers)

    def _has(self, ctx: Ctx, e: ast.expr, name: str) -> bool | None:
        """`hasattr(e, name)` on this lock, where e is a module of B's sources (through the imports the
        statement sees); None for anything else."""
        m = self.model
        full = None
        if isinstance(e, ast.Name) and e.id in ctx.scope:
            module, attr = ctx.scope[e.id]
            full = module if attr is None else f"{module}.{attr}"
        elif isinstance(e, ast.Attribute) and (hit := m.module_chain(e, ctx.scope)) is not None:
            full = ".".join([hit[0], *hit[1]])
        if not full or m.owner(full) not in m.src.wheels or m.module_exists(full) is None:
            return None
        got = m.name_in_module(full, name)
        return True if got == "yes" else False if got == "no" else None

    def _fails(self, body: list[ast.stmt], ctx: Ctx) -> bool:
        """An import at the top of a try body names a module or name that is not in the locked sources (its
        package is read, so the answer is known): the import raises here and the handler runs."""
        m = self.model
        for s in body:
            if not isinstance(s, ast.Import | ast.ImportFrom):
                continue
            for local, (module, attr) in import_bindings(s, pyast.relative_base(ctx.file)).items():
                pkg = m.owner(module)
                if pkg is None or pkg not in m.src.wheels:
                    continue
                if attr is None:
                    full = module if isinstance(s, ast.ImportFrom) else next(
                        x.name for x in s.names if (x.asname or x.name.split(".")[0]) == local)
                    if not (m.module_exists(full) or m.compiled(pkg, full)):
                        return True
                elif m.name_in_module(module, attr) in ("no", "no-module"):
                    return True
        return False

    def _collect_strings(self, a: str, tree: ast.Module) -> None:
        refs = self.uses.refs[a]
        for node in pyast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200 \
                    and re.fullmatch(r"[A-Za-z_][\w.]*", node.value):
                refs.add(node.value)

    def _collect(self, ctx: Ctx, s: ast.stmt) -> tuple[tuple[int, ast.Assign | ast.Call], ...]:
        """What a statement tells about A as a whole: the modules an import references, or the names an
        assignment (`B.mod.NAME = ...`, `setattr(B.mod, "NAME", ...)`) installs onto B's modules; and, for a
        statement that is not an import, its assignments and calls (Site.nodes)."""
        if isinstance(s, ast.ImportFrom | ast.Import):
            refs = self.uses.refs[ctx.a]
            for module, attr in import_bindings(s, pyast.relative_base(ctx.file)).values():
                refs.add(module)
                if attr:
                    refs.add(f"{module}.{attr}")
            if isinstance(s, ast.Import):
                refs |= {x.name for x in s.names}
            elif any(x.name == "*" for x in s.names):  # `from B.x import *` imports B.x as surely as any other
                refs.add(pyast._resolve_relative(s.module, s.level, pyast.relative_base(ctx.file)))
            return ()
        got = self.uses.installs[ctx.a]
        every = self.uses.install_sites.setdefault(ctx.a, {})
        nodes: list[tuple[int, ast.Assign | ast.Call]] = []
        for i, node in enumerate(pyast.walk(s)):
            targets: list[ast.Attribute] = []
            if isinstance(node, ast.Assign):
                targets = [t for t in node.targets if isinstance(t, ast.Attribute)]
                nodes += [(i, node)] if targets else []
            elif isinstance(node, ast.Call):
                if node.keywords or len(node.args) == 3:  # what may pass keywords, or be setattr(x, "name", v)
                    nodes.append((i, node))
                if isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(node.args) == 3 and \
                        isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    targets = [ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Store())]
            for t in targets:
                hit = self.model.module_chain(t, ctx.scope)
                if hit is not None and len(hit[1]) == 1:
                    line = getattr(node, "lineno", 0)
                    every.setdefault((hit[0], hit[1][0]), []).append((ctx.file, line, ctx.func, ctx.live))
                    if ctx.live:
                        got.setdefault((hit[0], hit[1][0]), (ctx.file, line))
        return tuple(nodes)


def callee_key(ctx: Ctx, name: str) -> str:
    """What a call of the function `name` defined where ctx stands is recorded as (Ctx.callers): `module:name`
    outside a class, `module:Class` for a constructor, `.name` for another method."""
    module = contract._dotted(ctx.file)
    if ctx.cls is None:
        return f"{module}:{name}"
    return f"{module}:{ctx.cls}" if name in CONSTRUCTORS else f".{name}"


def call_keys(f: ast.expr, ctx: Ctx) -> list[str]:
    """The callee_keys a call of `f` may reach: a plain name through the imports the statement sees (else a
    function of the calling module); `mod.g` through a module alias; `x.g` any method g (a receiver's class is
    not read)."""
    if isinstance(f, ast.Name):
        bound = ctx.scope.get(f.id)
        if bound is None:
            return [f"{contract._dotted(ctx.file)}:{f.id}"]
        return [f"{bound[0]}:{bound[1]}"] if bound[1] else []
    if isinstance(f, ast.Attribute):
        keys = [f".{f.attr}"]
        head, rest = pyast.attribute_chain(f.value)  # `mod.sub.g`: the receiver as a dotted module path
        if isinstance(head, ast.Name) and (bound := ctx.scope.get(head.id)) is not None:
            root = bound[0] if bound[1] is None else f"{bound[0]}.{bound[1]}"
            keys.append(f"{'.'.join([root, *rest])}:{f.attr}")
        return keys
    return []


def reached_names(calls: Mapping[str, set[tuple[str, ...]]]) -> frozenset[str]:
    """The callee_keys of A's functions that A itself calls from where its code starts running: a call that
    surely runs (Uses.calls) at module level, in a class body, or in a function that is itself public (an entry
    point A's users call: no leading underscore) or reached, to a fixed point. A function outside a class is
    matched through the caller's imports (its module and name); a method by its name alone, as a call through
    an attribute (`self.f()`, `obj.f()`) names no class a static read can pin down. A private function that only
    unreached private code calls, or that is only handed around (a callback, a registry entry), is not reached,
    and what it reads stays excused (in-function-import)."""
    reached: set[str] = set()
    todo = dict(calls)
    changed = True
    while changed:
        changed = False
        for name, chains in list(todo.items()):
            if any(all(c in reached or _public(c) for c in chain) for chain in chains):
                reached.add(name)
                del todo[name]
                changed = True
    return frozenset(reached)


def _public(key: str) -> bool:
    name = key.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def walk_paths(node: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """pyast.walk's nodes (not into nested function, lambda or class bodies, which run later, in another
    context), each with whether only some paths through the expression evaluate it: an operand of and/or after
    the first, a branch of `x if c else y`, a comprehension's body, conditions and later loops."""
    todo: list[tuple[ast.AST, bool]] = [(node, False)]
    while todo:
        n, cond = todo.pop()
        yield n, cond
        if n is not node and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        todo.extend(reversed([(c, cond or _conditional(n, c)) for c in ast.iter_child_nodes(n)]))


def _conditional(parent: ast.AST, child: ast.AST) -> bool:
    """Whether evaluating `parent` may skip `child` (walk_paths)."""
    if isinstance(parent, ast.BoolOp):
        return child is not parent.values[0]
    if isinstance(parent, ast.IfExp):
        return child is not parent.test
    if isinstance(parent, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
        return child is not parent.generators[0]
    if isinstance(parent, ast.comprehension):
        return child is not parent.iter and child is not parent.target
    return False


def setattr_assign(node: ast.Call) -> tuple[ast.Assign, ast.Attribute] | None:
    """`setattr(x, "name", v)` as the assignment `x.name = v` it makes (and its target); None for any other
    call."""
    if ast.unparse(node.func) == "setattr" and len(node.args) == 3 and isinstance(node.args[1], ast.Constant):
        target = ast.Attribute(value=node.args[0], attr=str(node.args[1].value), ctx=ast.Store())
        return ast.Assign(targets=[target], value=node.args[2], lineno=node.lineno), target
    return None


def fallbacks(handlers: Sequence[ast.ExceptHandler]) -> dict[str, Fallback]:
    """{name: (kind, line, text)} for what catching handlers bind (the first binding of a name wins, nested
    trys and ifs included): 'stub' for a placeholder class (`class X: pass`) or a def whose body only raises
    or passes, 'none' for None, 'alternative' for anything else (an import, a shim with a body)."""
    out: dict[str, Fallback] = {}

    def visit(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, ast.Try | ast.TryStar):
                visit(s.body)
                for h in s.handlers:
                    visit(h.body)
            elif isinstance(s, ast.If):
                visit(s.body)
                visit(s.orelse)
            elif isinstance(s, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "stub" if _placeholder(s) else "alternative"
                head = ast.unparse(s).split("\n")[0]  # `class X:` then its first statement: `class X: pass`
                out.setdefault(s.name, (kind, s.lineno, f"{head} {ast.unparse(s.body[-1]).split(chr(10))[0]}"[:120]))
            elif isinstance(s, ast.Import | ast.ImportFrom):
                for x in s.names:
                    out.setdefault(x.asname or x.name.split(".")[0], ("alternative", s.lineno, ast.unparse(s)[:120]))
            elif isinstance(s, ast.Assign):
                none = isinstance(s.value, ast.Constant) and s.value.value in (None, False)
                for tgt in s.targets:
                    for n in ast.walk(tgt):
                        if isinstance(n, ast.Name):
                            out.setdefault(n.id, ("none" if none else "alternative", s.lineno, ast.unparse(s)[:120]))

    for h in handlers:
        visit(h.body)
    return out


def _placeholder(d: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A class whose body is only `pass`, `...` or a docstring; a def whose body only raises (or does nothing)."""
    body = [s for s in d.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if isinstance(d, ast.ClassDef):
        return all(isinstance(s, ast.Pass) for s in body)
    return all(isinstance(s, ast.Pass | ast.Raise) for s in body)


def string_values(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, tuple[str, ...]]:
    """{name: the strings it can hold} for a function's parameters with a str default and the names it assigns
    only string constants: the default or constants, plus every constant the name is compared with (`x ==
    "a"`, `x in ("b", "c")`), which is how a dispatch over a known list of values reads."""
    vals: dict[str, set[str]] = {}
    a = fn.args
    pos = [*a.posonlyargs, *a.args]
    for arg, default in [*zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True),
                         *zip(a.kwonlyargs, a.kw_defaults, strict=True)]:
        if isinstance(default, ast.Constant) and isinstance(default.value, str):
            vals.setdefault(arg.arg, set()).add(default.value)
    assigned: dict[str, bool] = {}
    for n in pyast.walk(fn):
        if isinstance(n, ast.Assign):
            const = n.value.value if isinstance(n.value, ast.Constant) and isinstance(n.value.value, str) else None
            for tgt in n.targets:
                if isinstance(tgt, ast.Name):
                    assigned[tgt.id] = assigned.get(tgt.id, True) and const is not None
                    if const is not None:
                        vals.setdefault(tgt.id, set()).add(const)
        elif isinstance(n, ast.Compare) and isinstance(n.left, ast.Name) and len(n.ops) == 1:
            right = n.comparators[0]
            consts = [right] if isinstance(n.ops[0], ast.Eq) else \
                list(right.elts) if isinstance(n.ops[0], ast.In) and isinstance(right, ast.Tuple | ast.List | ast.Set) \
                else []
            got = {c.value for c in consts if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if got:
                vals.setdefault(n.left.id, set()).update(got)
    ok = {x.arg for x in [*pos, *a.kwonlyargs]} | {k for k, v in assigned.items() if v}
    return {k: tuple(sorted(v)) for k, v in vals.items() if k in ok and k not in
            {k2 for k2, v2 in assigned.items() if not v2}}


def _catches(h: ast.ExceptHandler) -> bool:
    if h.type is None:
        return True
    names = [ast.unparse(x).split(".")[-1] for x in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])]
    return any(n in CATCHES for n in names)


def _exits(stmts: list[ast.stmt]) -> bool:
    """The block always leaves its enclosing block (return, raise, continue or break on every path through it)."""
    if not stmts:
        return False
    last = pyast.reachable(stmts)[-1]
    if isinstance(last, ast.Return | ast.Raise | ast.Continue | ast.Break):
        return True
    return isinstance(last, ast.If) and _exits(last.body) and _exits(last.orelse)


def function_scope(fn: ast.FunctionDef | ast.AsyncFunctionDef, current: str) -> tuple[dict[str, Bound], frozenset[str]]:
    """In one walk: the imports anywhere in a function ({local name: (module, attr)}), and the names it binds
    itself (parameters, assignments, loop and with targets, less those it declares global), which inside it
    hide module-level imports of the same name."""
    a = fn.args
    names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                              *([a.kwarg] if a.kwarg else [])]}
    glob: set[str] = set()
    imports: dict[str, Bound] = {}
    for n in pyast.walk(fn):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Global | ast.Nonlocal):
            glob |= set(n.names)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            imports.update(import_bindings(n, current))
    return imports, frozenset(names - glob)


def import_bindings(s: ast.Import | ast.ImportFrom, current: str) -> dict[str, Bound]:
    """{local name: (module, attribute or None)} an import statement binds (`current`: pyast.relative_base)."""
    out: dict[str, Bound] = {}
    if isinstance(s, ast.Import):
        for x in s.names:
            out[x.asname or x.name.split(".")[0]] = (x.name if x.asname else x.name.split(".")[0], None)
    else:
        mod = pyast._resolve_relative(s.module, s.level, current)
        for x in s.names:
            if x.name != "*":
                out[x.asname or x.name] = (mod, x.name)
    return out


def module_imports(tree: ast.Module, current: str) -> dict[str, Bound]:
    """The imports at a module's top level, also inside its top-level if/try blocks."""
    out: dict[str, Bound] = {}
    for s in tree.body:
        for node in pyast.walk(s) if isinstance(s, ast.If | ast.Try | ast.TryStar) else [s]:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.update(import_bindings(node, current))
    return out
