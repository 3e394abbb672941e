"""Failure signatures: known failure patterns (signatures.yaml) applied to any log.

`diagnose(text)` returns every signature that matches, with the first matching line, so a user's own crash
log is named with the wall and its fix. Probes attach the id of the wall they found; `match_result` also
runs the patterns over a failed probe's own evidence, so a probe that crashed gets a name too.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlstack.core.errors import RlstackError
from rlstack.probes.model import ProbeResult

SIGNATURES_FILE = Path(__file__).with_name("signatures.yaml")


class Signature(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    pattern: str
    title: str
    explanation: str
    fix: str
    source: str | None = None
    probe_fixed: str | None = Field(
        default=None,
        description="UTC time (ISO 8601) from which rlstack's own probes no longer meet this wall, for a wall whose "
                    "fault was rlstack's probe setup (its tiny model, say), not the stack: a runtime row measured "
                    "before it does not count against the stack's verdict and is listed as to be measured again")

    @field_validator("probe_fixed")
    @classmethod
    def _iso(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                _dt.datetime.fromisoformat(v)
            except ValueError:
                raise ValueError(f"not an ISO 8601 time: {v!r} (e.g. 2026-12-03T20:00:00Z)") from None
        return v

    def superseded(self, measured: str) -> bool:
        """True when rlstack's probes stopped meeting this wall after a row measured at `measured` (ISO time)."""
        if self.probe_fixed is None:
            return False
        try:
            return _dt.datetime.fromisoformat(measured) < _dt.datetime.fromisoformat(self.probe_fixed)
        except ValueError:  # a row without a usable time: not known to be older, so it still counts
            return False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regex: {exc}") from None
        return v

    @property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


@dataclass(frozen=True)
class Match:
    signature: Signature
    line: int
    excerpt: str


def load(path: Path = SIGNATURES_FILE) -> list[Signature]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RlstackError(f"{path}: not valid YAML: {exc}") from None
    out = []
    for n, item in enumerate(data.get("signatures", [])):
        try:
            out.append(Signature.model_validate(item))
        except ValidationError as exc:
            e = exc.errors()[0]
            raise RlstackError(f"{path}: signature #{n} ({item.get('id', '?') if isinstance(item, dict) else '?'}): "
                               f"field '{'.'.join(map(str, e['loc']))}': {e['msg']}") from None
    ids = [s.id for s in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise RlstackError(f"{path}: duplicate signature ids: {', '.join(dup)}")
    return out


@cache
def default() -> tuple[Signature, ...]:
    return tuple(load())


def by_id(wall: str) -> Signature | None:
    return next((s for s in default() if s.id == wall), None)


def diagnose(text: str, signatures: tuple[Signature, ...] | list[Signature] | None = None) -> list[Match]:
    """Every signature that matches the log, in the order of its first match."""
    sigs = default() if signatures is None else signatures
    lines = text.splitlines()
    found = []
    for sig in sigs:
        rx = sig.regex
        for n, line in enumerate(lines, 1):
            if rx.search(line):
                found.append(Match(sig, n, line.strip()[:300]))
                break
        else:
            if rx.search(text):  # a pattern spanning lines
                found.append(Match(sig, 0, rx.search(text).group()[:300]))  # type: ignore[union-attr]
    return sorted(found, key=lambda m: m.line)


def match_result(res: ProbeResult) -> ProbeResult:
    """Give a failed probe without a wall id the first signature its reason/evidence matches."""
    if res.status != "fail" or res.signature:
        return res
    text = "\n".join([res.reason, *(e.text for e in res.evidence)])
    hits = diagnose(text)
    if hits:
        res.signature = hits[0].signature.id
        res.fix = res.fix or hits[0].signature.fix
    return res
