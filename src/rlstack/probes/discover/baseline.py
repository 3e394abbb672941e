"""A stack's baseline of suppressed findings: what discovery excused on the lock it was accepted on, so that a
dependency that newly breaks a caught or optional path turns the probe red.

The suppression rules (findings.RULES) are right on one lock: upstream code carries hundreds of `try` blocks
whose imports fail by design (a shim for another version, an optional feature). Across locks they hide exactly
the failure a dependency upgrade brings: a library drifts at an internal API and a patch stops applying, a
fallback takes over, a keyword lands in **kwargs. So each stack keeps, beside its lock, the set of suppressed
keys (`A->B:kind:key`, no line numbers: a key survives edits to A that move its site) as they were when someone
accepted them; a suppressed key that is not in that set is a finding of its own (`new-since-baseline`), and a
key of the set that discovery no longer meets is counted as info (the break was fixed, or A stopped reaching
it), never a failure. A stack without the file behaves as before, and says once that it has none.

The comparison runs on the suppressed keys that discovery caches beside its result (one entry per key, its first
site), not on the cached result itself, so accepting a baseline never reruns discovery, and the cached result
does not depend on the baseline file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from rlstack.core.errors import StackFileError
from rlstack.core.fileio import write_atomic
from rlstack.probes.discover.findings import RULES, Discovered
from rlstack.probes.model import Evidence, ProbeResult
from rlstack.stacks.locks import lock_hash
from rlstack.stacks.model import Stack

FILE_NAME = "probe-baseline.json"  # beside the stack's stack.toml and lock; path() is the one place that says so
RULE = "new-since-baseline"
GONE_SHOWN = 10  # baseline keys no longer met, listed in the summary (all of them are counted)


class BaselineFileError(StackFileError):
    """A stack's probe-baseline.json that cannot be read as one (not JSON, a field missing or of the wrong type)."""


class Excused(BaseModel):
    """One suppressed key, as its first site shows it: the rules that excused it, what would fail, and where."""

    model_config = ConfigDict(extra="forbid")

    rules: list[str]
    message: str
    package: str
    file: str
    line: int


class Baseline(BaseModel):
    """The suppressed keys of one stack at the lock they were accepted on, grouped by the rule that excused them
    (a key excused by two rules at two sites is listed under both)."""

    model_config = ConfigDict(extra="forbid")

    stack: str
    lock: str  # the sha256 of the lock file (rlstack.stacks.locks.lock_hash)
    discovery: str  # the probes' code hash (inputs.code_hash) when accepted: other code may meet other keys
    accept: str  # the command that rewrites this file
    counts: dict[str, int]
    keys: dict[str, list[str]]

    def all(self) -> set[str]:
        return {k for keys in self.keys.values() for k in keys}


def path(stack: Stack) -> Path:
    return stack.folder / FILE_NAME


def accept_command(stack: Stack) -> str:
    return f"invoke probe --stack {stack.name} --discovered-only --accept-baseline"


def imports_instead(fallback: tuple[str, int, str] | None) -> bool:
    """A catching handler that imports the missing name from elsewhere (not a shim, a stub or None): the walk
    checks that import as the live path, so taking it is checked, not switched off."""
    return fallback is not None and fallback[0] == "alternative" and fallback[2].startswith(("from ", "import "))


def excused(found: Discovered) -> dict[str, Excused]:
    """{key: Excused} for every suppressed finding of a discovery run, sorted by key; not those caught by a
    handler that imports the name from elsewhere (imports_instead), whose failure would be a finding itself."""
    out: dict[str, Excused] = {}
    for f in found.findings:
        if f.rule is None or (f.rule == "caught" and imports_instead(f.fallback)):
            continue
        k = f.id
        if k in out:
            if f.rule not in out[k].rules:
                out[k].rules.append(f.rule)
            continue
        ev = f.evidence[0]
        out[k] = Excused(
            rules=[f.rule], message=f.message, package=ev.package or f.a, file=ev.file or "", line=ev.line or 0
        )
    return dict(sorted(out.items()))


def of(stack: Stack, keys: Mapping[str, Excused], discovery: str) -> Baseline:
    """The baseline that accepts every key in `keys` at the stack's current lock."""
    by_rule: dict[str, list[str]] = {}
    for k, e in keys.items():
        for rule in e.rules:
            by_rule.setdefault(rule, []).append(k)
    grouped = {r: sorted(ks) for r, ks in sorted(by_rule.items())}
    return Baseline(
        stack=stack.name,
        lock=lock_hash(stack),
        discovery=discovery,
        accept=accept_command(stack),
        counts={r: len(ks) for r, ks in grouped.items()},
        keys=grouped,
    )


