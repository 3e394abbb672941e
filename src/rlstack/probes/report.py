"""Rendering probe reports: a terminal table, the per-wall verdict with evidence and fix, JSON."""

from __future__ import annotations

from rlstack.core.tables import text_table
from rlstack.probes import signatures
from rlstack.probes.model import ProbeReport, ProbeResult

MARK = {"pass": "PASS", "fail": "FAIL", "skip": "skip"}


def _short(text: str, n: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def table(report: ProbeReport) -> str:
    rows = [[MARK[r.status] if not r.undecided else "UNDECIDED", r.id, f"{r.duration_s:.2f}s", r.signature or "",
             _short(r.reason)] for r in report.results]
    head = (f"stack {report.stack}  lock {report.lock_hash[:12]}  gpu_arch {report.gpu_arch or '(each of the stack)'}  "
            f"toolkit {report.toolkit or '-'} (stack.toml: what the toolchain probes judged)  "
            f"host nvcc {report.host_toolkit or 'none'}  torch CUDA {report.torch_cuda or '-'}")
    counts = {s: sum(r.status == s for r in report.results) for s in ("pass", "fail", "skip")}
    undecided = len(report.undecided)
    foot = (f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"
            + (f" ({undecided} undecided)" if undecided else "") + f" in {report.duration_s:.1f}s")
    lines = [head]
    env = report.environment
    if env is not None:
        state = "= lock" if env.lock_match else f"{len(env.deviations)} off-lock"
        lines.append(f"environment {env.where} ({state}): Python {env.python}, torch {env.torch or '-'} "
                     f"(CUDA {env.torch_cuda or '-'}), nvcc {env.toolkit or '-'} ({env.toolkit_from})")
        if env.deviations:
            lines.append("  " + fold_deviations(env.deviations))
    return "\n".join([*lines, text_table(["status", "probe", "time", "wall", "reason"], rows), foot])


def fold_deviations(deviations: list[str], show: int = 3) -> str:
    """One line for the environment's departures from the lock: the count, the first few, and where the rest
    are (the JSON report lists every one)."""
    missing = sum(" missing " in d for d in deviations)
    head = f"{len(deviations)} off-lock ({missing} missing, {len(deviations) - missing} at another version): "
    more = len(deviations) - show
    return head + "; ".join(deviations[:show]) + (f"; +{more} more (--json lists all)" if more > 0 else "")


def walls(results: list[ProbeResult]) -> list[tuple[str, list[ProbeResult]]]:
    """Failures grouped by wall id, in the order first found."""
    out: dict[str, list[ProbeResult]] = {}
    for r in results:
        if r.status == "fail":
            out.setdefault(r.signature or r.id, []).append(r)
    return list(out.items())


def verdict(report: ProbeReport, question: str) -> str:
    found = walls(report.results)
    undecided = report.undecided
    if not found and undecided:
        lines = [f"VERDICT: {question}: UNDECIDED: {len(undecided)} probe(s) that decide a wall could not run, so "
                 "this is not a pass."]
        for r in undecided:
            lines.append(f"   {r.id}: {_short(r.reason, 500)}")
        return "\n".join(lines)
    if not found:
        skipped = [r for r in report.results if r.status == "skip"]
        tail = f" ({len(skipped)} probes skipped as not applicable; see the table)" if skipped else ""
        return f"VERDICT: {question}: no wall found by the {', '.join(report.layers)} probes{tail}."
    lines = [f"VERDICT: {question}: BLOCKED by {len(found)} wall(s)."]
    for n, (wall, results) in enumerate(found, 1):
        sig = signatures.by_id(wall)
        lines.append(f"\n{n}. [{wall}] {sig.title if sig else results[0].reason}")
        for r in results:
            lines.append(f"   {r.id}: {_short(r.reason, 300)}")
            for e in r.evidence[:8]:
                lines.append(f"     - {_short(e.render(), 260)}")
        if sig:
            lines.append(f"   why: {_short(sig.explanation, 400)}")
        fix = results[0].fix or (sig.fix if sig else None)
        if fix:
            lines.append(f"   fix: {_short(fix, 400)}")
    if undecided:
        lines.append(f"\nAlso UNDECIDED ({len(undecided)}): " + "; ".join(f"{r.id}: {_short(r.reason, 200)}"
                                                                    for r in undecided))
    return "\n".join(lines)


def counterpart(result_id: str, ref_stack: str, stack: str) -> str:
    """The probe in `stack` that answers the question `result_id` asked of `ref_stack`: the same id, except a
    co-install check with the reference (can its packages share one torch with another stack's?) is answered
    by the other stack's own resolution."""
    if result_id.startswith("resolve:coinstall:") and result_id.endswith(f"+{ref_stack}"):
        return f"resolve:{stack}"
    return result_id.replace(f"resolve:{ref_stack}", f"resolve:{stack}")


def walls_compared(ref: ProbeReport, new: ProbeReport) -> str:
    """Each wall of the reference report, and what the same probe says in the other stack."""
    found = walls(ref.results)
    if not found:
        return f"{ref.stack} shows no wall on these layers, so there is nothing to compare with {new.stack}."
    by_id = {r.id: r for r in new.results}
    lines = [f"Each wall of {ref.stack}, checked again in {new.stack}:"]
    for wall, results in found:
        for r in results:
            other_id = counterpart(r.id, ref.stack, new.stack)
            other = by_id.get(other_id)
            if other is None:
                lines.append(f"  [{wall}] {r.id}: not probed in {new.stack}")
                continue
            lines.append(f"  [{wall}] {r.id} FAIL -> {new.stack} {other_id} {MARK[other.status]}: "
                         f"{_short(other.reason, 150)}")
    return "\n".join(lines)
