"""compat_matrix.yaml on disk: read, merged and written without losing a row.

`merge` folds probe reports (e.g. artifacts of several GPU runners) into the file: rows merge by key, probes
within a row by id, and the whole read-modify-write holds an exclusive fcntl lock so concurrent merges
serialise. A missing or empty matrix is refused (it would empty the README table and the page) unless the
caller asks to start one (`init`), and a write never holds fewer rows than the read did unless rows were
dropped by name (`drop`).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

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
)

HEADER = ("# rlstack compatibility matrix: what passes where. Merged by 'invoke matrix' from probe JSON\n"
          "# (source: measured); rows with source: reported are copied from the report they cite.\n"
          "# Schema: rlstack.matrix.schema.Matrix. Rendered into README.md and docs/compat_matrix.html.\n")
INIT_HINT = "start a new matrix with: invoke matrix --init (then merge results into it)"


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


def merge_rows(existing: list[Row], incoming: Iterable[Row]) -> list[Row]:
    """Rows merge by key; inside a row, probes merge by id (the newer result wins) and the date is the
    newest. Nothing that is not replaced is dropped."""
    by_key = {r.key: r for r in existing}
    for new in incoming:
        old = by_key.get(new.key)
        if old is None:
            by_key[new.key] = new
            continue
        probes = {p.id: p for p in old.probes}
        newer = new.date >= old.date
        for p in new.probes:
            if newer or p.id not in probes:
                probes[p.id] = p
        by_key[new.key] = old.model_copy(update={"probes": list(probes.values()), "date": max(old.date, new.date),
                                                 "host": new.host or old.host})
    return sorted_rows(by_key.values())


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


def merge(files: Iterable[Path], path: Path | None = None, *, init: bool = False,
          drop: Iterable[str] = ()) -> tuple[Matrix, list[Row]]:
    """Fold probe reports into the matrix file; returns the new matrix and the rows dropped by `drop`."""
    path = path or matrix_path()
    rows = [row_from_report(read_report(f)) for f in files]
    with locked(path):
        current = load(path, init=init)
        kept, dropped = drop_rows(current.rows, drop)
        m = Matrix(rows=merge_rows(kept, rows))
        if len(m.rows) < len(current.rows) - len(dropped):  # merge_rows only adds or replaces: a bug if it shrank
            raise MatrixError(f"refusing to write {path}: {len(m.rows)} rows after the merge, "
                              f"{len(current.rows) - len(dropped)} before it")
        write(m, path)
    return m, dropped
