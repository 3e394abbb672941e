"""compat_matrix.yaml: what passes where. One row per (stack, lock hash, GPU arch, driver, toolkit,
source) holding each probe's status, evidence and wall, with the date and whether it was `measured` by
rlstack's probes or `reported` (copied from a cited report).

`merge` folds probe reports (`rlstack probe --json -o FILE` outputs, e.g. artifacts of several GPU
runners) into the file without losing rows: rows merge by key, probes within a row by id, and the whole
read-modify-write holds an exclusive fcntl lock so concurrent merges serialise. `render_markdown` makes the
README section (between `<!-- compat-matrix:start -->` and `<!-- compat-matrix:end -->`), `render_html`
a static page (docs/compat_matrix.html).
"""

from __future__ import annotations

import fcntl
import html
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlstack.core.errors import RlstackError
from rlstack.core.paths import project_root
from rlstack.probes.model import Environment, ProbeReport

MATRIX_FILE = "compat_matrix.yaml"
HTML_FILE = "docs/compat_matrix.html"
HEADER = ("# rlstack compatibility matrix: what passes where. Merged by 'invoke matrix' from probe JSON\n"
          "# (source: measured); rows with source: reported are copied from the report they cite.\n"
          "# Schema: rlstack.matrix.Matrix. Rendered into README.md and docs/compat_matrix.html.\n")


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


def matrix_path(root: Path | None = None) -> Path:
    return (root or project_root()) / MATRIX_FILE


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


def load(path: Path | None = None) -> Matrix:
    path = path or matrix_path()
    if not path.is_file():
        return Matrix()
    return parse(path.read_text(), path)


def dump(m: Matrix) -> str:
    rows = [r.model_dump(mode="json", exclude_none=True, exclude_defaults=False) for r in sorted_rows(m.rows)]
    return HEADER + yaml.safe_dump({"rows": rows}, sort_keys=False, allow_unicode=True, width=120)


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


def read_report(path: Path) -> ProbeReport:
    try:
        return ProbeReport.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise MatrixError(f"{path}: no such probe result file") from None
    except (ValueError, ValidationError) as exc:
        raise MatrixError(f"{path}: not a probe report (rlstack probe --json): {str(exc)[:400]}") from None


def merge(files: Iterable[Path], path: Path | None = None) -> Matrix:
    path = path or matrix_path()
    rows = [row_from_report(read_report(f)) for f in files]
    with locked(path):
        current = load(path)
        m = Matrix(rows=merge_rows(current.rows, rows))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(dump(m))
        os.replace(tmp, path)
    return m


# --- rendering -------------------------------------------------------------------------------------------

STATUS_MARK = {"pass": "pass", "fail": "FAIL", "skip": "skip"}  # words: emoji fonts are not everywhere


def _column(row: Row, probe_id: str) -> str:
    """One column for each stack's own resolve probe (its id carries the stack's name)."""
    return "resolve:(own stack)" if probe_id == f"resolve:{row.stack}" else probe_id


def _summary(r: Row) -> tuple[int, int, int, str]:
    n = {s: sum(p.status == s for p in r.probes) for s in ("pass", "fail", "skip")}
    walls = sorted({p.wall or p.id for p in r.probes if p.status == "fail"})
    return n["pass"], n["fail"], n["skip"], ", ".join(walls)


def env_label(r: Row) -> str:
    """How the environment that ran a row's runtime probes relates to its lock, in a few words."""
    env = r.environment
    if env is None:
        return "-"
    if env.lock_match:
        return f"{env.where}, = lock"
    return f"{env.where}, {len(env.deviations)} off-lock"


def render_markdown(m: Matrix) -> str:
    from rlstack.core.tables import markdown_table

    headers = ["stack", "lock", "GPU", "driver", "toolkit", "env", "source", "date", "pass", "fail", "skip", "walls"]
    rows = []
    for r in sorted_rows(m.rows):
        p, f, s, walls = _summary(r)
        src = r.source if r.source == "measured" else f"reported ([report]({r.cite}))"
        rows.append([r.stack, (r.lock_hash or "-")[:12], r.gpu_arch or "-", r.driver or "-", r.toolkit or "-",
                     env_label(r), src, r.date[:10], p, f, s, walls or "none"])
    note = ("Generated by `invoke matrix` from compat_matrix.yaml; full evidence per probe in "
            "[docs/compat_matrix.html](docs/compat_matrix.html). `env` says where runtime probes ran (the stack's "
            "image, or natively on a GPU host) and how many locked packages differed there; the page lists them.")
    return markdown_table(headers, rows) + "\n\n" + note + "\n"


