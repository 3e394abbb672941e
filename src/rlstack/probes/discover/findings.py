"""What discovery's passes report, in one typed shape: a Finding per possible break (with the rule that
suppresses it, if one does), a PassResult per pass, and Discovered, everything one run found.

One shape for all four passes is what lets one renderer (rlstack.probes.discover.render) serve them all, and
what lets a finding that no rule covers be told from one that a rule covers without knowing which pass made it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from rlstack.probes.model import Evidence

Kind = Literal["replacement", "import", "paste", "keyword"]
KINDS: tuple[Kind, ...] = ("replacement", "import", "paste", "keyword")

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


@dataclass
class PassResult:
    """What one pass returns: how many contracts of its kind it checked, and what it found."""

    kind: Kind
    checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    def add(self, a: str, b: str, message: str, evidence: list[Evidence], rule: str | None, key: str,
            order: tuple[int, ...], target: tuple[str, str] | None = None) -> None:
        self.findings.append(Finding(self.kind, a, b, message, evidence, rule, key, target, order))


@dataclass
class Discovered:
    """Everything one discovery run found, in source order: what the renderer turns into probe results."""

    a_set: list[str]
    findings: list[Finding]
    checked: Counter[str]
    installs: Installs

    def suppressed(self) -> Counter[str]:
        return Counter(f.rule for f in self.findings if f.rule)

    def installed_elsewhere(self, a: str, target: tuple[str, str]) -> list[tuple[str, str, int]]:
        """(package, file, line) where another of the A packages assigns this name onto B's module: a name B
        lacks but a monkeypatch adds, so A's import works only when that package ran first."""
        return [(a2, *sites[target]) for a2, sites in sorted(self.installs.items()) if a2 != a and target in sites]
