"""The README's learning table: one row per `bench/learning.py` record (base vs tuned on held-out problems, through
one stack's path on one GPU), rendered from the records alone. A record whose training did not finish still gets
its row, with the base it measured and why it stopped (the wall a failure signature names in its log), so the
table says what has not been shown as plainly as what has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlstack.core import results
from rlstack.core.tables import markdown_table

HEADERS = ["stack", "path", "weights", "problems", "steps", "s/step", "base -> tuned (held out)", "p", "status", "on",
           "curve", "data"]


def _wall(extra: dict[str, Any]) -> str | None:
    """The wall a failure signature names in the failed phase's last lines, if one does."""
    from rlstack.probes import signatures

    tail = (extra.get("train") or {}).get("log_tail") or []
    hits = signatures.diagnose("\n".join(tail) if isinstance(tail, list) else str(tail))
    return hits[0].signature.id if hits else None


def _status(extra: dict[str, Any], errata: list[results.Erratum]) -> str:
    status = str(extra.get("status") or "?")
    wall = _wall(extra) if status != "done" else None
    return "; ".join([f"{status}: {wall}" if wall else status, *(e.text() for e in errata)])


def _weights(extra: dict[str, Any], fp8: bool = False) -> str:
    """The base's precision in training and in the evaluations: what separates two runs of one path (a 135M
    model's 4-bit base answers far fewer problems than its bf16 one)."""
    def precision(fp8: object, four_bit: object) -> str:
        return "FP8" if fp8 else "4-bit" if four_bit else "bf16"

    model = (extra.get("recipe") or {}).get("model") or {}
    loader = str((extra.get("train") or {}).get("loader") or "")
    trained = precision(fp8 or "fp8" in loader or model.get("load_in_fp8"), model.get("load_in_4bit"))
    config = (extra.get("base") or {}).get("config") or {}
    if not config:
        return trained
    scored = precision(config.get("load_in_fp8"), config.get("load_in_4bit"))
    return trained if scored == trained else f"{trained} train, {scored} eval"


def _problems(extra: dict[str, Any]) -> str:
    """The held-out problems' level (the eval data spec without its count, split as data.sources splits it): one
    recipe runs at several levels."""
    return str(((extra.get("recipe") or {}).get("eval") or {}).get("data") or "-").partition(":")[0]


def _with_seed(path_text: str, extra: dict[str, Any]) -> str:
    """The path, with ', seed N' after the loader and rollouts (before a stopped run's reason) where the recipe set
    grpo.seed to other than 0: runs of one path at several seeds are how the table tells an engine's effect from a
    trajectory's."""
    seed = ((extra.get("recipe") or {}).get("grpo") or {}).get("seed")
    if seed in (None, 0):
        return path_text
    path, sep, why = path_text.partition(": ")
    return f"{path}, seed {seed}{sep}{why}"


def _p(value: object) -> str:
    return f"{value:.2g}" if isinstance(value, float) else "-" if value is None else str(value)


def learning_rows(folder: Path | None = None) -> list[list[object]]:
    """Finished runs first, newest first; then the ones that stopped."""
    rows: list[tuple[bool, str, list[object]]] = []
    for path, r in results.load_all(folder):
        if r.question != "learning" or r.ran.bench != "learning" or "base_correct" not in r.columns:
            continue
        extra = r.extra or {}
        base = extra.get("base") or {}
        train = extra.get("train") or {}
        for row in r.rows or [{}]:
            n = row.get("n", base.get("n"))
            tuned = row.get("tuned_correct")
            rollouts = train.get("rollouts") or (f"{r.ran.engine} rollouts" if r.ran.engine else None)
            path_text = row.get("path") or ", ".join(str(x) for x in (train.get("loader"), rollouts) if x)
            png = path.with_suffix(".png")
            rows.append((extra.get("status") == "done", r.date, [
                row.get("stack", r.ran.stack), _with_seed(path_text or "-", extra),
                _weights(extra, bool(r.ran.options.get("fp8"))),
                _problems(extra), row.get("steps", train.get("steps_done", 0)), row.get("s_per_step") or "-",
                f"{row.get('base_correct', base.get('correct'))}/{n} -> {tuned if tuned is not None else '-'}/{n}",
                _p(row.get("p")), _status(extra, r.errata),
                f"{r.where.gpu or 'CPU'}, {r.where.environment}, lock {(r.ran.lock_hash or '?')[:12]}, {r.date[:10]}",
                f"[png](bench/results/{png.name})" if png.is_file() else "-",
                f"[{path.name}](bench/results/{path.name})",
            ]))
    rows.sort(key=lambda t: t[1], reverse=True)  # ISO dates: newest first ...
    rows.sort(key=lambda t: not t[0])  # ... and, stably, the finished ones before the rest
    return [cells for _, _, cells in rows]


def learning_section(folder: Path | None = None) -> str:
    rows = learning_rows(folder)
    if not rows:
        return "No learning run has been recorded yet (`invoke bench learning`).\n"
    return markdown_table(HEADERS, rows) + (
        "\n\nEach row is `bench/learning.py` through one stack's path; its record has the command, lock, reward "
        "curve and both evaluations ([docs/performance.md](docs/performance.md)).\n")
