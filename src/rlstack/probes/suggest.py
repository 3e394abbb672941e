"""`--suggest`: a bounded search over nearby versions of a stack's top-level packages for the closest
combination that passes every static probe (resolve, contract, toolchain).

Candidates vary the stack's pinned top-level packages (the locked version, the next few newer and one
older release, or 'let the resolver choose'); torch is left to the packages (vLLM pins it), and the CUDA
toolkit is not searched but fixed up: each candidate gets the smallest nvcc that the toolchain rules
(read from the candidate's own flashinfer) accept for the target arch and its torch's CUDA major.
Candidates are tried in order of distance from the lock (version steps summed) until one passes or the
bound is reached. Each resolution and each wheel is cached, so a repeated search is fast.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from rlstack.core.fileio import write_atomic
from rlstack.core.pkgnames import normalize, requirement_name
from rlstack.host import locks
from rlstack.host.stacks import Stack, load_stack
from rlstack.probes import toolchain
from rlstack.probes.model import ProbeResult
from rlstack.probes.wheels import INDEX_URL, WheelCache, _get, cache_dir

FINAL_RE = re.compile(r"^\d+(\.\d+)*(\.post\d+)?$")
NVCC = {"12": "nvidia-cuda-nvcc-cu12", "13": "nvidia-cuda-nvcc"}


def vkey(v: str) -> Version:
    """Release order as installers see it (PEP 440): 1.0 < 1.0.post1 < 1.0.1, where comparing the numbers
    alone would put 1.0.post1 level with 1.0.1."""
    return Version(v)


def index_versions(name: str, max_age_s: float = 86400) -> list[str]:
    """Final releases of a package on the index, oldest first (PEP 691 'versions'; cached a day)."""
    path = cache_dir() / "index" / f"{normalize(name)}.versions.json"
    if path.is_file() and time.time() - path.stat().st_mtime < max_age_s:
        return list(json.loads(path.read_text()))
    with _get(f"{INDEX_URL}/{normalize(name)}/", "application/vnd.pypi.simple.v1+json") as resp:
        data = json.load(resp)
    versions = data.get("versions") or sorted({f["filename"].split("-")[1] for f in data.get("files", [])
                                                if f["filename"].endswith(".whl")})
    finals = sorted((v for v in versions if FINAL_RE.match(v)), key=vkey)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finals))
    return finals


def nearby(versions: list[str], current: str, newer: int, older: int) -> list[str]:
    """current, then alternately the next newer / older releases (closest first)."""
    if current not in versions:
        return [current]
    i = versions.index(current)
    ups, downs = versions[i + 1 : i + 1 + newer], list(reversed(versions[max(0, i - older) : i]))
    out = [current]
    for a, b in itertools.zip_longest(ups, downs):
        out += [x for x in (a, b) if x]
    return out


@dataclass
class Candidate:
    pins: dict[str, str | None]  # package -> version, or None = resolver's choice at or above the lock's
    distance: int
    toolkit: str | None = None
    toolkit_package: str | None = None
    torch: str | None = None
    results: list[ProbeResult] = field(default_factory=list)
    resolved: dict[str, str] = field(default_factory=dict)

    must_pass: set[str] = field(default_factory=set)

    @property
    def passed(self) -> bool:
        """No probe fails, and every probe that failed on the lock now passes: one that is skipped (its
        package or its install site is gone) is not evidence that the wall is gone."""
        status = {r.id: r.status for r in self.results}
        return bool(self.results) and all(r.status != "fail" for r in self.results) and \
            all(status.get(p) == "pass" for p in self.must_pass)

    def describe(self) -> str:
        parts = [f"{k}=={self.resolved.get(k, v) or '?'}" + ("" if v else " (resolver's pick, >= locked)")
                 for k, v in self.pins.items()]
        if self.torch:
            parts.append(f"torch=={self.torch}")
        if self.toolkit:
            parts.append(f"{self.toolkit_package}=={self.toolkit}")
        return ", ".join(parts)


def _pinned_top_level(stack: Stack) -> dict[str, str]:
    """{package: locked version} for the stack's top-level requirements that pin or bound a version."""
    locked = locks.locked_versions(stack)
    out = {}
    for line in stack.top_level:
        req = Requirement(line)
        name = normalize(req.name)
        if req.specifier and name in locked:
            out[name] = locked[name]
    return out


