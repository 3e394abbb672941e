"""The replacements pass: what A assigns (or setattr's) onto a module or class attribute of B must fit how B
uses the original.

A class installed in place of B's class must provide what B's code uses on its instances (the replaced-class
check of rlstack.probes.contract, on a case built from what the walk found, with the receivers found in B:
`self.x = Name(...)` in the patched module and the classes that inherit from the one holding it); a function
installed in place of B's function or method must accept the calls B makes to it (positional count and
keywords). A try around the assignment does not catch what breaks later, in B, so only an unknown guard
suppresses these.
"""

from __future__ import annotations

import ast
import re

from rlstack.probes import contract, pyast
from rlstack.probes.discover.findings import PassResult, Ref
from rlstack.probes.discover.model import ApiModel, Params, Scope, params, signature_text
from rlstack.probes.discover.sites import Site, Uses, setattr_assign
from rlstack.probes.model import Evidence

Def = ast.FunctionDef | ast.AsyncFunctionDef


def find(model: ApiModel, uses: Uses) -> PassResult:
    out = PassResult("replacement")
    named = {r for refs in uses.refs.values() for r in refs}  # what any A imports or names by string
    for site, i, node in uses.statement_nodes():
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Attribute):
                    _Replacement(model, site, (site.seq, i), out, named).check(node, t)
        elif isinstance(node, ast.Call) and (fake := setattr_assign(node)) is not None:
            _Replacement(model, site, (site.seq, i), out, named).check(*fake)
    return out


