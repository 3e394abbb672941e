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

from rlstack.probes.discover import runtime_names
from rlstack.probes.discover.findings import RULES, STUB, PassResult, Ref
from rlstack.probes.discover.model import ApiModel
from rlstack.probes.discover.sites import Ctx, Site, Uses, import_bindings, walk_paths
from rlstack.probes.model import Evidence
from rlstack.probes.pyast import relative_base


def find(model: ApiModel, uses: Uses) -> PassResult:
    out = PassResult("import")
    dynamic: dict[tuple[str, str], bool] = {}  # whether a file calls eval/exec/import_module at all (text test)
    for site in uses.sites:
        if isinstance(site.statement, ast.Import | ast.ImportFrom):
            _imports(model, uses, site, site.statement, out)
        else:
            _chains(model, uses, site, out)
            key = (site.ctx.a, site.ctx.file)
            if key not in dynamic:
                text = model.src.read(*key) or ""
                dynamic[key] = any(f"{c}(" in text for c in runtime_names.CALLS)
            if dynamic[key]:
                _runtime(model, uses, site, out)
    return out


def ref(out: PassResult, model: ApiModel, ctx: Ctx, b: str, module: str, name: str | None, line: int) -> None:
    """Record a reference that resolves on this lock: what a mutation of B may delete (bench/probe_mutation)."""
    out.refs.append(Ref(out.kind, ctx.a, b, module, name, ctx.file, line, ctx.live is True))


