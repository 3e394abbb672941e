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
    rows = [[MARK[r.status], r.id, f"{r.duration_s:.2f}s", r.signature or "", _short(r.reason)] for r in report.results]
    head = (f"stack {report.stack}  lock {report.lock_hash[:12]}  gpu_arch {report.gpu_arch or '(each of the stack)'}  "
            f"toolkit {report.toolkit or '-'}  torch CUDA {report.torch_cuda or '-'}")
    counts = {s: sum(r.status == s for r in report.results) for s in ("pass", "fail", "skip")}
    foot = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped in {report.duration_s:.1f}s"
    lines = [head]
    env = report.environment
    if env is not None:
        state = "= lock" if env.lock_match else f"{len(env.deviations)} off-lock"
        lines.append(f"environment {env.where} ({state}): Python {env.python}, torch {env.torch or '-'} "
                     f"(CUDA {env.torch_cuda or '-'}), nvcc {env.toolkit or '-'} ({env.toolkit_from})")
        lines += [f"  {d}" for d in env.deviations]
    return "\n".join([*lines, text_table(["status", "probe", "time", "wall", "reason"], rows), foot])


def walls(results: list[ProbeResult]) -> list[tuple[str, list[ProbeResult]]]:
    """Failures grouped by wall id, in the order first found."""
    out: dict[str, list[ProbeResult]] = {}
    for r in results:
        if r.status == "fail":
            out.setdefault(r.signature or r.id, []).append(r)
    return list(out.items())


def verdict(report: ProbeReport, question: str) -> str:
    found = walls(report.results)
    if not found:
        skipped = [r for r in report.results if r.status == "skip"]
        tail = f" ({len(skipped)} probes skipped; see the table)" if skipped else ""
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
    return "\n".join(lines)
