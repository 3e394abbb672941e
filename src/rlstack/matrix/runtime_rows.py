"""The measured rows of compat_matrix.yaml in which runtime probes ran, as probe-fp8 summarises them beside the
static probes: a question about the matrix, so it lives with the matrix (which may read the probes' model and
signatures; the probes never read the matrix)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlstack.probes.model import ProbeReport


class RuntimeRow(BaseModel):
    """A measured compat-matrix row in which runtime probes ran, as probe-fp8 summarises it."""

    stack: str
    gpu_arch: str | None
    date: str
    lock_hash: str | None
    lock_current: bool = Field(description="the row measured the lock the stack has now")
    env: str
    runtime: dict[str, str] = Field(description="runtime probe -> pass/fail/skip")
    walls: list[str]
    superseded: list[str] = Field(default_factory=list, description=(
        "walls of failing probes that rlstack's own probe setup caused and fixed after this row was measured "
        "(signatures.yaml probe_fixed): to be measured again, not held against the stack"))
    blocking: bool = Field(default=False, description=(
        "a runtime probe failed for a reason other than a superseded wall (a failure with no wall named counts)"))


def matrix_runtime_rows(reports: list[ProbeReport]) -> list[RuntimeRow]:
    """The measured rows of compat_matrix.yaml in which a runtime probe ran (not only skipped) for each
    report's stack, with whether the row's lock is still the stack's lock (the report's). An unreadable
    matrix gives no rows: this is a summary, the matrix has its own checks."""
    from rlstack.matrix import store
    from rlstack.matrix.render import decided_label
    from rlstack.matrix.schema import MatrixError
    from rlstack.probes import signatures

    try:
        rows = store.load().rows
    except MatrixError:
        return []
    out: list[RuntimeRow] = []
    for rep in reports:
        for row in rows:
            probes = [p for p in row.probes if p.id.startswith("runtime:")]
            if row.stack != rep.stack or row.source != "measured" or all(p.status == "skip" for p in probes):
                continue
            failed = [p for p in probes if p.status == "fail"]
            old = {p.wall for p in failed if p.wall and (sig := signatures.by_id(p.wall)) and sig.superseded(row.date)}
            out.append(RuntimeRow(
                stack=row.stack, gpu_arch=row.gpu_arch, date=row.date, lock_hash=row.lock_hash,
                lock_current=row.lock_hash == rep.lock_hash, env=decided_label(row),
                runtime={p.id.removeprefix("runtime:"): p.status for p in probes},
                walls=sorted({p.wall for p in failed if p.wall}), superseded=sorted(old),
                blocking=any(p.wall not in old for p in failed)))
    return out


def render_runtime_rows(rows: list[RuntimeRow], stacks: list[str]) -> str:
    """One line per measured runtime row (matrix_runtime_rows), and a line for a stack that has none."""
    lines = ["Runtime rows in compat_matrix.yaml (measured on a GPU):"]
    for stack in stacks:
        mine = [r for r in rows if r.stack == stack]
        if not mine:
            lines.append(f"  {stack}: none measured yet (invoke ci.probe-job --stack {stack} on a GPU runner)")
        for r in mine:
            state = "= the stack's lock" if r.lock_current else "stale: the stack's lock has changed since"
            counts = ", ".join(f"{sum(s == k for s in r.runtime.values())} {k}" for k in ("pass", "fail", "skip"))
            walls = ", ".join(w + (" (rlstack's probe setup, fixed since: measure again)" if w in r.superseded else "")
                              for w in r.walls)
            lines.append(f"  {stack} {r.gpu_arch or '-'} {r.date[:10]} lock {(r.lock_hash or '-')[:12]} ({state}), "
                         f"{r.env}: {counts}; walls: {walls or 'none'}")
    return "\n".join(lines)