def candidates(stack: Stack, *, newer: int = 3, older: int = 1) -> list[Candidate]:
    base = _pinned_top_level(stack)
    axes: list[list[tuple[str | None, int]]] = []
    names = list(base)
    for name in names:
        vs = index_versions(name)
        near = nearby(vs, base[name], newer, older)
        opts: list[tuple[str | None, int]] = [
            (v, abs(vs.index(v) - vs.index(base[name])) if v in vs else 0) for v in near]
        opts.append((None, 1))  # let the resolver choose (newest compatible): one move
        axes.append(opts)
    out = []
    for combo in itertools.product(*axes):
        out.append(Candidate(pins={n: v for n, (v, _) in zip(names, combo, strict=True)},
                             distance=sum(d for _, d in combo)))
    # closest first; at equal distance the resolver's picks first (the newest compatible releases are the
    # likeliest to agree with each other), then lower versions
    out.sort(key=lambda c: (c.distance, -sum(v is None for v in c.pins.values()),
                            [vkey(v or "999") for v in c.pins.values()]))
    return out


def _requirements(stack: Stack, cand: Candidate, toolkit_pin: str | None) -> list[str]:
    """The candidate's requirements: a chosen version is pinned; 'resolver's pick' is bounded below by the
    locked version, so the search never wanders back to ancient releases that merely lack the checked code."""
    locked = locks.locked_versions(stack)
    reqs = []
    for line in stack.top_level:
        name = requirement_name(line)
        if name in cand.pins:
            v = cand.pins[name]
            reqs.append(f"{name}=={v}" if v else f"{name}>={locked[name]}")
        else:
            reqs.append(line)
    if toolkit_pin:
        reqs.append(toolkit_pin)
    return [*reqs, *locks.project_dependencies(stack.folder.parent.parent)]


def _resolve(reqs: list[str], python: str, platform: str, hashes: bool) -> locks.Resolution:
    """lock.resolve, cached by its input (a search re-visits the same resolutions)."""
    import hashlib

    key = hashlib.sha256(json.dumps([sorted(reqs), python, platform, hashes]).encode()).hexdigest()
    path = cache_path() / f"{key}.json"
    if path.is_file():
        d = json.loads(path.read_text())
        return locks.Resolution(d["ok"], d["text"], d["command"])
    res = locks.resolve(reqs, python, platform, hashes=hashes)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"ok": res.ok, "text": res.text, "command": res.command}))
    return res


def _min_toolkit(rules: list[toolchain.Rule], gpu_arch: str) -> str | None:
    """The threshold the stack's current flashinfer states for this arch (read from the wheel later per
    candidate; this only picks a starting toolkit)."""
    return "12.9" if any(r.kind == "min_toolkit" and toolchain.arch_major(gpu_arch) in r.arch_majors
                         for r in rules) else None


def pick_toolkit(torch_cuda: str | None, need: str | None, current: str | None, current_pkg: str | None
                 ) -> tuple[str | None, str | None]:
    """Keep the stack's nvcc when it satisfies `need`; else the smallest nvcc release >= need of the CUDA
    major torch is built for (a cu13 torch gets a CUDA 13 nvcc)."""
    if current and (need is None or toolchain.version_tuple(current) >= toolchain.version_tuple(need)):
        return current, current_pkg
    major = (torch_cuda or "12").split(".")[0]
    pkg = NVCC.get(major)
    if pkg is None:
        return current, current_pkg
    vs = [v for v in index_versions(pkg) if need is None or toolchain.version_tuple(v) >= toolchain.version_tuple(need)]
    return (vs[0], pkg) if vs else (current, current_pkg)


def probe_packages(probe_id: str) -> set[str]:
    """The packages whose versions decide a static probe's result (contract cases' `requires`)."""
    from rlstack.probes import contract

    for c in contract.load_cases():
        if probe_id == f"contract:{c.id}":
            return contract.case_packages(c)
    return set()


def can_fix(cand: Candidate, base: Candidate, failing: list[set[str]]) -> bool:
    """A contract failure depends only on its packages' versions: a candidate that keeps all of them as in
    the failing base cannot pass it, so it is not worth a resolution."""
    changed = {k for k, v in cand.pins.items() if v != base.pins.get(k)}
    return all(changed & pkgs for pkgs in failing if pkgs)


