"""compat_matrix.yaml on disk: read, merged and written without losing a row.

`merge` folds probe reports (e.g. artifacts of several GPU runners) into the file: rows merge by key, probes
within a row by id, and the whole read-modify-write holds an exclusive fcntl lock so concurrent merges
serialise. A missing or empty matrix is refused (it would empty the README table and the page) unless the
caller asks to start one (`init`), and a write never holds fewer rows than the read did unless rows were
dropped by name (`drop`).

A result is refused before anything is written when the matrix could not show it truthfully: a stack that is
not one of images/*/stack.toml, a GPU arch no stack targets, a date in the future (a clock far ahead would
outrank every later real result). Results are ordered by their own dates, not by when they were merged: an
older result never replaces a newer one, and each one not taken is returned to be said (`Merged.not_taken`).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import yaml

from rlstack.core.fileio import write_atomic
from rlstack.core.paths import project_root
from rlstack.matrix.schema import (
    MATRIX_FILE,
    Matrix,
    MatrixError,
    Row,
    parse,
    read_report,
    row_from_report,
    sorted_rows,
    when,
)
from rlstack.probes.model import ProbeReport

HEADER = ("# rlstack compatibility matrix: what passes where. Merged by 'invoke matrix' from probe JSON (source:\n"
          "# predicted for static results only, measured when a runtime probe ran on that GPU; 'decided' says how\n"
          "# and where); rows with source: reported are copied from the report they cite.\n"
          "# Schema: rlstack.matrix.schema.Matrix. Rendered into README.md and docs/compat_matrix.html.\n")
INIT_HINT = "start a new matrix with: invoke matrix --init (then merge results into it)"
# How far ahead of this machine's clock a result's date may be: the probing machine's clock may run a little
# ahead, and a date beyond this would outrank every real result merged after it.
CLOCK_SKEW = timedelta(minutes=10)


class RefusedResultError(MatrixError):
    """A probe result the matrix does not take: its stack, arch or date cannot be true of this project."""


class Merged(NamedTuple):
    matrix: Matrix
    dropped: list[Row]
    not_taken: list[str]


def matrix_path(root: Path | None = None) -> Path:
    return (root or project_root()) / MATRIX_FILE


def load(path: Path | None = None, *, init: bool = False) -> Matrix:
    """The matrix in `path`. Missing or without rows is an error (a checkout that lost the file must not
    render an empty table over the real one) unless `init` starts a new matrix."""
    path = path or matrix_path()
    if not path.is_file():
        if init:
            return Matrix()
        raise MatrixError(f"{path}: no such matrix file", INIT_HINT)
    m = parse(path.read_text(), path)
    if not m.rows and not init:
        raise MatrixError(f"{path}: the matrix has no rows", INIT_HINT + "; or restore it: git checkout -- " +
                          path.name)
    return m


def dump(m: Matrix) -> str:
    rows = [r.model_dump(mode="json", exclude_none=True, exclude_defaults=False) for r in sorted_rows(m.rows)]
    return HEADER + yaml.safe_dump({"rows": rows}, sort_keys=False, allow_unicode=True, width=120)


def merge_rows(existing: list[Row], incoming: Iterable[Row]) -> tuple[list[Row], list[str]]:
    """Rows merge by key; inside a row, probes merge by id in the order of their own dates: a result replaces
    one decided no later than it, never a newer one. A result kept while its row moves on keeps its own date
    (ProbeCell.date), so a later merge still compares it with the right time. Returns the rows and one line per
    incoming row whose results (some or all) were not taken, since the matrix holds newer ones."""
    by_key = {r.key: r for r in existing}
    not_taken: list[str] = []
    for new in incoming:
        old = by_key.get(new.key)
        if old is None:
            by_key[new.key] = new
            continue
        t_new = when(new.date)
        cells = {p.id: p if p.date else p.model_copy(update={"date": old.date}) for p in old.probes}
        older = []
        for p in new.probes:
            have = cells.get(p.id)
            if have is None or t_new >= when(have.date or old.date):
                cells[p.id] = p.model_copy(update={"date": new.date})
            else:
                older.append(f"{p.id} (matrix: {have.date})")
        if older:
            not_taken.append(f"{new.label()} of {new.date}: {len(older)} result(s) older than the matrix's, "
                             f"kept the newer: {', '.join(older)}")
        top = new if t_new >= when(old.date) else old
        probes = [c.model_copy(update={"date": None}) if c.date and when(c.date) >= when(top.date) else c
                  for c in cells.values()]
        by_key[new.key] = top.model_copy(update={"probes": probes, "host": top.host or old.host or new.host})
    return sorted_rows(by_key.values()), not_taken


def known_archs() -> list[str]:
    """The project's GPU archs: every arch some stack targets (stack.toml gpu_archs)."""
    from rlstack import stacks
    from rlstack.probes.toolchain import arch_number

    return sorted({a for s in stacks.load_all() for a in s.gpu_archs}, key=arch_number)


