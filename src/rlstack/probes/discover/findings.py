"""What discovery's passes report, in one typed shape: a Finding per possible break (with the rule that
suppresses it, if one does), a PassResult per pass, and Discovered, everything one run found.

One shape for all four passes is what lets one renderer (rlstack.probes.discover.render) serve them all, and
what lets a finding that no rule covers be told from one that a rule covers without knowing which pass made it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from rlstack.probes.model import Evidence

if TYPE_CHECKING:  # the walk's type only: sites does not import this module's dependents
    from rlstack.probes.discover.sites import Uses

Kind = Literal["replacement", "import", "paste", "keyword"]
KINDS: tuple[Kind, ...] = ("replacement", "import", "paste", "keyword")

# Suppression rules: a possible finding that one of these covers is counted under it, with this reason.
RULES: dict[str, str] = {
    "caught": "the statement sits in try/except that catches the failure (ImportError, AttributeError, "
              "TypeError, Exception or bare) and the handler is a working alternative (another import of the name, "
              "a shim with a body, None or a flag the code tests): a missing name takes the fallback, and the "
              "handler's own imports are checked as the live path",
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
                          "feature flag) in ways a static read cannot follow: excused where A does not surely call "
                          "the function from module level, a class body, a public function or one it reaches so "
                          "(sites.reached_names), or where the read sits in an and/or operand after the first, a "
                          "branch of `x if c else y` or a comprehension's body; module-level ones, and those in "
                          "functions A reaches, are checked",
    "installed-by-a": "A itself assigns this name onto B's module on a path that runs in this stack (not under a "
                      "guard false here, not later in the same module than the read): a monkeypatch that adds it; "
                      "whether a patch in a function runs before the read depends on the order A calls them, which "
                      "a static read does not follow",
    "adds-name": "A assigns a module attribute that B's module does not define: the assignment adds the name (a "
                 "shim kept for other versions of B), nothing fails, and nothing in B reads it; deleting a name "
                 "that A assigns is an equivalent change for the same reason",
    "unreferenced-module": "no source of A imports or names this module (a script, a shipped cache of generated "
                           "code that A rewrites before importing): no import path reaches it",
    "kwargs-only": "the callee has no parameter of this name but takes **kwargs: the call binds, and where the "
                   "value goes is up to the callee; recorded so that a parameter B renames (the keyword then lands "
                   "in **kwargs, and its value no longer reaches the parameter) shows against the stack's baseline",
}

# What a stub fallback is: the handler of a failing try that binds the missing name to a placeholder (`class X:
# pass`, a def whose body only raises). It is not a rule: a stub taken on this lock is a finding, because the
# failure only moves to where the name is used (a LoRARequest without fields, a loader that raises).
STUB = "stub fallback"

# Names built at run time (eval/exec of f-strings, importlib.import_module) that could not be resolved from
# source: counted per reason, never silently dropped.
UNCHECKED: dict[str, str] = {
    "runtime-name": "a name built at run time (eval/exec/import_module of a string) from values the source does "
                    "not pin down: not checked",
    "callee-unresolved": "a call with keywords to a name B's module binds in a way the sources do not lead to a def "
                         "(a star import from a compiled module, a lazy __getattr__, an assignment): keywords not "
                         "checked",
}

# {A: {(B module, name): (file, line)}}: the names each A assigns onto B's modules (rlstack.probes.discover.sites)
Installs = Mapping[str, Mapping[tuple[str, str], tuple[str, int]]]


@dataclass
class Finding:
    """One possible break of a contract between A and B. `evidence[0]` is always A's site (file:line); a rule
    id in `rule` means it is counted as suppressed, with RULES[rule] as the reason, instead of reported."""

    kind: Kind
    a: str
    b: str
    message: str
    evidence: list[Evidence]
    rule: str | None = None  # a suppression rule id, or None for a real finding
    key: str = ""  # stable id part
    target: tuple[str, str] | None = None  # (B module, name) an import finding looks for
    # where the walk met it (rlstack.probes.discover.sites.Site.seq, then the node's place in its statement):
    # the passes run one after another, and their findings merge back into source order by this, so which
    # message a repeated break is rendered with does not depend on which pass ran first
    order: tuple[int, ...] = ()
    # under 'caught': what the catching handler binds the missing name to instead (sites.Fallback), if it does
    fallback: tuple[str, int, str] | None = None

    @property
    def id(self) -> str:
        """`A->B:kind:key`: its probe id after `discovered:`, and its key in a stack's probe baseline (no line
        numbers: stable across releases of A)."""
        return f"{self.a}->{self.b}:{self.kind}:{self.key}"


@dataclass(frozen=True, slots=True)
class Ref:
    """One cross-package reference a pass checked: A's site (file, line, whether it runs on this lock), and its
    target in B: a name in a module (`name` None: the module itself), a keyword of a callee (`keyword`), or the
    original a replacement stands in for. What a mutation of B's source deletes or renames (bench/probe_mutation)."""

    kind: Kind
    a: str
    b: str
    module: str
    name: str | None
    file: str
    line: int
    live: bool  # on a path that runs in this stack (not under an unknown guard)
    keyword: str | None = None


@dataclass
class PassResult:
    """What one pass returns: how many contracts of its kind it checked, and what it found."""

    kind: Kind
    checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    refs: list[Ref] = field(default_factory=list)
    unchecked: Counter[str] = field(default_factory=Counter)  # UNCHECKED reason -> how many

    def add(self, a: str, b: str, message: str, evidence: list[Evidence], rule: str | None, key: str,
            order: tuple[int, ...], target: tuple[str, str] | None = None,
            fallback: tuple[str, int, str] | None = None) -> None:
        self.findings.append(Finding(self.kind, a, b, message, evidence, rule, key, target, order, fallback))


@dataclass
class Discovered:
    """Everything one discovery run found, in source order: what the renderer turns into probe results."""

    a_set: list[str]
    findings: list[Finding]
    checked: Counter[str]
    installs: Installs
    refs: list[Ref] = field(default_factory=list)
    unchecked: Counter[str] = field(default_factory=Counter)
    uses: Uses | None = None  # the walk (rlstack.probes.discover.sites.Uses) a rerun over changed B sources reuses

    def suppressed(self) -> Counter[str]:
        return Counter(f.rule for f in self.findings if f.rule)

    def suppressed_by_pair(self) -> dict[str, Counter[str]]:
        """{'A->B': {rule: count}} for every suppressed finding: which package pairs each rule excuses."""
        out: dict[str, Counter[str]] = {}
        for f in self.findings:
            if f.rule:
                out.setdefault(f"{f.a}->{f.b}", Counter())[f.rule] += 1
        return dict(sorted(out.items()))

    def installed_elsewhere(self, a: str, target: tuple[str, str]) -> list[tuple[str, str, int]]:
        """(package, file, line) where another of the A packages assigns this name onto B's module: a name B
        lacks but a monkeypatch adds, so A's import works only when that package ran first."""
        return [(a2, *sites[target]) for a2, sites in sorted(self.installs.items()) if a2 != a and target in sites]
