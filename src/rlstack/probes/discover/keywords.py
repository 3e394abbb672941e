"""The keywords pass: every keyword A passes to B's functions and constructors must be a parameter of the
callee in B's locked version, or the callee takes **kwargs (counted under the rule 'kwargs-only', so that a
keyword that newly lands in **kwargs, a parameter B renamed, shows against the stack's baseline: baseline.py).

The callee is what the call's name resolves to through A's imports (`from B.x import f` then `f(k=...)`,
`import B.x` then `B.x.f(k=...)`); a constructor's parameters are its class's __init__, or the first base's
that the sources hold. A callee whose signature a decorator or a generated constructor may change is counted
under a rule, not compared.
"""

from __future__ import annotations

import ast

from rlstack.probes import pyast
from rlstack.probes.discover.findings import RULES, PassResult, Ref
from rlstack.probes.discover.model import ApiModel, Scope
from rlstack.probes.discover.sites import Site, Uses, setattr_assign
from rlstack.probes.model import Evidence


def find(model: ApiModel, uses: Uses) -> PassResult:
    out = PassResult("keyword")
    for site, i, node in uses.statement_nodes():
        if isinstance(node, ast.Call) and node.keywords and setattr_assign(node) is None:
            _keywords(model, uses, site, node, (site.seq, i), out)
    return out


def _keywords(model: ApiModel, uses: Uses, site: Site, call: ast.Call, order: tuple[int, ...], out: PassResult
              ) -> None:
    kws = [k.arg for k in call.keywords if k.arg]
    if not kws:
        return
    a = site.ctx.a
    callee = _callee(model, call.func, site.ctx.scope)
    if callee is None:
        return
    b, module, name = callee
    if b == a or b not in model.src.wheels:
        return
    ev = [Evidence(text=ast.unparse(call)[:200], package=a, file=site.ctx.file, line=call.lineno)]
    loc = model.module_exists(module)
    pkg, file, node, status = model.an.lookup(loc[0], loc[1], name) if loc else ("", "", None, "missing")
    if status == "external":
        return
    if status != "found" or node is None:
        _missing_callee(model, uses, site, call, b, module, name, ev, order, out)
        return
    out.checked += 1
    params, rule, home = model.signature(pkg, file, node)
    if params is None:
        if rule:
            out.add(a, b, f"{module}.{name}(...) keywords not checked", ev, rule, f"{module}.{name}", order)
        return
    ctx = site.ctx
    out.refs += [Ref("keyword", a, b, module, name, ctx.file, call.lineno, ctx.live is True, k)
                 for k in kws if k in params.names]
    missing = [k for k in kws if k not in params.names and not params.var_kw]
    for k in dict.fromkeys(kws):  # binds through **kwargs only: counted, and compared with the stack's baseline
        if k not in params.names and params.var_kw:
            out.add(a, b, f"{name}() has no parameter '{k}' and takes it through **kwargs ({a} passes {k}=; in {b} "
                    f"{model.version(b)} its value reaches whatever the callee passes **kwargs on to)", ev,
                    "kwargs-only", f"{module}.{name}({k})", order)
    if missing:
        ev.append(Evidence(text=f"{name}{params.text}", package=pkg, file=home[0], line=home[1]))
        out.add(a, b, f"TypeError: {name}() got an unexpected keyword argument '{missing[0]}' ({a} passes "
                f"{', '.join(missing)}; {b} {model.version(b)} does not take it)", ev, site.ctx.rule,
                f"{module}.{name}({','.join(missing)})", order)


def _missing_callee(model: ApiModel, uses: Uses, site: Site, call: ast.Call, b: str, module: str, name: str,
                    ev: list[Evidence], order: tuple[int, ...], out: PassResult) -> None:
    """A call with keywords whose callee is not a def or class in B's module. Where B's module does not bind it
    at all, the call cannot work: a finding (under the rule of where it stands, as an import of it would be).
    Where the module binds it in a way the lookup does not follow (a star import, a lazy __getattr__, an
    assignment), its keywords are counted as unchecked ('callee-unresolved')."""
    ctx = site.ctx
    got = model.name_in_module(module, name)
    if got == "yes" or got in RULES:
        out.unchecked["callee-unresolved"] += 1
        return
    out.checked += 1
    where = f"module '{module}' has no attribute '{name}'" if got == "no" else f"No module named '{module}'"
    root = pyast.attribute_chain(call.func)[0]
    info = model.an.info(ctx.a, ctx.file)
    in_try = isinstance(root, ast.Name) and info is not None and any(
        x.in_try for x in info.bindings.get(root.id, []))  # its import has a fallback: the import pass judges it
    rule = ctx.rule or ("caught" if in_try else uses.import_rule(ctx) if ctx.func else None)
    out.add(ctx.a, b, f"{where}: {ctx.a} calls {name}(...) with keywords{ctx.where}, and {b} "
            f"{model.version(b)} does not define it", ev, rule, f"{module}.{name}()", order)


def _callee(model: ApiModel, func: ast.expr, scope: Scope) -> tuple[str, str, str] | None:
    """(B, module, name) of the def or class a call names through A's imports; None when it names none."""
    if isinstance(func, ast.Name) and func.id in scope:
        module, attr = scope[func.id]
        b = model.owner(module)
        return (b, module, attr) if b and attr else None
    if isinstance(func, ast.Attribute):
        hit = model.target(func, scope)
        if hit and len(hit[1]) == 1:
            b = model.owner(hit[0])
            return (b, hit[0], hit[1][0]) if b else None
    return None
