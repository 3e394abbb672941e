"""The imports pass: every name A imports from B, and every attribute A reads on one of B's modules, must be
there in B's locked version.

`from B.x import Y` and `import B.x` at a site that runs; `import B.x` then `B.x.Y`, `import B.x as m` then
`m.Y`, `from B import x` then `x.Y` where x is a submodule: the first name after the longest module prefix,
checked like `from B.x import Y`. A missing module is one finding (keyed by the first missing prefix, what
ModuleNotFoundError names), however many names are imported from it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from rlstack.probes.discover.findings import RULES, PassResult
from rlstack.probes.discover.model import ApiModel
from rlstack.probes.discover.sites import Site, Uses, import_bindings
from rlstack.probes.model import Evidence
from rlstack.probes.pyast import relative_base


def find(model: ApiModel, uses: Uses) -> PassResult:
    out = PassResult("import")
    for site in uses.sites:
        if isinstance(site.statement, ast.Import | ast.ImportFrom):
            _imports(model, uses, site, site.statement, out)
        else:
            _chains(model, uses, site, out)
    return out


def _imports(model: ApiModel, uses: Uses, site: Site, s: ast.Import | ast.ImportFrom, out: PassResult) -> None:
    a, f, ctx = site.ctx.a, site.ctx.file, site.ctx
    for local, (module, attr) in import_bindings(s, relative_base(f)).items():
        b = model.owner(module)
        if b is None or b == a or b not in model.src.wheels:
            continue
        out.checked += 1
        ev = [Evidence(text=ast.unparse(s)[:200], package=a, file=f, line=s.lineno)]
        if attr is None:
            full = module if isinstance(s, ast.ImportFrom) else next(
                x.name for x in s.names if (x.asname or x.name.split(".")[0]) == local)
            if not (model.module_exists(full) or model.compiled(b, full)):
                _no_module(model, site, b, full, ev, ctx.rule or uses.import_rule(ctx), out)
            continue
        got = model.name_in_module(module, attr)
        if got == "yes":
            continue
        rule = _rule(uses, site, got, module, attr)
        if got == "no-module":
            _no_module(model, site, b, module, ev, "compiled-module" if model.compiled(b, module) else rule, out)
            continue
        msg = (f"ImportError: cannot import name '{attr}' from '{module}' ({a} imports it{ctx.where}; "
               f"{b} {model.version(b)} does not define it)")
        out.add(a, b, msg, ev, rule, f"{module}.{attr}", (site.seq, -1), (module, attr))


def _rule(uses: Uses, site: Site, got: str, module: str, name: str) -> str | None:
    """The rule a missing name falls under: where it is read, what B's module is (name_in_module's answer), or
    that A installs the name itself."""
    ctx = site.ctx
    rule = ctx.rule or (got if got in RULES else None) or uses.import_rule(ctx)
    if rule is None and uses.installed_by_a(ctx.a, module, name):
        rule = "installed-by-a"
    return rule


def _no_module(model: ApiModel, site: Site, b: str, module: str, ev: list[Evidence], rule: str | None,
               out: PassResult) -> None:
    root = model.missing_root(module)
    out.add(site.ctx.a, b, f"ModuleNotFoundError: No module named '{root}' ({site.ctx.a} imports {module}"
            f"{site.ctx.where}; {b} {model.version(b)} does not have it)", ev, rule, root, (site.seq, -1))


def _chains(model: ApiModel, uses: Uses, site: Site, out: PassResult) -> None:
    """Every attribute read on one of B's modules in the site (not inside nested defs, which the walk records
    as their own sites) is checked like `from <module> import <name>`: the first name after the longest module
    prefix must be bound there (a submodule, a module-level name, a plain __getattr__ name). A store
    (`B.x.Y = v`) does not need Y; its receiver `B.x` is read and checked."""
    ctx = site.ctx
    scope = ctx.scope
    if not scope:
        return
    done: set[tuple[str, str]] = set()
    for node in _longest_loads(site.reads):
        hit = model.module_chain(node, scope)
        if hit is None:
            continue
        module, rest = hit
        b = model.owner(module)
        if b is None or b == ctx.a or b not in model.src.wheels or (module, rest[0]) in done:
            continue
        done.add((module, rest[0]))
        out.checked += 1
        got = model.name_in_module(module, rest[0])
        if got == "yes":
            continue
        ev = [Evidence(text=ast.unparse(node)[:200], package=ctx.a, file=ctx.file, line=node.lineno)]
        msg = (f"AttributeError: module '{module}' has no attribute '{rest[0]}' ({ctx.a} reads "
               f"{ast.unparse(node)[:120]}{ctx.where}; {b} {model.version(b)} does not define it)")
        out.add(ctx.a, b, msg, ev, _rule(uses, site, got, module, rest[0]), f"{module}.{rest[0]}", (site.seq, -1),
                (module, rest[0]))


def _longest_loads(nodes: Sequence[ast.AST]) -> Iterator[ast.Attribute]:
    """The attribute loads in these nodes that are not the receiver of a longer load (only the longest chain
    is checked: it decides the same name)."""
    inner: set[int] = set()
    for top in nodes:
        for node in _walk_no_defs(top):
            if not isinstance(node, ast.Attribute):
                continue
            if isinstance(node.ctx, ast.Load):
                inner.add(id(node.value))
            if id(node) in inner or not isinstance(node.ctx, ast.Load):
                continue
            yield node


def _walk_no_defs(node: ast.AST) -> Iterator[ast.AST]:
    """pyast.walk, but not into nested function, lambda or class bodies (they run later, in another context)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if n is not node and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(n))))
