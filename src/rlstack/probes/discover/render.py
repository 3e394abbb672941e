"""One renderer for every pass's findings: a probe result per real finding (the same break reached from
several sites is one result, every site as evidence), then one summary with the counts and the suppression
rules that applied, so a suppressed finding is counted with its reason, never dropped silently."""

from __future__ import annotations

from pathlib import Path

from rlstack.probes.discover.findings import KINDS, RULES, UNCHECKED, Discovered, Finding
from rlstack.probes.model import Evidence, ProbeResult


def render(found: Discovered, errors: dict[str, str], side: Path | None = None) -> list[ProbeResult]:
    """Discovery's findings as probe results; `errors`: {package: why its wheel could not be read}, which
    leaves the summary undecided (a skip, never a pass); `side`: the file that lists every suppressed finding."""
    out: list[ProbeResult] = []
    by_id: dict[str, ProbeResult] = {}
    for f in found.findings:
        if f.rule is not None:
            continue
        pid = f"discovered:{f.id}"
        if pid in by_id:  # the same break reached from another site: one finding, every site as evidence
            if len(by_id[pid].evidence) < 12 and f.evidence[0] not in by_id[pid].evidence:
                by_id[pid].evidence.append(f.evidence[0])
            continue
        by_id[pid] = _result(found, pid, f)
        out.append(by_id[pid])
    out.append(_summary(found, len(by_id), errors, side))
    return out


def _result(found: Discovered, pid: str, f: Finding) -> ProbeResult:
    reason, ev = f.message, f.evidence[:8]
    others = found.installed_elsewhere(f.a, f.target) if f.target else []
    if others:  # say who papers over it, and that it holds only in that import order
        pkg, file, line = others[0]
        name = ".".join(f.target or ())
        reason += (f"; {pkg} assigns {name} itself ({file}:{line}), so this works only when {pkg} is imported "
                   f"before {f.a}")
        ev = [*ev, *(Evidence(text=f"{p} assigns {name}", package=p, file=fl, line=ln) for p, fl, ln in others[:3])]
    return ProbeResult(id=pid, layer="contract", status="fail", reason=reason, evidence=ev)


def _summary(found: Discovered, n_found: int, errors: dict[str, str], side: Path | None) -> ProbeResult:
    sup = found.suppressed()
    checked = found.checked
    unchecked = sum(found.unchecked.values())
    reason = (f"discovery read {', '.join(found.a_set)} against the locked packages they reach: "
              f"{sum(checked.values())} contracts checked ("
              + ", ".join(f"{checked[k]} {k}s" for k in KINDS) +
              f"); {n_found} finding(s); {sum(sup.values())} suppressed by a rule ("
              + (", ".join(f"{r}: {n}" for r, n in sup.most_common()) or "none") + ")"
              + (f"; {unchecked} name(s) built at run time not checked" if unchecked else ""))
    ev = [Evidence(text=f"rule {r} ({n}): {RULES[r]}") for r, n in sup.most_common()]
    ev += [Evidence(text=f"unchecked {r} ({n}): {UNCHECKED[r]}") for r, n in found.unchecked.most_common()]
    # every suppression, counted per package pair and rule; each one, with its site, in the side file
    ev += [Evidence(text=f"suppressed {pair}: " + ", ".join(f"{r} {n}" for r, n in c.most_common()))
           for pair, c in found.suppressed_by_pair().items()]
    if side is not None:
        ev.append(Evidence(text=f"every suppressed finding, with its rule and site: {side}"))
    undecided = sorted(errors)
    if undecided:
        reason += f"; UNDECIDED: cannot read {', '.join(undecided)}"
    return ProbeResult(id="discovered:summary", layer="contract", status="skip" if undecided else "pass",
                       reason=reason, evidence=ev, undecided=bool(undecided))