def render_html(m: Matrix) -> str:
    e = html.escape
    rows = sorted_rows(m.rows)
    probe_ids = sorted({_column(r, p.id) for r in rows for p in r.probes}, key=lambda i: (
        ["resolve", "contract", "toolchain", "runtime"].index(i.split(":")[0]) if i.split(":")[0] in
        ("resolve", "contract", "toolchain", "runtime") else 9, i))
    head = "".join(f"<th class='probe'><span>{e(i)}</span></th>" for i in probe_ids)
    body = []
    for r in rows:
        cells = {_column(r, p.id): p for p in r.probes}
        tds = []
        for i in probe_ids:
            p = cells.get(i)
            if p is None:
                tds.append("<td class='none'></td>")
                continue
            tip = e(p.evidence + (f" (wall: {p.wall})" if p.wall else ""))
            tds.append(f"<td class='{p.status}' title='{tip}'>{STATUS_MARK[p.status]}"
                       f"{'<br><small>' + e(p.wall) + '</small>' if p.wall else ''}</td>")
        src = e(r.source) if r.source == "measured" else f"reported<br><small>{e(r.cite or '')}</small>"
        body.append(f"<tr><th>{e(r.stack)}</th><td><code>{e((r.lock_hash or '-')[:12])}</code></td>"
                    f"<td>{e(r.gpu_arch or '-')}</td><td>{e(r.driver or '-')}</td><td>{e(r.toolkit or '-')}</td>"
                    f"<td>{e(env_label(r))}</td><td>{src}</td><td>{e(r.date[:10])}</td>{''.join(tds)}</tr>")
    details = []
    for r in rows:
        items = "".join(f"<li class='{p.status}'><b>{e(p.id)}</b> {STATUS_MARK[p.status]} {e(p.evidence)}</li>"
                        for p in r.probes)
        if r.environment is not None:
            env = r.environment
            devs = "".join(f"<li>{e(d)}</li>" for d in env.deviations) or "<li>none: the environment is the lock</li>"
            vers = ", ".join(f"{e(k)} {e(v)}" for k, v in env.versions.items())
            items += (f"<li class='env'><b>environment</b> {e(env.where)}, Python {e(env.python)}, torch "
                      f"{e(env.torch or '-')} (CUDA {e(env.torch_cuda or '-')}), nvcc {e(env.toolkit or '-')} "
                      f"({e(env.toolkit_from)}); {vers}; fingerprint <code>{e(env.fingerprint)}</code>"
                      f"<br>differs from the lock:<ul>{devs}</ul></li>")
        details.append(f"<details><summary>{e(r.stack)} · {e(r.gpu_arch or '-')} · {e(env_label(r))} · {e(r.source)} · "
                       f"{e(r.date[:10])}</summary><ul>{items}</ul></details>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rlstack compatibility matrix</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: center; vertical-align: bottom; }}
th.probe {{ height: 220px; white-space: nowrap; padding: 0 4px; }}
th.probe span {{ writing-mode: vertical-rl; transform: rotate(180deg); font-weight: normal; font-size: 12px; }}
td.pass {{ background: #d9f2d9; }} td.fail {{ background: #f8d0d0; }} td.skip {{ background: #eee; color: #777; }}
td small {{ font-size: 10px; }} td {{ white-space: nowrap; }} td.fail {{ font-weight: bold; }}
li.fail {{ color: #900; }} li.skip {{ color: #777; }}
details {{ margin: .5em 0; }}
</style></head><body>
<h1>rlstack compatibility matrix</h1>
<p>Generated by <code>invoke matrix</code> from <code>compat_matrix.yaml</code> ({len(rows)} rows). Hover a cell
for its evidence. <b>measured</b> rows come from rlstack's probes; <b>reported</b> rows cite their source.</p>
<table><thead><tr><th>stack</th><th>lock</th><th>GPU</th><th>driver</th><th>toolkit</th><th>env</th><th>source</th><th>date</th>
{head}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table>
<h2>Evidence</h2>
{chr(10).join(details)}
</body></html>
"""


def render(m: Matrix | None = None, root: Path | None = None, readme: bool = True) -> list[Path]:
    """Write the README section and the HTML page; returns the files written."""
    from rlstack.host.docs import replace_section

    root = root or project_root()
    m = m or load(matrix_path(root))
    out = []
    html_path = root / HTML_FILE
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(render_html(m))
    out.append(html_path)
    if readme:
        path = root / "README.md"
        text = path.read_text()
        new = replace_section(text, "compat-matrix", render_markdown(m))
        if new != text:
            path.write_text(new)
        out.append(path)
    return out