def refuse_untrue(reports: list[tuple[Path, ProbeReport]], now: datetime | None = None) -> None:
    """Raise RefusedResultError naming every report whose stack is not one of images/*/stack.toml, whose arch
    no stack targets, or whose date is unreadable or later than now (plus CLOCK_SKEW)."""
    from rlstack import stacks

    names, archs = stacks.stack_names(), known_archs()
    limit = (now or datetime.now(UTC)) + CLOCK_SKEW
    problems = []
    for path, rep in reports:
        if rep.stack not in names:
            problems.append(f"{path}: unknown stack '{rep.stack}' (stacks: {', '.join(names)})")
        if rep.gpu_arch is not None and rep.gpu_arch not in archs:
            problems.append(f"{path}: unknown GPU arch '{rep.gpu_arch}' (the stacks target: {', '.join(archs)})")
        try:
            t = when(rep.date)
        except ValueError:
            problems.append(f"{path}: date '{rep.date}' is not an ISO 8601 time")
            continue
        if t > limit:
            problems.append(f"{path}: dated {rep.date}, after this machine's clock "
                            f"({limit.isoformat(timespec='seconds')} with {CLOCK_SKEW} of allowed skew)")
    if problems:
        raise RefusedResultError(
            f"refusing {len(problems)} problem(s); nothing was merged:\n  " + "\n  ".join(problems),
            "merge only results of `rlstack probe --json` for a stack in images/ (a new arch goes into its "
            "stack.toml gpu_archs first); a date in the future means the probing machine's clock is wrong: fix it "
            "and probe again")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive lock for the read-modify-write of `path` (a sidecar .lock file: the data file itself is
    replaced atomically, so it cannot hold the lock)."""
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def drop_rows(rows: list[Row], specs: Iterable[str]) -> tuple[list[Row], list[Row]]:
    """(kept, dropped) for specs STACK[:LOCK-PREFIX[:GPU-ARCH]]. A spec that matches no row is an error: a
    typo must not look like a successful drop."""
    dropped: list[Row] = []
    kept = list(rows)
    for spec in specs:
        stack, _, rest = spec.partition(":")
        lock, _, arch = rest.partition(":")
        hit = [r for r in kept if r.stack == stack and (r.lock_hash or "").startswith(lock)
               and (not arch or r.gpu_arch == arch)]
        if not hit:
            raise MatrixError(f"--drop {spec}: no row matches", "spell it STACK[:LOCK-PREFIX[:GPU-ARCH]] "
                              "as the table shows them")
        dropped += hit
        kept = [r for r in kept if r not in hit]
    return kept, dropped


def write(m: Matrix, path: Path) -> None:
    write_atomic(path, dump(m))


def upgrade(path: Path, *, init: bool = False) -> int | None:
    """Rewrite a matrix written in an older schema in the current one (Row._migrate fills what a row lacks and
    evidence loses machine-local paths); the number of rows written, or None when the file is current. Refused
    if the rows written would be fewer than the rows in the file."""
    with locked(path):
        text = path.read_text()
        m = load(path, init=init)
        new = dump(m)
        if new == text:
            return None
        raw = yaml.safe_load(text) or {}
        before = len(raw.get("rows") or []) if isinstance(raw, dict) else 0
        if len(m.rows) != before:
            raise MatrixError(f"refusing to rewrite {path}: {len(m.rows)} rows after the upgrade, {before} before")
        write(m, path)
    return len(m.rows)


def merge(files: Iterable[Path], path: Path | None = None, *, init: bool = False,
          drop: Iterable[str] = (), now: datetime | None = None) -> Merged:
    """Fold probe reports into the matrix file: the new matrix, the rows dropped by `drop`, and what was not
    taken (merge_rows). Every report is checked (refuse_untrue) before the file is read."""
    path = path or matrix_path()
    reports = [(f, read_report(f)) for f in files]
    refuse_untrue(reports, now)
    rows = [row_from_report(r) for _, r in reports]
    with locked(path):
        current = load(path, init=init)
        kept, dropped = drop_rows(current.rows, drop)
        folded, not_taken = merge_rows(kept, rows)
        m = Matrix(rows=folded)
        if len(m.rows) < len(current.rows) - len(dropped):  # merge_rows only adds or replaces: a bug if it shrank
            raise MatrixError(f"refusing to write {path}: {len(m.rows)} rows after the merge, "
                              f"{len(current.rows) - len(dropped)} before it")
        write(m, path)
    return Merged(m, dropped, not_taken)
