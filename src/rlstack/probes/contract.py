"""Contract probes: static checks, at the locked versions, of what one package assumes about another.

Two general kinds, with the cases as data in contracts.yaml:

- `replaced_class`: package A installs its class in place of package B's class (monkeypatching). Every
  attribute that B's code uses on instances of it, and that B's own class provides, must exist on A's
  class, its bases resolved across files and packages the way Python would import them.
- `pasted_function`: a function's source is pasted (inspect.getsource + exec/template) into another
  module. Every free name it loads must be bound in that module: the template's own imports and
  definitions, the other pasted sources, and the module its names are imported from.

Sources come from the locked wheels (rlstack.probes.wheels), parsed with ast, never imported.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rlstack.core.pkgnames import normalize
from rlstack.probes import pyast
from rlstack.probes.model import Evidence, ProbeResult
from rlstack.probes.wheels import SourceSet

CONTRACTS_FILE = Path(__file__).with_name("contracts.yaml")
# Parsed modules shared by every Analyzer of the process (a --suggest search analyses the same vLLM files
# against dozens of unsloth releases); nothing mutates a tree (pyast.walk(live=True) prunes without copying).
_TREES: dict[tuple[str, str], ast.Module | None] = {}


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClassRef(_M):
    package: str
    file: str
    name: str = Field(alias="class")


class InstallSite(_M):
    package: str
    file: str
    target: str = Field(description="dotted name assigned, e.g. vllm.lora.worker_manager.LRUCacheWorkerLoRAManager")


class CallSite(_M):
    package: str
    file: str
    call: str = Field(description="name of the function whose call switches the replacement on, e.g. patch_vllm")


class UseSite(_M):
    package: str
    files: list[str]
    receiver: str = Field(description="source text of the expression the class's instance lives in")


class FunctionRef(_M):
    package: str
    file: str
    name: str


class PasteSite(_M):
    package: str
    file: str
    container: str = Field(description="the list the source is appended to, e.g. RL_PRE_ITEMS[\"grpo_trainer\"]")


class NamespacePart(_M):
    package: str
    file: str
    template: str | None = Field(None, description="a module-level code template (str.format) in `file`")
    appended: str | None = Field(None, description="names whose source is appended to this list in `file`")


class Case(_M):
    id: str
    kind: Literal["replaced_class", "pasted_function"]
    wall: str | None = Field(description="the wall id (signatures.yaml); None for a discovered contract")
    summary: str
    requires: list[str]
    fix: str | None
    # replaced_class
    replacement: ClassRef | None = None
    original: ClassRef | None = None
    installed_at: list[InstallSite] = Field(default_factory=list)
    activated_by: list[CallSite] = Field(default_factory=list)
    used_by: list[UseSite] = Field(default_factory=list)
    # pasted_function
    function: FunctionRef | None = None
    pasted_at: PasteSite | None = None
    namespace: list[NamespacePart] = Field(default_factory=list)


def load_cases(path: Path = CONTRACTS_FILE) -> list[Case]:
    data = yaml.safe_load(path.read_text()) or {}
    return [Case.model_validate(c) for c in data.get("cases", [])]


def case_packages(case: Case) -> set[str]:
    return {normalize(p) for p in case.requires}


class Analyzer:
    """ast views of files in a SourceSet, with import-aware class lookup across files."""

    def __init__(self, sources: SourceSet) -> None:
        self.src = sources
        self._trees: dict[tuple[str, str], ast.Module | None] = {}
        self._infos: dict[tuple[str, str], pyast.ModuleInfo] = {}

    def tree(self, package: str, file: str) -> ast.Module | None:
        key = (normalize(package), file)
        if key not in self._trees:
            if not self.src.has(package):
                self._trees[key] = None
                return None
            shared = (self.src.reader(package).key, file)  # the wheel's content (sha256), then the member
            if shared not in _TREES:
                text = self.src.read(package, file)
                try:
                    with warnings.catch_warnings():  # a library's invalid escape is not ours to report
                        warnings.simplefilter("ignore")
                        tree = pyast.parse(text) if text is not None else None
                except SyntaxError:
                    tree = None
                if len(_TREES) > 4000:
                    _TREES.clear()
                _TREES[shared] = tree
            self._trees[key] = _TREES[shared]
        return self._trees[key]

    def info(self, package: str, file: str) -> pyast.ModuleInfo | None:
        tree = self.tree(package, file)
        if tree is None:
            return None
        key = (normalize(package), file)
        if key not in self._infos:
            self._infos[key] = pyast.module_info(tree, pyast.relative_base(file))
        return self._infos[key]

    def lookup(self, package: str, file: str, name: str, depth: int = 0) -> tuple[str, str, ast.AST | None, str]:
        """Resolve a module-level name like an import would: (package, file, node, status) where status is
        'found', 'external' (lives in a package outside the set) or 'missing'."""
        info = self.info(package, file)
        if info is None or depth > 8:
            return package, file, None, "missing"
        for b in info.bindings.get(name, []):
            if b.kind in ("class", "def"):
                return package, file, b.node, "found"
            if b.kind == "import" and b.module is not None:
                owner = self.src.package_of(b.module)
                if owner is None:
                    return package, file, None, "external"
                if b.attr is None:
                    continue  # `import a.b` binds a module, not a class
                loc = self.src.module_file(b.module)
                if loc is None:
                    sub = self.src.module_file(f"{b.module}.{b.attr}")
                    if sub is not None:
                        return sub[0], sub[1], None, "found"
                    continue  # ImportError at runtime: the next binding (an except-branch fallback) wins
                res = self.lookup(loc[0], loc[1], b.attr, depth + 1)
                if res[3] != "missing":
                    return res
            if b.kind == "assign":
                return package, file, b.node, "found"
        return package, file, None, "missing"

    def _home(self, package: str, file: str, name: str) -> tuple[str, str, str]:
        """Where a module-level name is really defined: follows `from m import x as name`."""
        info = self.info(package, file)
        for b in (info.bindings.get(name, []) if info else []):
            if b.kind == "import" and b.attr and b.module:
                loc = self.src.module_file(b.module)
                if loc:
                    return loc[0], loc[1], b.attr
        return package, file, name

    def source_name(self, package: str, file: str, name: str, depth: int = 0) -> str:
        """The def name inside the source `inspect.getsource(name)` returns: pasting that source binds this
        name, not the alias. Follows imports, `a = b` and registry lookups `REG["key"]` / `REG.get("key")`."""
        info = self.info(package, file)
        if info is None or depth > 6:
            return name
        for b in info.bindings.get(name, []):
            if b.kind in ("def", "class"):
                return name
            if b.kind == "import" and b.attr and b.module:
                loc = self.src.module_file(b.module)
                return self.source_name(loc[0], loc[1], b.attr, depth + 1) if loc else b.attr
            if b.kind == "assign" and isinstance(b.node, ast.Assign):
                v = b.node.value
                if isinstance(v, ast.Name):
                    return self.source_name(package, file, v.id, depth + 1)
                reg_key = _registry_lookup(v)
                if reg_key:
                    hp, hf, reg = self._home(package, file, reg_key[0])
                    tree = self.tree(hp, hf)
                    target = _registry_value(tree, reg, reg_key[1]) if tree else None
                    if target:
                        return self.source_name(hp, hf, target, depth + 1)
        return name

    def mro_members(self, package: str, file: str, cls: ast.ClassDef) -> tuple[dict[str, Evidence], list[str]]:
        """{attr: where it is defined} over the class and its resolvable bases; plus bases that live outside
        the set (their attributes cannot be checked)."""
        members: dict[str, Evidence] = {}
        external: list[str] = []
        seen: set[tuple[str, str, str]] = set()

        def walk(pkg: str, f: str, c: ast.ClassDef) -> None:
            if (pkg, f, c.name) in seen:
                return
            seen.add((pkg, f, c.name))
            for attr, line in pyast.class_members(c).items():
                members.setdefault(attr, Evidence(text=f"{c.name}.{attr}", package=pkg, file=f, line=line))
            for base in c.bases:
                name = ast.unparse(base).split(".")[-1]
                if name in ("object", "Generic", "ABC", "Protocol"):
                    continue
                bp, bf, node, status = self.lookup(pkg, f, name)
                if status == "found" and isinstance(node, ast.ClassDef):
                    walk(bp, bf, node)
                else:
                    external.append(ast.unparse(base))

        walk(package, file, cls)
        return members, external

    def find_class(self, ref: ClassRef) -> ast.ClassDef | None:
        tree = self.tree(ref.package, ref.file)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == ref.name:
                return node
        return None


def _registry_lookup(v: ast.expr) -> tuple[str, str] | None:
    """('REG', 'key') for `REG["key"]` or `REG.get("key")`."""
    if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name) and isinstance(v.slice, ast.Constant):
        return v.value.id, str(v.slice.value)
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "get" and \
            isinstance(v.func.value, ast.Name) and v.args and isinstance(v.args[0], ast.Constant):
        return v.func.value.id, str(v.args[0].value)
    return None


def _registry_value(tree: ast.Module, reg: str, key: str) -> str | None:
    """The name last stored under `reg[key] = name` in a module."""
    return pyast.registry_values(tree).get((reg, key))


def _dotted(file: str) -> str:
    mod = file[:-3] if file.endswith(".py") else file
    mod = mod[: -len("/__init__")] if mod.endswith("/__init__") else mod
    return mod.replace("/", ".")


def _skip(case: Case, reason: str, evidence: list[Evidence] | None = None) -> ProbeResult:
    return ProbeResult(id=f"contract:{case.id}", layer="contract", status="skip", reason=reason,
                       evidence=evidence or [])


def check_replaced_class(case: Case, an: Analyzer) -> ProbeResult:
    assert case.replacement and case.original
    pid = f"contract:{case.id}"
    ev: list[Evidence] = []
    for site in case.installed_at:
        tree = an.tree(site.package, site.file)
        lines = pyast.assignment_lines(tree, site.target) if tree else []
        if lines:
            ev.append(Evidence(text=f"installs {case.replacement.package}'s class as {site.target}",
                               package=site.package, file=site.file, line=lines[0]))
    if not ev:
        return _skip(case, f"{case.replacement.package} does not install its {case.replacement.name} at this "
                           "version: contract does not apply")
    for act in case.activated_by:
        tree = an.tree(act.package, act.file)
        calls = pyast.call_lines(tree, act.call) if tree else []
        if calls:
            ev.append(Evidence(text=f"calls {act.call}() (which installs it)", package=act.package, file=act.file,
                               line=calls[0]))
    repl = an.find_class(case.replacement)
    orig = an.find_class(case.original)
    if repl is None:
        return _skip(case, f"class {case.replacement.name} not found in {case.replacement.file}")
    if orig is None:
        return _skip(case, f"class {case.original.name} not found in {case.original.file}")
    repl_members, repl_ext = an.mro_members(case.replacement.package, case.replacement.file, repl)
    orig_members, _ = an.mro_members(case.original.package, case.original.file, orig)
    uses: dict[str, Evidence] = {}
    for use in case.used_by:
        for f in use.files:
            tree = an.tree(use.package, f)
            if tree is None:
                continue
            for attr, lines in pyast.attribute_uses(tree, use.receiver).items():
                uses.setdefault(attr, Evidence(text=f"uses {use.receiver}.{attr}", package=use.package, file=f,
                                               line=min(lines)))
    if not uses:
        return _skip(case, f"no use of {case.used_by[0].receiver if case.used_by else '?'} found: contract "
                           "does not apply", ev)
    missing = sorted(a for a in uses if a in orig_members and a not in repl_members)
    cls_ev = Evidence(text=f"class {repl.name} (bases: {', '.join(ast.unparse(b) for b in repl.bases) or '-'})",
                      package=case.replacement.package, file=case.replacement.file, line=repl.lineno)
    if missing:
        for a in missing:
            ev.append(uses[a])
            ev.append(Evidence(text=f"{case.original.name}.{a} exists on the class it replaces",
                               package=orig_members[a].package, file=orig_members[a].file, line=orig_members[a].line))
        ev.append(cls_ev)
        names = ", ".join(missing)
        reason = (f"{case.replacement.package}'s {repl.name} replaces {case.original.package}'s but lacks {names}: "
                  f"'{repl.name}' object has no attribute '{missing[0]}'")
        if repl_ext:
            reason += f" (unless bases outside the wheels provide it: {', '.join(repl_ext)})"
        rv, ov = an.src.version(case.replacement.package), an.src.version(case.original.package)
        fix = (f"{case.replacement.package} {rv or '(as locked)'}'s {repl.name} lacks {names}, which "
               f"{case.original.package} {ov or '(as locked)'} calls: move {case.replacement.package} to a release "
               f"whose {repl.name} defines {'them' if len(missing) > 1 else 'it'}, or {case.original.package} to one "
               "that does not call it (invoke probe --stack STACK --suggest bisects the releases for the closest)")
        return ProbeResult(id=pid, layer="contract", status="fail", reason=reason, evidence=ev, signature=case.wall,
                           fix=fix + (f"; {case.fix}" if case.fix else ""))
    checked = sorted(a for a in uses if a in orig_members)
    return ProbeResult(id=pid, layer="contract", status="pass",
                       reason=f"{repl.name} provides all {len(checked)} attributes {case.original.package} uses",
                       evidence=[*ev, cls_ev])


def namespace_names(part: NamespacePart, an: Analyzer) -> tuple[set[str], list[Evidence], list[str]]:
    """Names a namespace part binds, evidence of where, and star imports it could not expand."""
    tree = an.tree(part.package, part.file)
    if tree is None:
        return set(), [], []
    names: set[str] = set()
    unknown: list[str] = []
    if part.template:
        found = pyast.find_string_assignment(tree, part.template)
        if found is None:
            return set(), [], []
        text, line = found
        code, placeholders = pyast.template_code(text)
        pasted = pyast.getsource_targets(tree)
        for ph in placeholders:
            if ph in pasted:
                names.add(an.source_name(part.package, part.file, pasted[ph]))
        info = pyast.module_info(pyast.parse_lenient(code))
        ev = [Evidence(text=f"code template {part.template} ({len(placeholders)} pasted sources)",
                       package=part.package, file=part.file, line=line)]
    elif part.appended:
        for name, _line in pyast.appended_sources(tree, part.appended):
            names.add(an.source_name(part.package, part.file, name))
        for code, _line in pyast.appended_code(tree, part.appended):
            names |= set(pyast.module_info(pyast.parse_lenient(code)).bindings)
        return names, [], []
    else:
        info = pyast.module_info(tree, pyast.relative_base(part.file))
        ev = []
    names |= set(info.bindings)
    for star in info.star_imports:
        std = pyast.stdlib_names(star)
        if std is not None:
            names |= std
            continue
        loc = an.src.module_file(star)
        sub = an.info(*loc) if loc else None
        if sub is not None:
            names |= {n for n in sub.bindings if not n.startswith("_")}
        else:
            unknown.append(star)
    return names, ev, unknown


def check_pasted_function(case: Case, an: Analyzer) -> ProbeResult:
    assert case.function
    pid = f"contract:{case.id}"
    fn_ref = case.function
    ev: list[Evidence] = []
    if case.pasted_at:
        tree = an.tree(case.pasted_at.package, case.pasted_at.file)
        if not (pyast.appended_sources(tree, case.pasted_at.container) if tree else []):
            return _skip(case, f"{case.pasted_at.package} does not paste sources into {case.pasted_at.container} "
                               "at this version: contract does not apply")
        pasted = {an.source_name(case.pasted_at.package, case.pasted_at.file, n): ln
                  for n, ln in (pyast.appended_sources(tree, case.pasted_at.container) if tree else [])}
        if fn_ref.name not in pasted:
            return _skip(case, f"{fn_ref.name} is not pasted into {case.pasted_at.container} at this version")
        line = pasted[fn_ref.name]
        ev.append(Evidence(text=f"pastes the source of {fn_ref.name} into the generated trainer module",
                           package=case.pasted_at.package, file=case.pasted_at.file, line=line))
    tree = an.tree(fn_ref.package, fn_ref.file)
    fn = next((n for n in (tree.body if tree else []) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef |
                                                                        ast.ClassDef) and n.name == fn_ref.name), None)
    if fn is None:
        return _skip(case, f"{fn_ref.name} not found in {fn_ref.package}: {fn_ref.file}")
    available: set[str] = {fn_ref.name}
    unknown: list[str] = []
    for part in case.namespace:
        names, part_ev, part_unknown = namespace_names(part, an)
        available |= names
        ev += part_ev
        unknown += part_unknown
    free = pyast.function_free_names(fn)
    missing = [u for u in free if u.name not in available]
    if missing and not unknown:
        for u in missing:
            ev.insert(0, Evidence(text=f"NameError: name '{u.name}' is not defined: {fn_ref.name} uses it and the "
                                       "generated module does not bind it",
                                  package=fn_ref.package, file=fn_ref.file, line=u.line))
        reason = (f"{fn_ref.name} from {fn_ref.package} is pasted into a module that does not bind "
                  + ", ".join(f"{u.name} (line {u.line})" for u in missing)
                  + "; NameError when that line runs: " + ", ".join(f"name '{u.name}' is not defined" for u in missing))
        paster = case.pasted_at.package if case.pasted_at else "the pasting package"
        fix = (f"{paster} {an.src.version(paster) or '(as locked)'} pastes {fn_ref.package} "
               f"{an.src.version(fn_ref.package) or '(as locked)'}'s {fn_ref.name} into a module that lacks "
               f"{', '.join(u.name for u in missing)}: move {paster} to a release whose generated module binds "
               f"{'them' if len(missing) > 1 else 'it'}, or {fn_ref.package} to one whose {fn_ref.name} does not use "
               f"{'them' if len(missing) > 1 else 'it'} (invoke probe --stack STACK --suggest bisects for the closest)")
        return ProbeResult(id=pid, layer="contract", status="fail", reason=reason, evidence=ev, signature=case.wall,
                           fix=fix + (f"; {case.fix}" if case.fix else ""))
    if missing:
        return _skip(case, f"cannot decide: star imports from {', '.join(unknown)} are outside the wheels", ev)
    return ProbeResult(id=pid, layer="contract", status="pass",
                       reason=f"all {len(free)} free names of {fn_ref.name} are bound where it is pasted",
                       evidence=[Evidence(text=f"def {fn_ref.name}", package=fn_ref.package, file=fn_ref.file,
                                          line=fn.lineno), *ev])


CHECKS: dict[str, Any] = {"replaced_class": check_replaced_class, "pasted_function": check_pasted_function}


def run_case(case: Case, sources: SourceSet) -> ProbeResult:
    return CHECKS[case.kind](case, Analyzer(sources))
