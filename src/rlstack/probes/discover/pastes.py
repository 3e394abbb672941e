"""The pastes pass: every function whose source A pastes (`container.append(inspect.getsource(f))`) into a
code template must find its free names in what that template's module binds: the template's own code, the
other sources pasted with it, and the module the container's key names (`RL_PRE_ITEMS["grpo_trainer"]` is
exec'd beside trl.trainer.grpo_trainer's names).

Each paste becomes a discovered case of rlstack.probes.contract's pasted-function check. This pass reads A's
files whole (a paste is found by its container, not by a statement on a live path), so it uses the walk only
for which A packages have sources and where their findings go in the rendered order.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from rlstack.probes import contract, pyast
from rlstack.probes.discover.findings import PassResult
from rlstack.probes.discover.model import ApiModel
from rlstack.probes.discover.sites import Uses, module_imports


def find(model: ApiModel, uses: Uses) -> PassResult:
    out = PassResult("paste")
    for a, end in uses.end.items():
        _Pastes(model, a, end, out).run()
    return out


class _Pastes:
    """The pastes of one A package."""

    def __init__(self, model: ApiModel, a: str, end: int, out: PassResult) -> None:
        self.model, self.an, self.a, self.end, self.out = model, model.an, a, end, out
        self.files = sorted(n for n in model.src.names(a) if n.endswith(".py"))

    def run(self) -> None:
        """Every container A appends getsource() output to, the template that consumes it, and a check per
        pasted function."""
        a = self.a
        for cont, f in sorted(self._containers().items()):
            m = re.fullmatch(r'(\w+)\["(\w+)"\]', cont)
            if not m:
                continue
            template = self._template_for(m[1])
            if template is None:
                continue
            tfile, tname = template
            parts = [contract.NamespacePart(package=a, file=tfile, template=tname, appended=None),
                     contract.NamespacePart(package=a, file=f, template=None, appended=cont)]
            keymod = self._key_module(m[2])
            if keymod:
                parts.append(contract.NamespacePart(package=keymod[0], file=keymod[1], template=None, appended=None))
            tree = self.an.tree(a, f)
            for name, _line in pyast.appended_sources(tree, cont) if tree else []:
                home = self._def_home(f, name)
                if home is not None:
                    self._check(f, cont, parts, *home)

    def _check(self, f: str, cont: str, parts: list[contract.NamespacePart], hpkg: str, hfile: str,
               fname: str) -> None:
        self.out.checked += 1
        case = contract.Case(
            id=f"discovered-paste-{fname}", kind="pasted_function", wall=None, summary="discovered",
            requires=[self.a, hpkg], fix=None, function=contract.FunctionRef(package=hpkg, file=hfile, name=fname),
            pasted_at=contract.PasteSite(package=self.a, file=f, container=cont), namespace=parts)
        res = contract.check_pasted_function(case, self.an)
        order = (self.end, len(self.out.findings))
        if res.status == "fail":
            self.out.add(self.a, hpkg, res.reason, res.evidence, None, f"{cont}:{fname}", order)
        elif res.status == "skip" and "cannot decide" in res.reason:
            self.out.add(self.a, hpkg, res.reason, res.evidence, "star-from-compiled", f"{cont}:{fname}", order)

    def _containers(self) -> dict[str, str]:
        """{container expression: the first file that appends getsource() output to it}."""
        containers: dict[str, str] = {}
        for f in self.files:
            text = self.model.src.read(self.a, f) or ""
            if "getsource" not in text or ".append(" not in text:
                continue
            tree = self.an.tree(self.a, f)
            for node in pyast.walk(tree) if tree else []:
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr == "append" and isinstance(node.func.value, ast.Subscript) and node.args:
                    cont = ast.unparse(node.func.value).replace("'", '"')
                    if pyast.appended_sources(tree, cont):  # type: ignore[arg-type]
                        containers.setdefault(cont, f)
        return containers

    def _template_for(self, base: str) -> tuple[str, str] | None:
        """(file, template name) of the code template whose .format(...) receives the joined container."""
        for f in self.files:
            text = self.model.src.read(self.a, f) or ""
            if ".format(" not in text or base not in text:
                continue
            tree = self.an.tree(self.a, f)
            for fn in pyast.nodes(tree, ast.FunctionDef) if tree else []:
                joined = {t.id for n in pyast.walk(fn) if isinstance(n, ast.Assign) and base in ast.unparse(n.value)
                          and ".join(" in ast.unparse(n.value) for t in n.targets if isinstance(t, ast.Name)}
                for n in pyast.walk(fn):
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "format" \
                            and isinstance(n.func.value, ast.Name) and any(
                                isinstance(k.value, ast.Name) and k.value.id in joined for k in n.keywords):
                        tname = n.func.value.id
                        for tf in [f, *self.files]:
                            tt = self.an.tree(self.a, tf)
                            if tt is not None and pyast.find_string_assignment(tt, tname):
                                return tf, tname
        return None

    def _key_module(self, key: str) -> tuple[str, str] | None:
        """A locked module named like the container's key (its names are exec'd beside the pasted code)."""
        for pkg in sorted(self.model.src.wheels):
            for n in self.model.src.name_set(pkg):
                if n.endswith(f"/{key}.py") and n.count("/") <= 3:
                    return pkg, n
        return None

    def _def_home(self, f: str, name: str) -> tuple[str, str, str] | None:
        """Where the def whose source `inspect.getsource(name)` returns lives: (package, file, def name)."""
        fname = self.an.source_name(self.a, f, name)
        for pkg, file in self._candidates(f, name):
            tree = self.an.tree(pkg, file)
            if tree and any(isinstance(n, ast.FunctionDef) and n.name == fname for n in tree.body):
                return pkg, file, fname
        return None

    def _candidates(self, f: str, name: str) -> Iterator[tuple[str, str]]:
        """The files a pasted name may be defined in: this one, where its import or registry entry points,
        and every module this file imports."""
        a, exists = self.a, self.model.module_exists
        yield a, f
        info = self.an.info(a, f)
        for bnd in info.bindings.get(name, []) if info else []:
            if bnd.kind == "import" and bnd.module and (loc := exists(bnd.module)):
                yield loc
            if bnd.kind == "assign" and isinstance(bnd.node, ast.Assign):
                reg = contract._registry_lookup(bnd.node.value)
                if reg:
                    hp, hf, _ = self.an._home(a, f, reg[0])
                    yield hp, hf
                    hinfo = self.an.info(hp, hf)
                    for b2 in hinfo.bindings.get(reg[0], []) if hinfo else []:
                        if b2.kind == "import" and b2.module and (loc := exists(b2.module)):
                            yield loc
        for module, _ in module_imports(self.an.tree(a, f) or ast.Module(body=[], type_ignores=[]),
                                        pyast.relative_base(f)).values():
            loc = exists(module)
            if loc:
                yield loc
