"""One schema for every benchmark result under bench/results: what ran, where, when, and the rows.

The pages that quote numbers (docs/performance.md, the README's results table) are rendered from these files
alone (rlstack.host.docs), so a number has one home: the JSON its run wrote. Every bench script writes through
`write` and every reader goes through `read`, so a file that does not fit the schema fails where it is written
or read, with its path, instead of in a rendering later.

Writing one, from any script (pydantic is the only dependency beyond the standard library)::

    from rlstack.core import results
    results.write(results.Result(
        question="probe-speed", title="invoke probe-fp8, no GPU",
        ran=results.Ran(command="invoke probe-fp8 --json", bench="probe-fp8"),
        where=results.Where.detect(environment="host"),
        columns=["run", "wall_s"], rows=[{"run": "warm", "wall_s": 0.58}],
    ), "probe_fp8")                     # -> bench/results/probe_fp8.json
"""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import write_atomic
from rlstack.core.paths import project_root

SCHEMA = 1

# The questions docs/performance.md answers, in its order: a result names the one it answers.
QUESTIONS: dict[str, str] = {
    "rollouts": "Rollouts: fastgen against its peers",
    "grpo-step": "One GRPO step per stack",
    "learning": "Learning per stack: train, then evaluate",
    "fidelity": "Does fastgen compute the policy's function?",
    "engine-profile": "Inside fastgen's decode step",
    "probe-speed": "Probe speed",
    "image-builds": "Image builds",
    "evaluation": "Evaluation throughput",
    "staging": "Carrying a lock to a GPU host without network",
    "reliability": "Bad inputs: what each command line does with them",
}


class ResultError(RlstackError):
    """A results file that is missing, is not JSON, or does not fit the schema."""

    exit_code = 10


class Ran(BaseModel):
    """What ran: the command to type again, and what it ran on."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(description="the command line, as a user types it to rerun this measurement")
    bench: str = Field(description="the benchmark's name in `invoke bench NAME`")
    stack: str | None = Field(None, description="the stack whose lock the libraries came from (None: the host's)")
    lock_hash: str | None = Field(None, description="that lock's hash (12 or more hex digits)")
    engine: str | None = Field(None, description="the loader or rollout engine the rows compare, when one")
    options: dict[str, Any] = Field(default_factory=dict, description="options that differ from the defaults")


class Where(BaseModel):
    """Where it ran: the card and driver, and the environment (an image tag, native from a lock, or the host)."""

    model_config = ConfigDict(extra="forbid")

    gpu: str | None = Field(None, description="the GPU's name (None: CPU only)")
    driver: str | None = None
    environment: str = Field(
        description="'image rlstack/<stack>:<tag>', 'native' (a lock's wheels on a GPU "
        "host) or 'host' (this machine's own Python)"
    )
    deviations: list[str] = Field(default_factory=list, description="where the environment departs from the lock")
    machine: str | None = Field(None, description="what else bounds the numbers (cores, shared load)")

    @classmethod
    def detect(cls, environment: str, deviations: list[str] | None = None, machine: str | None = None) -> Where:
        """This machine's first GPU and driver as nvidia-smi reports them (none when it is absent)."""
        gpu = driver = None
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout
            first = out.strip().splitlines()[0] if out.strip() else ""
            if "," in first:
                gpu, driver = (part.strip() for part in first.split(",", 1))
        except (OSError, subprocess.SubprocessError):
            pass
        return cls(gpu=gpu, driver=driver, environment=environment, deviations=deviations or [], machine=machine)


