"""Discovery: contracts between locked packages found in their sources, not listed by hand.

For each package A among the stack's top-level requirements, and every locked package B it reaches into,
read from the locked wheels (no import, no GPU), in three steps:

- model (rlstack.probes.discover.model): the wheels' APIs, built once: which modules exist, what they bind,
  what parameters a callee takes;
- sites (rlstack.probes.discover.sites): one walk over A's modules that records every statement on a path
  that runs in this stack, under guards evaluated against the lock (`TYPE_CHECKING` is false,
  `is_X_available()` is whether X is locked, version comparisons use the locked version; guards.py);
- passes, each comparing A's sites with the model and returning typed findings (findings.py):
  1. replacements: A assigns (or setattr's) onto a module or class attribute of B (replacements.py);
  2. imports: every name A imports from B and every attribute A reads on one of B's modules (imports.py);
  3. pastes: every function whose source A pastes into a code template finds its free names there
     (pastes.py);
  4. keywords: every keyword A passes to B's functions and constructors is a parameter of the callee
     (keywords.py).

One renderer (render.py) turns all findings into probe results. A finding that a rule suppresses is counted
with the rule's reason (RULES), per rule and per package pair in the summary, and listed with its site in a
side file beside the cached result, never dropped silently. The rules are right on one lock, not across locks:
each stack's baseline (baseline.py) holds the suppressed keys accepted at its lock, and a suppressed key it lacks
is a finding (`new-since-baseline`), so a dependency that newly breaks an optional path fails. A stub fallback
(an except-branch that binds a placeholder in the missing name's place) is a finding, not a suppression: it
moves the failure to where the name is used. Names built at run time (runtime_names.py) are checked where the
source pins their strings down, and counted as unchecked where it does not. Each check records the reference it
made (findings.Ref), which is what bench/probe_mutation.py deletes or renames in B's source to measure whether
the checks can fail.

The split follows griffe's loader / visitor / extension one: the model loads, the walk visits, each pass is
an analysis that can be run (and tested) alone. Why not griffe itself (it loads a package's API from source
with parameters, bases and aliases): discovery needs the use sites (calls, attribute loads on receivers,
assignments inside function bodies, the guards around each), which griffe does not model; the provider side
needs the lazy-module and star-import rules either way; and one `ast` parse per file, shared with the contract
cases, serves both sides without another dependency in every image.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from rlstack.core.pkgnames import requirement_name
from rlstack.probes.discover import baseline, imports, keywords, pastes, replacements, sites
from rlstack.probes.discover.findings import KINDS, RULES, Discovered, Finding, Kind, PassResult
from rlstack.probes.discover.model import ApiModel
from rlstack.probes.discover.render import render
from rlstack.probes.inputs import code_hash, fetch_sources
from rlstack.probes.model import ProbeResult
from rlstack.probes.remote import write_text
from rlstack.probes.wheels import SourceSet, WheelCache, WheelError, cache_dir
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack

__all__ = ["KINDS", "PASSES", "RULES", "Discovered", "Finding", "Kind", "a_set", "accept", "baseline", "find",
           "render", "results", "suppressed_file"]

Pass = Callable[[ApiModel, sites.Uses], PassResult]
PASSES: dict[Kind, Pass] = {"replacement": replacements.find, "import": imports.find, "paste": pastes.find,
                            "keyword": keywords.find}


def find(stack: Stack, sources: SourceSet, locked: dict[str, LockedPackage], a_set: Sequence[str],
         kinds: Sequence[Kind] = KINDS, *, model: ApiModel | None = None,
         only: Mapping[str, Collection[str]] | None = None, known: sites.Uses | None = None) -> Discovered:
    """Every finding of the passes in `kinds` for the A packages in `a_set` (those with sources in `sources`),
    in source order: the model and the walk once, then each pass over them. `model`, `only` and `known`: a
    rerun over some of A's files against changed B sources (sites.walk)."""
    model = model or ApiModel(stack, sources, locked)
    uses = sites.walk(model, a_set, only, known)
    done = [PASSES[k](model, uses) for k in kinds]
    findings = sorted((f for r in done for f in r.findings), key=lambda f: f.order)
    unchecked: Counter[str] = Counter()
    for r in done:
        unchecked.update(r.unchecked)
    return Discovered(list(a_set), findings, Counter({r.kind: r.checked for r in done if r.checked}), uses.installs,
                      [x for r in done for x in r.refs], unchecked, uses)


