"""The compat matrix's schema: one row per (stack, lock hash, GPU arch, driver, toolkit, source, environment)
holding each probe's status, evidence and wall, with the date, how its results were decided (`decided`: read
from the locked wheels with no GPU, or run on a GPU, and there where), and what kind of evidence the row is:
`predicted` (static results only: no GPU ran them), `measured` (rlstack's runtime probes ran on that GPU) or
`reported` (copied from a cited report). `parse` validates a file; `row_from_report` turns a probe report
(`rlstack probe --json`) into a row.

Rows written before `decided` existed are migrated when they are read (`Row._migrate`): the field is filled from
what the row already says, and a `measured` row of static results only becomes `predicted`. Evidence never keeps
a path of the machine that probed (`portable_text`): a matrix is committed, and /root/.pyenv or /tmp/site-fp8
say nothing to a reader on another machine."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlstack.core.errors import RlstackError
from rlstack.probes.model import Environment, ProbeReport

MATRIX_FILE = "compat_matrix.yaml"


class MatrixError(RlstackError):
    exit_code = 7


# --- machine-local paths ---------------------------------------------------------------------------------------

# An absolute path inside evidence text. Not one that follows a word, a dot or a slash (a URL's '//host/x', a
# relative 'a/b', '12.8/12.9'), nor one already shortened here ('<site-packages>/x', '.../x'), so that
# portable_text is idempotent.
_ABS_PATH = re.compile(r"(?<![\w.~/<>-])/(?:[\w.+-]+/)*[\w.+-]+")
_STAGED_SITE = re.compile(r"^/tmp/site-[^/]+/")  # a native run's PYTHONPATH (rlstack host native-stage)
# The same on every Linux machine: device nodes, the system toolkit (/usr/local/cuda), the driver's libraries.
_SYSTEM = ("/dev/", "/proc/", "/sys/", "/usr/", "/etc/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/var/", "/run/")
SITE = "<site-packages>"
# Paths inside the stacks' images (images/Dockerfile: the venv, the project, CUDA_HOME): the same on every machine.
IMAGE_PATHS = ("/opt/venv/", "/opt/rlstack/", "/opt/cuda/")


def portable_path(path: str) -> str:
    """An absolute path as it may be committed: a file of an installed package as `<site-packages>/pkg/...`, an
    executable (a venv's python3, a pyenv shim) by its name, a system path as it is, anything else by its last
    two parts (`.../wheels/x.whl`); the probing machine's home, venv and staging folders leave."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return f"{SITE}/{path.split(marker, 1)[1]}"
    if m := _STAGED_SITE.match(path):
        return f"{SITE}/{path[m.end():]}"
    if path.startswith(_SYSTEM) or (path + "/").startswith(IMAGE_PATHS):
        return path
    parts = path.strip("/").split("/")
    if len(parts) == 1:
        return path
    if parts[-2] in ("bin", "shims"):
        return parts[-1]
    return ".../" + "/".join(parts[-2:])


def portable_text(text: str) -> str:
    """`text` with every absolute path of the probing machine made portable (portable_path)."""
    return _ABS_PATH.sub(lambda m: portable_path(m[0]), text)


# --- time ------------------------------------------------------------------------------------------------------


def when(date: str) -> datetime:
    """A row's or report's date as an aware datetime (a date alone is its midnight, no zone is UTC): merges
    order results by it, and strings do not compare '2026-12-03' with '2026-12-03T10:00:00+02:00'."""
    t = datetime.fromisoformat(date)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


# --- the model -------------------------------------------------------------------------------------------------


class ProbeCell(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    status: Literal["pass", "fail", "skip"]
    evidence: str = ""
    wall: str | None = None
    date: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}", description=(
        "when this result was decided, where that is older than its row's date (a later merge moved the row on "
        "and kept this result); absent: the row's date"))

    @field_validator("evidence")
    @classmethod
    def _portable(cls, text: str) -> str:
        return portable_text(text)