class Erratum(BaseModel):
    """A defect of rlstack's own under which a run measured, found after it ran. The numbers stay as measured (they
    are what that code did); every page that shows them names the defect and the commit that fixed it, so a reader
    does not take them for what the fixed code does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    defect: str = Field(description="what was wrong, in one line")
    fixed_in: str = Field(description="the commit that fixed it")

    def text(self) -> str:
        return f"measured before {self.fixed_in} fixed: {self.defect}"


class Result(BaseModel):
    """One run of one benchmark. `columns` are the row keys the pages show, in order; `metric` and `baseline`
    give the ratio column (each row's metric over the baseline row's, the peer measured in the same run)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    question: str = Field(description="which table of docs/performance.md: a key of QUESTIONS")
    title: str = Field(description="one line: what was measured")
    ran: Ran
    where: Where
    date: str = Field(
        default_factory=lambda: _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        description="when it ran, ISO 8601",
    )
    columns: list[str]
    rows: list[dict[str, Any]]
    metric: str | None = Field(
        None, description="the column the ratio divides (higher is better unless `lower_is_better`)"
    )
    lower_is_better: bool = False
    baseline: dict[str, Any] | None = Field(None, description="the row the ratio divides by, as key: value pairs")
    group_by: str | None = Field(
        None,
        description="compare each row with the baseline row of the same value here "
        "(a batch size): the peer at the same load",
    )
    headline: dict[str, Any] | None = Field(None, description="the row the README's short table quotes")
    notes: str = ""
    errata: list[Erratum] = Field(default_factory=list, description="defects found after the run (Erratum)")
    extra: dict[str, Any] = Field(default_factory=dict, description="everything else the run recorded")
    migrated_from: str | None = Field(None, description="the pre-schema file this was converted from, if any")

    @field_validator("question")
    @classmethod
    def _known_question(cls, value: str) -> str:
        if value not in QUESTIONS:
            raise ValueError(f"unknown question {value!r}; choose one of {', '.join(QUESTIONS)}")
        return value

    @field_validator("date")
    @classmethod
    def _iso_date(cls, value: str) -> str:
        _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return value

    def row_matching(self, selector: dict[str, Any] | None) -> dict[str, Any] | None:
        """The first row whose values equal every pair of `selector`."""
        if not selector:
            return None
        return next((r for r in self.rows if all(r.get(k) == v for k, v in selector.items())), None)

    def ratio(self, row: dict[str, Any]) -> float | None:
        """`row`'s metric against the baseline row's, oriented so that > 1 means better than the peer."""
        selector = dict(self.baseline or {})
        if self.group_by and selector:
            selector[self.group_by] = row.get(self.group_by)
        base = self.row_matching(selector)
        if self.metric is None or base is None:
            return None
        mine, theirs = row.get(self.metric), base.get(self.metric)
        if not isinstance(mine, int | float) or not isinstance(theirs, int | float) or not mine or not theirs:
            return None
        return float(theirs / mine if self.lower_is_better else mine / theirs)


def results_dir() -> Path:
    return project_root() / "bench" / "results"


def path_for(name: str, folder: Path | None = None) -> Path:
    """bench/results/<name>.json (a name with a folder or suffix is taken as a path)."""
    p = Path(name)
    return p if p.suffix == ".json" or p.is_absolute() else (folder or results_dir()) / f"{name}.json"


def write(result: Result, name: str, folder: Path | None = None) -> Path:
    """Validate and write `result` as bench/results/<name>.json (or under `folder`); the path written."""
    path = path_for(name, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(
        path,
        json.dumps(Result.model_validate(result.model_dump()).model_dump(mode="json"), indent=2, default=str) + "\n",
    )


def read(path: Path) -> Result:
    """One results file, validated; a file that is not one names itself and what to do."""
    try:
        return Result.model_validate_json(path.read_text())
    except FileNotFoundError as exc:
        raise ResultError(f"no results file {path}", "run the benchmark: invoke bench --help lists them") from exc
    except ValidationError as exc:
        raise ResultError(
            f"{path} does not fit the results schema: {exc}",
            "rewrite it through rlstack.core.results.write (bench/README.md shows how)",
        ) from exc


def load_all(folder: Path | None = None) -> list[tuple[Path, Result]]:
    """Every results file directly under `folder` (default bench/results; archive/ is not read), by name."""
    folder = folder or results_dir()
    return [(p, read(p)) for p in sorted(folder.glob("*.json"))]