def load(stack: Stack) -> Baseline | None:
    """The stack's baseline, or None when it has none; BaselineFileError when the file is not one."""
    p = path(stack)
    try:
        text = p.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineFileError(f"{p}: cannot read the probe baseline: {exc}", _hint(stack)) from None
    try:
        return Baseline.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise BaselineFileError(
            f"{p}: not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}", _hint(stack)
        ) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "(the whole file)"
        raise BaselineFileError(f"{p}: not a probe baseline: field '{field}': {first['msg']}", _hint(stack)) from None


def _hint(stack: Stack) -> str:
    return f"restore it from git, or write it again from the current lock: {accept_command(stack)}"


def write(stack: Stack, baseline: Baseline) -> Path:
    """Write the file: sorted, one key a line, so that accepting a change reads as a diff of keys."""
    p = path(stack)
    write_atomic(p, json.dumps(baseline.model_dump(mode="json"), indent=1) + "\n")
    return p


def apply(
    stack: Stack, results: list[ProbeResult], keys: Mapping[str, Excused], baseline: Baseline | None, discovery: str
) -> list[ProbeResult]:
    """Discovery's results (findings, then the summary last) compared with the stack's baseline: a failing
    result per suppressed key the baseline lacks (unless the same key already fails as a finding), and the
    summary told how many keys are new, how many of the baseline's are gone (info), or that there is no
    baseline. `discovery`: the probes' code hash now, to say when a new key may come from changed code."""
    *found, summary = results
    summary = summary.model_copy(deep=True)
    where = path(stack)
    if baseline is None:
        summary.evidence.append(
            Evidence(
                text=f"no probe baseline ({where}): suppressed findings are excused as on "
                f"any lock; accept the current ones with: {accept_command(stack)}"
            )
        )
        return [*found, summary]
    failing = {r.id for r in found}
    accepted = baseline.all()
    new = [k for k in keys if k not in accepted and f"discovered:{k}" not in failing]
    gone = sorted(accepted - set(keys))
    out = [*found, *(_new_result(stack, k, keys[k], baseline, discovery) for k in new)]
    summary.reason += (
        f"; baseline {where.name} (lock {baseline.lock[:12]}): {len(new)} suppressed key(s) new "
        f"since it, {len(gone)} of its {len(accepted)} no longer met"
    )
    summary.evidence.append(
        Evidence(
            text=f"probe baseline: {where}, accepted at lock {baseline.lock[:12]}; "
            f"{len(new)} key(s) new since it fail ({RULE})"
        )
    )
    summary.evidence += [
        Evidence(text=f"info: baseline key no longer met (fixed, or no longer reached): {k}") for k in gone[:GONE_SHOWN]
    ]
    if len(gone) > GONE_SHOWN:
        summary.evidence.append(
            Evidence(
                text=f"info: {len(gone) - GONE_SHOWN} more baseline key(s) no longer met; "
                f"{accept_command(stack)} drops them"
            )
        )
    return [*out, summary]


def _new_result(stack: Stack, key: str, e: Excused, baseline: Baseline, discovery: str) -> ProbeResult:
    rules = ", ".join(e.rules)
    why = "; ".join(RULES.get(r, r).split(":")[0] for r in e.rules)
    code = (
        ""
        if baseline.discovery == discovery
        else (" (the baseline was accepted with other probe code, which may meet other keys)")
    )
    return ProbeResult(
        id=f"discovered:{RULE}:{key}",
        layer="contract",
        status="fail",
        reason=(
            f"new since the baseline accepted at lock {baseline.lock[:12]}{code}: {e.message}; on this lock it is "
            f"excused as '{rules}' ({why}), and on the baseline's lock it did not need to be: the path now takes "
            "its fallback, skips its step, passes a keyword no parameter receives, or is no longer checked"
        ),
        evidence=[
            Evidence(text=e.message[:200], package=e.package, file=e.file, line=e.line),
            Evidence(text=f"not among the keys of {path(stack)}"),
        ],
        fix=f"if the change is intended, accept it: {accept_command(stack)}; otherwise move the package that "
        "changed back to the baseline's version",
    )


def dump_keys(keys: Mapping[str, Excused]) -> str:
    return json.dumps({k: e.model_dump(mode="json") for k, e in keys.items()})


def read_keys(text: str) -> dict[str, Excused]:
    return {k: Excused.model_validate(v) for k, v in json.loads(text).items()}