def search(stack_name: str, *, gpu_arch: str, max_candidates: int = 8, cache: WheelCache | None = None,
           progress: bool = True) -> tuple[Candidate | None, list[Candidate]]:
    from rlstack.probes import suite

    stack = load_stack(stack_name)
    cache = cache or WheelCache()
    rules = toolchain.load_rules()
    need = _min_toolkit(rules, gpu_arch)
    tried: list[Candidate] = []
    pool = candidates(stack)
    base = pool[0]
    failing: list[set[str]] = []
    must_pass: set[str] = set()
    for cand in pool:
        if len(tried) >= max_candidates:
            break
        if cand is not base and not can_fix(cand, base, failing):
            continue
        tried.append(cand)
        # resolve once without a toolkit pin to learn torch's CUDA build, then pin the toolkit it needs
        res = _resolve(_requirements(stack, cand, None), stack.python, stack.platform, hashes=False)
        if not res.ok:
            cand.results = [ProbeResult(id="resolve:candidate", layer="resolve", status="fail",
                                        reason=" ".join(res.text.split())[:400])]
            if progress:
                print(f"suggest: {cand.describe()}: does not resolve", file=sys.stderr, flush=True)
            continue
        pins = locks.parse_pins(res.text)
        cand.torch = pins.get("torch")
        runtime = pins.get("nvidia-cuda-runtime-cu12") or pins.get("nvidia-cuda-runtime")
        torch_cuda = ".".join(runtime.split(".")[:2]) if runtime else None
        tk_pkg = stack.cuda_toolkit.package if stack.cuda_toolkit else None
        tk, tk_pkg = pick_toolkit(torch_cuda, need, stack.cuda_toolkit.version if stack.cuda_toolkit else None,
                                  tk_pkg)
        cand.toolkit, cand.toolkit_package = tk, tk_pkg
        full = _resolve(_requirements(stack, cand, f"{tk_pkg}=={tk}" if tk else None), stack.python,
                        stack.platform, hashes=True)
        if not full.ok:
            cand.results = [ProbeResult(id="resolve:candidate", layer="resolve", status="fail",
                                        reason=" ".join(full.text.split())[:400])]
            continue
        locked = locks.parse_locked(full.text)
        cand.resolved = {k: v.version for k, v in locked.items()}
        results = [ProbeResult(id="resolve:candidate", layer="resolve", status="pass",
                               reason=f"resolves ({len(locked)} packages)")]
        cand_stack = stack.model_copy(update={"torch": stack.torch.model_copy(
            update={"version": cand.torch or stack.torch.version, "cuda": torch_cuda})})
        results += suite.static_results(cand_stack, layers=["contract", "toolchain"], gpu_arch=gpu_arch,
                                        locked=locked, cache=cache, toolkit=tk)
        cand.results = results
        if cand is base:
            failing = [probe_packages(r.id) for r in results if r.status == "fail"]
            must_pass = {r.id for r in results if r.status == "fail"}
        cand.must_pass = must_pass
        if progress:
            fails = [r.id for r in results if r.status == "fail"]
            unproven = [r.id for r in results if r.id in must_pass and r.status == "skip"]
            verdict = "PASS" if cand.passed else "fails " + ", ".join(fails) if fails else \
                "cannot check " + ", ".join(unproven)
            print(f"suggest: {cand.describe()}: {verdict}", file=sys.stderr, flush=True)
        if cand.passed:
            return cand, tried
    return None, tried


def render(stack_name: str, gpu_arch: str, best: Candidate | None, tried: list[Candidate], bound: int) -> str:
    lines = [f"SUGGEST ({stack_name} on {gpu_arch}; {len(tried)} of at most {bound} candidates checked with the "
             "static probes, closest first):"]
    for c in tried:
        fails = [r for r in c.results if r.status == "fail"]
        mark = "PASS" if c is best else "fail"
        lines.append(f"  [{mark}] d={c.distance} {c.describe()}")
        unproven = [r for r in c.results if r.id in c.must_pass and r.status == "skip"]
        for r in [*fails, *unproven][:4]:
            lines.append(f"         {r.id} ({r.status}): {' '.join(r.reason.split())[:160]}")
    if best:
        lines.append(f"closest passing combination: {best.describe()}")
        lines.append(f"  -> set these in images/{stack_name}/requirements.in and stack.toml ([torch] version = "
                     f"\"{best.torch}\", [cuda_toolkit] {best.toolkit_package} {best.toolkit}), then invoke lock")
    else:
        lines.append(f"no combination within the bound passes every static probe (raise --max-candidates, now {bound})")
    return "\n".join(lines)


def cache_path() -> Path:
    return cache_dir() / "suggest"