class _Replacement:
    """One assignment onto B, checked: what it replaces, what it installs, and how B uses the original."""

    def __init__(self, model: ApiModel, site: Site, order: tuple[int, ...], out: PassResult,
                 named: set[str]) -> None:
        self.model, self.site, self.order, self.out, self.named = model, site, order, out, named
        self.a = site.ctx.a

    def check(self, node: ast.Assign, t: ast.Attribute) -> None:
        scope = self.site.ctx.scope
        self.target_node: ast.expr = t
        hit = self.model.target(t, scope)
        if hit is None:
            return
        module, path = hit
        b = self.model.owner(module)
        if b is None or b == self.a or b not in self.model.src.wheels:
            return
        self.out.checked += 1
        target = ".".join([module, *path])
        ev = [Evidence(text=f"{self.a} assigns {target} = {ast.unparse(node.value)[:80]}", package=self.a,
                       file=self.site.ctx.file, line=node.lineno)]
        value = self._value(node.value, scope)
        if value is None or not isinstance(value[2], ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if not isinstance(node.value, ast.Name | ast.Attribute):
                return  # a constant or an expression: counted, nothing to compare
            self._add(b, f"{target} replaced by {ast.unparse(node.value)[:60]}", ev, "unresolved", target)
            return
        vpkg, vfile, vnode = value
        loc = self.model.module_exists(module)
        assert loc is not None
        if not self._original(b, module, path, loc, ev):
            return
        if isinstance(vnode, ast.ClassDef) and len(path) == 1:
            self._replaced_class(b, module, path[0], vpkg, vfile, vnode, loc)
        elif isinstance(vnode, ast.FunctionDef | ast.AsyncFunctionDef):
            self._replaced_function(b, module, path, vnode, vpkg, vfile, loc, ev)

    def _original(self, b: str, module: str, path: list[str], loc: tuple[str, str], ev: list[Evidence]) -> bool:
        """Whether B still defines what the assignment replaces (a module attribute, or a class's method or
        attribute); a reference to mutate when it does. When it does not, the patch replaces nothing B uses (B
        renamed or moved it, and A's fix silently stops applying): a finding, unless some A imports or names
        the target (then it is a shim that adds the name on purpose, and those reads are checked instead)."""
        target = ".".join([module, *path])
        m = self.model
        if len(path) == 1:
            there = m.name_in_module(module, path[0]) != "no"
        elif len(path) == 2:
            opkg, ofile, onode, status = m.an.lookup(loc[0], loc[1], path[0])
            if status == "found" and isinstance(onode, ast.ClassDef):
                members, external = m.an.mro_members(opkg, ofile, onode)
                there = path[1] in members or bool(external) or path[1].startswith("__")
            else:
                there = status != "missing" or m.name_in_module(module, path[0]) != "no"
        else:
            return True
        ctx = self.site.ctx
        if there:
            self.out.refs.append(Ref("replacement", self.a, b, module, ".".join(path), ctx.file, ev[0].line or 0,
                                     ctx.live is True))
            return True
        if target in self.named or ctx.live is False:
            return False
        if len(path) == 1:  # assigning a module attribute B lacks adds it: nothing fails, and nothing in B reads it
            rule: str | None = "adds-name"
        else:  # `Cls.meth = f` where B has no Cls raises AttributeError there, unless the name is A's fallback
            root = pyast.attribute_chain(self.target_node)[0]
            info = m.an.info(self.a, ctx.file)
            in_try = isinstance(root, ast.Name) and info is not None and any(
                x.in_try for x in info.bindings.get(root.id, []))
            rule = "caught" if ctx.caught or in_try else "guard-unknown" if ctx.live is None else None
        self._add(b, f"{self.a} replaces {target}, which {b} {m.version(b)} does not define: the patch installs a "
                     f"name nothing in {b} uses (renamed or moved there), so what it fixes is no longer fixed",
                  ev, rule, target)
        return False

    def _add(self, b: str, message: str, ev: list[Evidence], rule: str | None, key: str) -> None:
        self.out.add(self.a, b, message, ev, rule, key, self.order)

    def _value(self, value: ast.expr, scope: Scope) -> tuple[str, str, ast.AST] | None:
        """The class or function of A an assigned value names (module-level or imported inside the function)."""
        if not isinstance(value, ast.Name):
            return None
        name, an = value.id, self.model.an
        if name in scope:
            module, attr = scope[name]
            loc = self.model.module_exists(module)
            if loc and attr:
                pkg, file, node, status = an.lookup(loc[0], loc[1], attr)
                return (pkg, file, node) if status == "found" and node is not None else None
            return None
        pkg, file, node, status = an.lookup(self.a, self.site.ctx.file, name)
        if status == "found" and node is not None:
            return pkg, file, node
        tree = an.tree(self.a, self.site.ctx.file)
        for n in pyast.walk(tree) if tree else []:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == name:
                return self.a, self.site.ctx.file, n
        return None

    def _replaced_class(self, b: str, module: str, name: str, vpkg: str, vfile: str, vnode: ast.ClassDef,
                        loc: tuple[str, str]) -> None:
        opkg, ofile, onode, status = self.model.an.lookup(loc[0], loc[1], name)
        if status != "found" or not isinstance(onode, ast.ClassDef):
            return
        receivers = self._receivers(loc, name)
        if not receivers:
            return
        a = self.a
        case = contract.Case(
            id=f"discovered-{name}", kind="replaced_class", wall=None, summary="discovered", requires=[a, b],
            fix=None, replacement=contract.ClassRef(package=vpkg, file=vfile, **{"class": vnode.name}),
            original=contract.ClassRef(package=opkg, file=ofile, **{"class": onode.name}),
            installed_at=[contract.InstallSite(package=a, file=self.site.ctx.file, target=f"{module}.{name}")],
            used_by=[contract.UseSite(package=b, files=files, receiver=r) for r, files in receivers.items()])
        res = contract.check_replaced_class(case, self.model.an)
        if res.status == "fail":  # a try around the assignment does not catch what breaks later, in B
            self._add(b, res.reason, res.evidence, "guard-unknown" if self.site.ctx.live is None else None,
                      f"{module}.{name}")

    def _receivers(self, loc: tuple[str, str], name: str) -> dict[str, list[str]]:
        """{receiver source: files} where B keeps an instance of `name`: `self.x = name(...)` in the patched
        module, used there and in B's classes that inherit from the class holding it."""
        tree = self.model.an.tree(*loc)
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
        for n in sorted(self.model.src.name_set(package)):
            if n.endswith(".py"):
                text = self.model.src.read(package, n) or ""
                if cls in text and rx.search(text):
                    out.append(n)
        return out

    def _replaced_function(self, b: str, module: str, path: list[str], vnode: Def, vpkg: str, vfile: str,
                           loc: tuple[str, str], ev: list[Evidence]) -> None:
        tree = self.model.an.tree(*loc)
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
        p = params(vnode)
        for call in calls:
            bad = _incompatible(p, call, skip_self=method)
            if bad:
                self._add(b, f"TypeError: {vnode.name}() {bad} ({b} calls {'.'.join(path)} at {loc[1]}:{call.lineno}; "
                             f"{self.a} installs {vnode.name} from {vfile}:{vnode.lineno} in its place)",
                          [*ev, Evidence(text=ast.unparse(call)[:160], package=b, file=loc[1], line=call.lineno),
                           Evidence(text=f"def {vnode.name}{signature_text(vnode)}", package=vpkg,
                                    file=vfile, line=vnode.lineno)],
                          self.site.ctx.rule, f"{module}.{'.'.join(path)}")
                return


def _incompatible(p: Params, call: ast.Call, *, skip_self: bool) -> str | None:
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
