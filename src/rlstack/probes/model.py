"""The probe result model: what every probe returns, and the JSON a run writes (`--json`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["pass", "fail", "skip"]
LAYERS: tuple[str, ...] = ("resolve", "contract", "toolchain", "runtime")
STATIC_LAYERS: tuple[str, ...] = ("resolve", "contract", "toolchain")


class Evidence(BaseModel):
    """One piece of evidence: a log excerpt, a source location (`file:line` inside a package), a command."""

    model_config = ConfigDict(extra="forbid")

    text: str
    package: str | None = None
    file: str | None = None
    line: int | None = None
    command: str | None = None

    def where(self) -> str:
        if self.file is None:
            return ""
        pkg = f"{self.package}: " if self.package else ""
        return f"{pkg}{self.file}:{self.line}" if self.line else f"{pkg}{self.file}"

    def render(self) -> str:
        parts = [p for p in (self.where(), self.text, f"$ {self.command}" if self.command else "") if p]
        return " | ".join(parts)


class ProbeResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    layer: str
    status: Status
    reason: str
    evidence: list[Evidence] = Field(default_factory=list)
    duration_s: float = 0.0
    signature: str | None = Field(default=None, description="wall id from signatures.yaml when the probe fails")
    fix: str | None = None
    undecided: bool = Field(
        default=False, description="a skip that leaves a wall undecided: the probe applies to this stack (its "
                                   "packages are locked) but could not read what decides it; never a pass")


class Environment(BaseModel):
    """The environment a runtime probe ran in (rlstack.probes.environment.capture): where, which versions,
    and how it departs from the stack's lock."""

    model_config = ConfigDict(extra="forbid")

    where: Literal["image", "native"]
    image: str | None = Field(None, description="the image's tag (RLSTACK_IMAGE) when where is 'image'")
    python: str
    executable: str = ""
    torch: str | None = None
    torch_cuda: str | None = None
    toolkit: str | None = None
    toolkit_from: str = ""
    versions: dict[str, str] = Field(default_factory=dict, description="torch and key packages as installed")
    lock_match: bool
    deviations: list[str] = Field(default_factory=list)
    fingerprint: str = Field(pattern=r"^[0-9a-f]{12}$")


class ProbeReport(BaseModel):
    """A run of probes for one stack on one (real or assumed) GPU arch: the unit compat_matrix rows come from."""

    model_config = ConfigDict(extra="forbid")

    stack: str
    lock_hash: str
    gpu_arch: str | None
    toolkit: str | None = Field(description="the CUDA toolkit (nvcc) the toolchain probes judged: the stack's pin")
    torch_cuda: str | None
    host_toolkit: str | None = Field(default=None, description="the nvcc of the machine (or environment) the "
                                                               "command ran in, which a runtime probe would use")
    driver: str | None = None
    host: str
    date: str
    layers: list[str]
    results: list[ProbeResult]
    duration_s: float
    environment: Environment | None = Field(
        default=None, description="what the runtime layer ran on (absent when no runtime probe ran)")

    @property
    def failed(self) -> list[ProbeResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def undecided(self) -> list[ProbeResult]:
        """Skipped probes that would have decided a wall: the verdict is 'undecided', never a pass."""
        return [r for r in self.results if r.status == "skip" and r.undecided]

    @property
    def exit_code(self) -> int:
        """1 when a probe failed, 3 when none failed but one that decides a wall could not run, else 0."""
        return 1 if self.failed else 3 if self.undecided else 0


def timed(probe_id: str, layer: str, fn: Callable[[], ProbeResult]) -> ProbeResult:
    """Run one probe, stamping its duration; an unexpected exception is a failed probe, not a crash of the
    whole run (its message is the evidence, so `diagnose` can still name it)."""
    t0 = time.perf_counter()
    try:
        res = fn()
    except Exception as exc:  # a probe's own crash is data for the verdict
        res = ProbeResult(id=probe_id, layer=layer, status="fail", reason=f"probe crashed: {type(exc).__name__}",
                          evidence=[Evidence(text=f"{type(exc).__name__}: {exc}"[:2000])])
    res.duration_s = round(time.perf_counter() - t0, 3)
    return res
