"""The compat matrix's schema: one row per (stack, lock hash, GPU arch, driver, toolkit, source, environment)
holding each probe's status, evidence and wall, with the date and whether it was `measured` by rlstack's
probes or `reported` (copied from a cited report). `parse` validates a file; `row_from_report` turns a probe
report (`rlstack probe --json`) into a row."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlstack.core.errors import RlstackError
from rlstack.probes.model import Environment, ProbeReport

MATRIX_FILE = "compat_matrix.yaml"


class MatrixError(RlstackError):
    exit_code = 7


class ProbeCell(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    status: Literal["pass", "fail", "skip"]
    evidence: str = ""
    wall: str | None = None


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stack: str = Field(min_length=1)
    lock_hash: str | None = Field(None, pattern=r"^[0-9a-f]{12,64}$")
    gpu_arch: str | None = Field(None, pattern=r"^sm_\d{2,3}a?$")
    driver: str | None = None
    toolkit: str | None = None
    source: Literal["measured", "reported"]
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}")
    host: str | None = None
    cite: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    environment: Environment | None = Field(
        default=None, description="what runtime probes ran on; rows from different environments never merge")
    probes: list[ProbeCell] = Field(default_factory=list)

    @model_validator(mode="after")
    def _provenance(self) -> Row:
        if self.source == "reported" and not self.cite:
            raise ValueError("a reported row must cite its report (field 'cite')")
        if self.source == "measured" and not self.lock_hash:
            raise ValueError("a measured row must name the lock it measured (field 'lock_hash')")
        ids = [p.id for p in self.probes]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate probe ids: {', '.join(dup)}")
        return self

    @property
    def key(self) -> tuple[str, str, str, str, str, str, str]:
        return (self.stack, self.lock_hash or "", self.gpu_arch or "", self.driver or "", self.toolkit or "",
                self.source, self.environment.fingerprint if self.environment else "")


class Matrix(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: list[Row] = Field(default_factory=list)


def parse(text: str, path: Path | str = MATRIX_FILE) -> Matrix:
    """Validate a matrix file; errors name the row (index and stack) and the field."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise MatrixError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise MatrixError(f"{path}: expected a mapping with a 'rows' list")
    try:
        return Matrix.model_validate(data)
    except ValidationError as exc:
        msgs = []
        for e in exc.errors():
            loc = list(e["loc"])
            where = "(file)"
            if len(loc) >= 2 and loc[0] == "rows" and isinstance(loc[1], int):
                rows = data.get("rows") or []
                stack = rows[loc[1]].get("stack", "?") if isinstance(rows[loc[1]], dict) else "?"
                field = ".".join(str(x) for x in loc[2:]) or "(row)"
                where = f"row {loc[1]} (stack {stack}): field '{field}'"
            elif loc:
                where = f"field '{'.'.join(map(str, loc))}'"
            msgs.append(f"{path}: {where}: {e['msg']}")
        raise MatrixError("\n".join(msgs), f"fix {path} (schema: rlstack.matrix.Row)") from None


def sorted_rows(rows: Iterable[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.stack, r.gpu_arch or "", r.source, r.date, r.key))


def row_from_report(report: ProbeReport) -> Row:
    """A report's row. Failures the probe could not name are matched again against today's signatures: a
    wall learned after a run (from that run's own log, say) names the evidence it was learned from."""
    from rlstack.probes import signatures

    cells = []
    for r in (signatures.match_result(res.model_copy(deep=True)) for res in report.results):
        ev = "; ".join(e.render() for e in r.evidence[:3])
        text = r.reason + (f" [{ev}]" if ev else "")
        cells.append(ProbeCell(id=r.id, status=r.status, evidence=text[:600], wall=r.signature))
    return Row(stack=report.stack, lock_hash=report.lock_hash, gpu_arch=report.gpu_arch, driver=report.driver,
               toolkit=report.toolkit, source="measured", date=report.date, host=report.host, probes=cells,
               environment=report.environment)


def read_report(path: Path) -> ProbeReport:
    try:
        return ProbeReport.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise MatrixError(f"{path}: no such probe result file") from None
    except (ValueError, ValidationError) as exc:
        raise MatrixError(f"{path}: not a probe report (rlstack probe --json): {str(exc)[:400]}") from None