def a_set(stack: Stack, locked: dict[str, LockedPackage]) -> list[str]:
    """The packages discovery reads as A: the stack's top-level requirements that are locked."""
    return sorted({requirement_name(line) for line in stack.top_level} & set(locked))


def b_set(stack: Stack, locked: dict[str, LockedPackage], cache: WheelCache, a: Sequence[str]) -> set[str]:
    """The packages discovery reads as B: every locked package with Python sources that an A imports from,
    found from A's imports' top names."""
    sources, _, _ = fetch_sources(stack, set(a), locked, cache)
    tops: set[str] = set()
    try:
        for pkg in a:
            for n in sources.name_set(pkg):
                if n.endswith(".py"):
                    for m in re.finditer(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", sources.read(pkg, n) or "", re.M):
                        tops.add(m[1])
    finally:
        sources.close()
    return {p for p in locked if p.replace("-", "_") in tops or p in tops} - set(a)


def results(stack: Stack, *, locked: dict[str, LockedPackage], cache: WheelCache) -> list[ProbeResult]:
    """Discovery's findings as probe results (one per finding, then one summary with the counts and the
    suppression rules that applied), cached under the wheels' sha256 and the probes' code, then compared with
    the stack's baseline (baseline.py): a suppressed key the baseline lacks fails."""
    raw, keys = _cached(stack, locked, cache)
    return baseline.apply(stack, raw, keys, baseline.load(stack), code_hash())


def accept(stack: Stack, *, locked: dict[str, LockedPackage], cache: WheelCache) -> Path:
    """Write the stack's baseline from discovery's suppressed keys on its current lock (cached, or one run), so
    that none of them is new; WheelError when a wheel could not be read (the keys would be incomplete)."""
    raw, keys = _cached(stack, locked, cache)
    if raw[-1].undecided:
        raise WheelError(f"not writing {baseline.path(stack)}: a locked wheel could not be read, so the suppressed "
                         f"keys are incomplete ({raw[-1].reason.split('UNDECIDED: ')[-1]})",
                         "fix the wheel access (network, index settings), then accept again")
    return baseline.write(stack, baseline.of(stack, keys, code_hash()))


def _cached(stack: Stack, locked: dict[str, LockedPackage], cache: WheelCache
            ) -> tuple[list[ProbeResult], dict[str, baseline.Excused]]:
    """(discovery's results before the baseline, its suppressed keys), from the cache or from a run."""
    a = a_set(stack, locked)
    b = b_set(stack, locked, cache, a)
    key = {"stack": stack.name, "a": a,
           "locked": sorted(f"{n}=={p.version}" for n, p in locked.items() if n in b | set(a)),
           "python": stack.python, "platform": stack.platform, "code": code_hash()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = cache_dir() / "results" / f"discover-{digest}.json"
    keys_path = path.with_name(f"discover-{digest}.keys.json")
    if path.is_file() and keys_path.is_file():
        return ([ProbeResult.model_validate(r) for r in json.loads(path.read_text())],
                baseline.read_keys(keys_path.read_text()))
    sources, errors, _ = fetch_sources(stack, set(a) | b, locked, cache, prefetch_skip=frozenset())
    side = path.with_name(f"discover-{digest}.suppressed.json")
    try:
        found = find(stack, sources, locked, a)
    finally:
        sources.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(side, json.dumps(suppressed_file(stack, found), indent=1))
    out = render(found, errors, side)
    keys = baseline.excused(found)
    if not any(r.undecided for r in out):
        write_text(keys_path, baseline.dump_keys(keys))
        write_text(path, json.dumps([r.model_dump(mode="json") for r in out]))
    return out, keys


def suppressed_file(stack: Stack, found: Discovered) -> dict[str, object]:
    """Every suppressed finding (the side file beside discovery's cached result, named in its summary), with
    the counts per rule and per package pair that the summary carries too."""
    return {"stack": stack.name, "rules": RULES, "counts": dict(found.suppressed().most_common()),
            "pairs": {p: dict(c.most_common()) for p, c in found.suppressed_by_pair().items()},
            "unchecked": dict(found.unchecked),
            "suppressed": [{"rule": f.rule, "kind": f.kind, "a": f.a, "b": f.b, "key": f.key, "message": f.message,
                            "file": f.evidence[0].file, "line": f.evidence[0].line}
                           for f in found.findings if f.rule]}