def bound_names(s: ast.stmt | None) -> list[str]:
    """The names a statement binds (an import's locals, an assignment's plain targets): what a catching
    handler's fallback is looked up by."""
    if isinstance(s, ast.Import | ast.ImportFrom):
        return [x.asname or x.name.split(".")[0] for x in s.names]
    if isinstance(s, ast.Assign | ast.AnnAssign):
        targets = s.targets if isinstance(s, ast.Assign) else [s.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def handler_binds(ctx: Ctx, names: list[str]) -> tuple[str, int, str] | None:
    """What the innermost catching handler around the statement binds one of these names to, if it does."""
    return next((fb for n in names if (fb := ctx.fallback.get(n))), None) if ctx.caught else None


def stub_note(ctx: Ctx, names: list[str]) -> str:
    """What a finding says when a stub fallback takes the missing name's place."""
    fb = ctx.stub(names) if ctx.live else None
    return f"; the except-branch binds a {STUB} instead ({fb[2]}, {ctx.file}:{fb[1]}), which fails where it is " \
        "used" if fb else ""


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
            if model.module_exists(full) or model.compiled(b, full):
                ref(out, model, ctx, b, full, None, s.lineno)
            else:
                _no_module(model, site, b, full, ev, _rule(uses, site, "no-module", full, None, [local], s.lineno),
                           out, stub_note(ctx, [local]), [local])
            continue
        got = model.name_in_module(module, attr)
        if got == "yes":
            ref(out, model, ctx, b, module, attr, s.lineno)
            continue
        rule = _rule(uses, site, got, module, attr, [local], s.lineno)
        if got == "no-module":
            _no_module(model, site, b, module, ev, "compiled-module" if model.compiled(b, module) else rule, out,
                       stub_note(ctx, [local]), [local])
            continue
        msg = (f"ImportError: cannot import name '{attr}' from '{module}' ({a} imports it{ctx.where}; "
               f"{b} {model.version(b)} does not define it{stub_note(ctx, [local])})")
        out.add(a, b, msg, ev, rule, f"{module}.{attr}", (site.seq, -1), (module, attr),
                handler_binds(ctx, [local]) if rule == "caught" else None)


def _rule(uses: Uses, site: Site, got: str, module: str, name: str | None, bound: list[str], line: int,
          conditional: bool = False) -> str | None:
    """The rule a missing name falls under: where it is read (`conditional`: in a part of its expression only
    some paths evaluate, sites.walk_paths), what B's module is (name_in_module's answer), or that A installs the
    name itself on a path that runs before the read. None where a catching handler binds the name to a stub on
    a live path: the stub is a finding, whatever else would excuse it."""
    ctx = site.ctx
    if ctx.live and got in ("no", "no-module") and ctx.stub(bound):
        return None
    rule = ctx.rule or (got if got in RULES else None) or uses.import_rule(ctx, conditional)
    if rule is None and name is not None:
        rule = uses.installed_by_a(ctx, module, name, line)
    return rule


def _no_module(model: ApiModel, site: Site, b: str, module: str, ev: list[Evidence], rule: str | None,
               out: PassResult, note: str = "", bound: Sequence[str] = ()) -> None:
    root = model.missing_root(module)
    out.add(site.ctx.a, b, f"ModuleNotFoundError: No module named '{root}' ({site.ctx.a} imports {module}"
            f"{site.ctx.where}; {b} {model.version(b)} does not have it{note})", ev, rule, root, (site.seq, -1),
            fallback=handler_binds(site.ctx, list(bound)) if rule == "caught" else None)


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
    for node, conditional in _longest_loads(site.reads):
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
            ref(out, model, ctx, b, module, rest[0], node.lineno)
            continue
        bound = bound_names(site.statement)
        ev = [Evidence(text=ast.unparse(node)[:200], package=ctx.a, file=ctx.file, line=node.lineno)]
        msg = (f"AttributeError: module '{module}' has no attribute '{rest[0]}' ({ctx.a} reads "
               f"{ast.unparse(node)[:120]}{ctx.where}; {b} {model.version(b)} does not define it"
               f"{stub_note(ctx, bound)})")
        rule = _rule(uses, site, got, module, rest[0], bound, node.lineno, conditional)
        out.add(ctx.a, b, msg, ev, rule, f"{module}.{rest[0]}", (site.seq, -1), (module, rest[0]),
                handler_binds(ctx, bound) if rule == "caught" else None)


def _longest_loads(nodes: Sequence[ast.AST]) -> Iterator[tuple[ast.Attribute, bool]]:
    """The attribute loads in these nodes that are not the receiver of a longer load (only the longest chain
    is checked: it decides the same name), each with whether only some paths evaluate it (sites.walk_paths)."""
    inner: set[int] = set()
    for top in nodes:
        for node, conditional in walk_paths(top):
            if not isinstance(node, ast.Attribute):
                continue
            if isinstance(node.ctx, ast.Load):
                inner.add(id(node.value))
            if id(node) in inner or not isinstance(node.ctx, ast.Load):
                continue
            yield node, conditional


def _runtime(model: ApiModel, uses: Uses, site: Site, out: PassResult) -> None:
    """Names built at run time (runtime_names): each string a call can be, checked like an import of the module
    or name it reaches in B; one the source does not pin down, counted as unchecked when it names B."""
    ctx = site.ctx
    for call, how in runtime_names.calls(site.reads):
        arg = call.args[0]
        texts = runtime_names.expand(arg, ctx.values)
        if texts is None:
            words = runtime_names.DOTTED.findall(runtime_names.literal_text(arg))
            if any((b := model.owner(w.split(".")[0])) and b != ctx.a and b in model.src.wheels for w in words):
                out.unchecked["runtime-name"] += 1
            continue
        for text in texts:
            for module, name in runtime_names.targets(how, text):
                _runtime_target(model, uses, site, call, text, module, name, out)


def _runtime_target(model: ApiModel, uses: Uses, site: Site, call: ast.Call, text: str, module: str,
                    name: str | None, out: PassResult) -> None:
    ctx = site.ctx
    b = model.owner(module)
    if b is None or b == ctx.a or b not in model.src.wheels:
        return
    parts = [*module.split("."), *([name] if name else [])]
    # the longest prefix that is a module of B, and the name after it (an eval'd `trl.trainer.x.Y` is either)
    i = next((i for i in range(len(parts), 0, -1) if model.module_exists(".".join(parts[:i]))), 0)
    if i == 0:
        return
    out.checked += 1
    mod, rest = ".".join(parts[:i]), parts[i:]
    ev = [Evidence(text=f"{ast.unparse(call)[:160]} -> {text[:120]}", package=ctx.a, file=ctx.file, line=call.lineno)]
    if not rest:
        ref(out, model, ctx, b, mod, None, call.lineno)
        return
    got = model.name_in_module(mod, rest[0])
    if got == "yes":
        ref(out, model, ctx, b, mod, rest[0], call.lineno)
        return
    msg = (f"AttributeError: module '{mod}' has no attribute '{rest[0]}' ({ctx.a} builds '{text[:120]}' at run "
           f"time{ctx.where}; {b} {model.version(b)} does not define it)")
    # conditional: a module a function picks at run time (import_module of a family's module) is loaded where
    # its caller has matched that family, which the walk does not follow: excused in a function body
    out.add(ctx.a, b, msg, ev, _rule(uses, site, got, mod, rest[0], bound_names(site.statement), call.lineno, True),
            f"{mod}.{rest[0]}", (site.seq, -1), (mod, rest[0]))
