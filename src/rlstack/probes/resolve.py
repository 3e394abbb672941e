"""Resolve probes: do a stack's pins resolve together for its Python and platform (uv, no install)?

`coinstall` asks the report's third wall directly: can two stacks share one environment? It resolves one
stack's full input with the other's top-level requirements (the other's torch pin left to its packages, so
the resolver names the package that forces it, e.g. 'vllm==0.21.0 depends on torch==2.11.0').

Resolutions are cached by the hash of their input (the index can only add versions, and each input here
pins what matters); `fresh=True` skips the cache.
"""

from __future__ import annotations

import hashlib
import json
import re

from rlstack.probes.model import Evidence, ProbeResult
from rlstack.probes.remote import write_text
from rlstack.probes.wheels import cache_dir
from rlstack.stacks import locks, resolver
from rlstack.stacks.model import Stack

PIN_CLAUSE = re.compile(r"[A-Za-z0-9_.-]+==[^\s,]+")
# uv's words when it could not reach the index: that is no answer about the pins, so the probe skips
OFFLINE = re.compile(r"Failed to fetch|error sending request|dns error|Could not connect|network|offline", re.I)


def _offline(pid: str, text: str, cmd: str) -> ProbeResult | None:
    if OFFLINE.search(text) and "No solution found" not in text:
        return ProbeResult(id=pid, layer="resolve", status="skip", reason="the package index could not be reached",
                           evidence=[Evidence(text=text[-1500:], command=cmd)])
    return None


def _cached_resolve(reqs: list[str], python: str, platform: str, fresh: bool) -> tuple[bool, str, str]:
    key = hashlib.sha256(json.dumps([sorted(reqs), python, platform]).encode()).hexdigest()
    path = cache_dir() / "resolve" / f"{key}.json"
    if path.is_file() and not fresh:
        d = json.loads(path.read_text())
        return d["ok"], d["text"], d["command"]
    res = resolver.resolve(reqs, python, platform, hashes=False)
    text = res.text if not res.ok else f"{len(locks.parse_pins(res.text))} packages pinned"
    cmd = " ".join(res.command)
    if not res.ok and OFFLINE.search(text) and "No solution found" not in text:
        return res.ok, text, cmd  # not an answer: do not cache it
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps({"ok": res.ok, "text": text, "command": cmd}))
    return res.ok, text, cmd


def lock_is_fresh(stack: Stack) -> bool:
    """The committed lock was resolved from exactly this stack's inputs (its header's inputs hash)."""
    if not stack.lock_file.is_file():
        return False
    return locks.read_header(stack.lock_file.read_text()).get("inputs") == locks.inputs_hash(stack)


def edited_lock(stack: Stack) -> ProbeResult | None:
    """A failing resolve result when the stack's lock is not the set `invoke lock` sealed (a hand edit names its
    line: the inputs are re-resolved offline from uv's cache), else None. An edited lock is no answer to
    whether the pins resolve, and every other layer reads its pins and hashes."""
    if not stack.lock_file.is_file():
        return None
    try:
        locks.check_digest(stack, reference=resolver.offline_reference)
    except locks.EditedLockError as exc:
        return ProbeResult(id=f"resolve:{stack.name}", layer="resolve", status="fail",
                           reason=f"stack '{stack.name}': its lock was edited by hand, so nothing read from it is "
                                  "the resolver's answer", fix=exc.hint,
                           evidence=[Evidence(text=exc.message[:3000],
                                              file=str(stack.lock_file.relative_to(stack.folder.parent.parent)))])
    return None


def probe_stack(stack: Stack, *, fresh: bool = False) -> ProbeResult:
    """Do the stack's pins resolve? A lock made from exactly these inputs is uv's own answer (yes, and which
    versions), so it is read instead of asking again, once its digest shows it is as `invoke lock` wrote it;
    `fresh` or a stale lock asks uv."""
    if (edited := edited_lock(stack)) is not None:
        return edited
    if not fresh and lock_is_fresh(stack):
        n = len(locks.locked_versions(stack))
        return ProbeResult(id=f"resolve:{stack.name}", layer="resolve", status="pass",
                           reason=f"resolves for Python {stack.python} on {stack.platform} ({n} packages pinned: "
                                  f"the committed lock, made from these inputs)",
                           evidence=[Evidence(text=f"{stack.lock_file.name} header inputs={locks.inputs_hash(stack)}",
                                              file=str(stack.lock_file.relative_to(stack.folder.parent.parent)))])
    reqs = locks.resolver_input(stack)
    ok, text, cmd = _cached_resolve(reqs, stack.python, stack.platform, fresh)
    if not ok and (off := _offline(f"resolve:{stack.name}", text, cmd)):
        return off
    if ok:
        return ProbeResult(id=f"resolve:{stack.name}", layer="resolve", status="pass",
                           reason=f"resolves for Python {stack.python} on {stack.platform} ({text})",
                           evidence=[Evidence(text=text, command=cmd)])
    return ProbeResult(id=f"resolve:{stack.name}", layer="resolve", status="fail",
                       reason=f"stack '{stack.name}' does not resolve", evidence=[Evidence(text=text, command=cmd)],
                       signature="pin-conflict", fix=f"change the conflicting pins in {stack.requirements_in}")


def probe_coinstall(base: Stack, other: Stack, *, fresh: bool = False) -> ProbeResult:
    pid = f"resolve:coinstall:{base.name}+{other.name}"
    reqs = [*locks.resolver_input(base), *other.top_level]
    ok, text, cmd = _cached_resolve(reqs, base.python, base.platform, fresh)
    if not ok and (off := _offline(pid, text, cmd)):
        return off
    if ok:
        return ProbeResult(id=pid, layer="resolve", status="pass",
                           reason=f"{base.name} and {other.name} resolve into one environment ({text})",
                           evidence=[Evidence(text=text, command=cmd)])
    cause = " ".join(ln.strip() for ln in text.splitlines() if "because" in ln.lower() or "cause" in ln.lower())
    pins = sorted(set(PIN_CLAUSE.findall(cause)))
    reason = f"{base.name} + {other.name} cannot share one environment"
    if pins:
        reason += ": " + ", ".join(pins)
    return ProbeResult(id=pid, layer="resolve", status="fail", reason=reason,
                       evidence=[Evidence(text=cause or text, command=cmd)], signature="torch-pin-conflict"
                       if any(p.startswith("torch==") for p in pins) else "pin-conflict",
                       fix=f"keep {base.name} and {other.name} as separate images (one torch each); to train with "
                           "vLLM rollouts, pick versions that agree on torch, as the fp8 stack does (invoke probe-fp8 "
                           "shows it)")