class Decided(BaseModel):
    """How a row's results were decided: `static` (read from the locked wheels, no GPU) or `runtime` (at least
    one runtime probe ran on that GPU; the row's static probes, if any, still read wheels). For runtime, where:
    `image` (the stack's image, with its tag where the report names it), `native` (a host's own Python, with
    every way it departs from the lock) or `report` (the cited report's own machine)."""

    model_config = ConfigDict(extra="forbid")

    how: Literal["static", "runtime"]
    where: Literal["image", "native", "report"] | None = Field(
        default=None, description="runtime only; absent on runtime rows measured before it was recorded")
    image: str | None = Field(default=None, description="the image's tag, for where = image")
    deviations: list[str] = Field(default_factory=list, description="lock pins the environment did not satisfy")

    @model_validator(mode="after")
    def _consistent(self) -> Decided:
        if self.how == "static" and (self.where or self.image or self.deviations):
            raise ValueError("a static result ran nowhere: no 'where', 'image' or 'deviations'")
        if self.image and self.where != "image":
            raise ValueError("'image' names the image a result ran in: only with where = image")
        return self

    def label(self) -> str:
        """A few words for a table: 'static (wheels, no GPU)', 'image TAG', 'native, 4 off-lock', ..."""
        if self.how == "static":
            return "static (wheels, no GPU)"
        off = f", {len(self.deviations)} off-lock" if self.deviations else ""
        if self.where == "image":
            return f"image {self.image or '(tag not recorded)'}{off}"
        if self.where == "native":
            return f"native{off or ', = lock'}"
        if self.where == "report":
            return "the report's machine"
        return "runtime (where not recorded)"


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def derive_decided(source: str, probes: Iterable[Any], environment: Any) -> Decided:
    """What a row's own fields say about how it was decided (probes and environment as models or as the dicts
    of a file): runtime when a runtime probe ran (not only skipped), there where its environment says."""
    ran = any(str(_get(p, "id") or "").startswith("runtime:") and _get(p, "status") != "skip" for p in probes)
    if not ran:
        return Decided(how="static")
    if source == "reported":
        return Decided(how="runtime", where="report")
    where = _get(environment, "where") if environment is not None else None
    if where not in ("image", "native"):
        return Decided(how="runtime")
    devs = _get(environment, "deviations")
    image = _get(environment, "image") if where == "image" else None
    return Decided(how="runtime", where=where, image=image if isinstance(image, str) and image else None,
                   deviations=[str(d) for d in devs] if isinstance(devs, list) else [])


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stack: str = Field(min_length=1)
    lock_hash: str | None = Field(None, pattern=r"^[0-9a-f]{12,64}$")
    gpu_arch: str | None = Field(None, pattern=r"^sm_\d{2,3}a?$")
    driver: str | None = None
    toolkit: str | None = None
    source: Literal["predicted", "measured", "reported"]
    decided: Decided
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}")
    host: str | None = None
    cite: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    environment: Environment | None = Field(
        default=None, description="what runtime probes ran on; rows from different environments never merge")
    probes: list[ProbeCell] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        """A row without `decided` (written before it existed) gains it from what it says; a `measured` row
        whose results are all static becomes `predicted`, since no GPU ran it. Malformed rows pass through to
        the field checks, which name the field."""
        if not isinstance(data, dict) or "decided" in data or not isinstance(data.get("probes", []), list):
            return data
        decided = derive_decided(str(data.get("source")), data.get("probes", []), data.get("environment"))
        data = {**data, "decided": decided}
        if data.get("source") == "measured" and decided.how == "static":
            data["source"] = "predicted"
        return data

    @model_validator(mode="after")
    def _provenance(self) -> Row:
        if self.source == "reported" and not self.cite:
            raise ValueError("a reported row must cite its report (field 'cite')")
        if self.source != "reported" and not self.lock_hash:
            raise ValueError(f"a {self.source} row must name the lock it probed (field 'lock_hash')")
        if self.source == "measured" and self.decided.how != "runtime":
            raise ValueError("a measured row holds a runtime result; static results only are 'predicted'")
        if self.source == "predicted" and self.decided.how != "static":
            raise ValueError("a predicted row holds static results only; a runtime result is 'measured'")
        ran = derive_decided(self.source, self.probes, self.environment).how
        if ran != self.decided.how:
            raise ValueError(f"decided.how is '{self.decided.how}' but the row's probes say '{ran}' (runtime: a "
                             "runtime probe ran, not only skipped)")
        env = self.environment
        if env is not None and self.decided.how == "runtime" and self.decided.deviations != env.deviations:
            raise ValueError("decided.deviations must be the environment's deviations (what ran differs from the lock)")
        ids = [p.id for p in self.probes]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate probe ids: {', '.join(dup)}")
        if self.environment is not None and self.environment.executable:
            exe = portable_text(self.environment.executable)
            if exe != self.environment.executable:
                self.environment = self.environment.model_copy(update={"executable": exe})
        return self

    @property
    def key(self) -> tuple[str, str, str, str, str, str, str]:
        return (self.stack, self.lock_hash or "", self.gpu_arch or "", self.driver or "", self.toolkit or "",
                self.source, self.environment.fingerprint if self.environment else "")

    def label(self) -> str:
        """The row as messages name it: stack, lock prefix, arch, source."""
        return f"{self.stack} {(self.lock_hash or '-')[:12]} {self.gpu_arch or '-'} {self.source}"


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
    """A report's row: `measured` when a runtime probe ran on its GPU, else `predicted`. Failures the probe
    could not name are matched again against today's signatures: a wall learned after a run (from that run's
    own log, say) names the evidence it was learned from."""
    from rlstack.probes import signatures

    cells = []
    for r in (signatures.match_result(res.model_copy(deep=True)) for res in report.results):
        ev = "; ".join(e.render() for e in r.evidence[:3])
        text = portable_text(r.reason + (f" [{ev}]" if ev else ""))
        cells.append(ProbeCell(id=r.id, status=r.status, evidence=text[:600], wall=r.signature))
    decided = derive_decided("measured", cells, report.environment)
    return Row(stack=report.stack, lock_hash=report.lock_hash, gpu_arch=report.gpu_arch, driver=report.driver,
               toolkit=report.toolkit, source="measured" if decided.how == "runtime" else "predicted",
               decided=decided, date=report.date, host=report.host, probes=cells, environment=report.environment)


def read_report(path: Path) -> ProbeReport:
    try:
        return ProbeReport.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise MatrixError(f"{path}: no such probe result file") from None
    except OSError as exc:  # a folder, no permission
        raise MatrixError(f"{path}: cannot read it as a probe result file: {exc.strerror or exc}",
                          "pass the JSON file that rlstack probe -o FILE wrote") from None
    except (ValueError, ValidationError) as exc:
        raise MatrixError(f"{path}: not a probe report (rlstack probe --json): {str(exc)[:400]}") from None
