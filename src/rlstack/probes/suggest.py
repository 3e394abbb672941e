"""`--suggest`: the closest combination of versions that passes every static probe.

Closest means: fewest locked top-level packages changed (requirements.in, torch, the CUDA toolkit, the
platform tag when a wheel needs a newer glibc), then fewest releases moved. Taking "the newest release" is
many steps, not one.

The search is a bisection over every release, not a window:

1. The stack's lock is probed; the probes that fail (or that a wheel could not decide) must pass.
2. For the first probe that still fails, each package it depends on (a contract case's packages) is tried
   alone: galloping from the current release (1, 2, 4, 8 ... releases away) until the probe passes, then
   bisecting back to the first release that passes. The move with the smallest distance is kept, and the
   loop goes on with the next failing probe. This assumes that once a release passes a probe, later ones do
   too (a method, once added, stays): where that is false the search can miss a closer passing release.
3. Each trial combination is closed over package metadata (Requires-Dist, read through PEP 658 or one range
   request): a release that needs another version of a locked package moves that package to its closest
   release that fits, a release that breaks a dependent's pin or the held anchor is not a candidate. So
   unsloth 2026.3.12..2026.7.4 are rejected without reading their sources (they declare torch<2.11.0).
4. The CUDA toolkit is not searched but chosen: the nvcc of torch's CUDA major (torch raises on another
   major) at the threshold the combination's flashinfer states, preferring torch's own CUDA release.
5. Two answers are ranked: the anchor (the stack's first pinned requirement, vllm for fp8-report) held, and
   the anchor moved back to its closest older release that fits the other packages. Each is then resolved by
   uv from the stack's own requirements (its lock as preferences, so what need not move does not), which
   gives the full lock diff, and the static probes run again on that lock: what is printed is what passed.

Resolutions, metadata, wheel members and probe results are cached, so a repeated search is fast.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, Field

from rlstack.core.pkgnames import normalize, requirement_name
from rlstack.probes import contract, toolchain
from rlstack.probes.model import ProbeResult
from rlstack.probes.remote import write_text
from rlstack.probes.wheels import INDEX_URL, SourceSet, WheelCache, WheelError, _get, cache_dir
from rlstack.stacks import locks, resolver
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack, load_stack

FINAL_RE = re.compile(r"^\d+(\.\d+)*(\.post\d+)?$")
NVCC = {"12": "nvidia-cuda-nvcc-cu12", "13": "nvidia-cuda-nvcc"}
TOOLKIT = "cuda-toolkit"  # the slot the CUDA toolkit takes in a suggestion's changes, whatever its package
PLATFORM = "platform"  # the slot of stack.toml's platform tag


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
    write_text(path, json.dumps(finals))
    return finals


def release_distance(name: str, old: str | None, new: str | None, versions: list[str] | None = None) -> int:
    """How many releases apart two versions are on the index (1 for a package added or removed)."""
    if old is None or new is None:
        return 1
    vs = versions if versions is not None else index_versions(name)
    if old in vs and new in vs:
        return abs(vs.index(new) - vs.index(old))
    return 0 if old == new else 1


def marker_env(stack: Stack) -> dict[str, str]:
    """The PEP 508 marker environment of the stack's target (not of this machine)."""
    machine = "aarch64" if "aarch64" in stack.platform else "x86_64"
    return {"python_version": stack.python, "python_full_version": f"{stack.python}.0", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": machine,
            "platform_release": "", "platform_version": "", "implementation_name": "cpython",
            "implementation_version": f"{stack.python}.0", "platform_python_implementation": "CPython", "extra": ""}


def requires_dist(metadata: str, env: dict[str, str]) -> list[Requirement]:
    """The Requires-Dist entries of a METADATA text that apply in `env` (no extras requested)."""
    msg = email.parser.Parser().parsestr(metadata, headersonly=True)
    out = []
    for line in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def dependents(lock_text: str) -> dict[str, set[str]]:
    """{package: the locked packages that require it}, from the lock's '# via' annotations."""
    out: dict[str, set[str]] = {}
    current: str | None = None
    in_via = False
    for line in lock_text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if m:
            current, in_via = normalize(m[1]), False
            continue
        s = line.strip()
        if current is None or not s.startswith("#"):
            continue
        body = s.lstrip("#").strip()
        if body.startswith("via"):
            in_via = True
            body = body[3:].strip()
        if in_via and body and not body.startswith("-r"):
            out.setdefault(current, set()).add(normalize(body))
    return out


def contains(spec: SpecifierSet, version: str) -> bool:
    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


@dataclass
class Combo:
    """One combination: every locked package's version (the lock with some moved), which moved, the toolkit
    chosen for it, platform problems of its wheels, and probe results."""

    versions: dict[str, str]
    changed: set[str]
    toolkit: tuple[str, str] | None = None  # (package, version)
    torch_cuda: str | None = None
    platform: str | None = None  # a platform tag the combination needs (a wheel needs a newer glibc)
    problems: dict[str, str] = field(default_factory=dict)
    results: list[ProbeResult] = field(default_factory=list)


@dataclass
class Trial:
    """One probe run of the search, for the log: which probe, which move, and the outcome."""

    probe: str
    package: str
    version: str
    outcome: str


class Suggestion(BaseModel):
    rank: int = 0
    passes: bool
    kind: str = Field(description="'keep <anchor>' or 'move <anchor>': which alternative this is")
    changes: dict[str, list[str | None]] = Field(description="top-level package -> [old, new] (None: absent)")
    unchanged: dict[str, str] = Field(default_factory=dict, description="top-level packages that stay")
    lock_lines_changed: int | None = Field(description="pins of the whole lock added, removed or changed (uv)")
    distance: dict[str, int] = Field(description="{'packages': changed top-level slots, 'releases': moved}")
    platform: str | None = None
    probes: dict[str, str] = Field(default_factory=dict, description="probe -> status on the uv lock")
    failing: list[str] = Field(default_factory=list, description="why it does not pass, when it does not")
    skipped: list[str] = Field(default_factory=list, description="probes that did not apply to these versions")
    found_by: list[str] = Field(default_factory=list, description="each move and what decided it")
    resolves: bool = True


class SuggestReport(BaseModel):
    stack: str
    gpu_arch: str
    anchor: str | None
    must_pass: list[str]
    suggestions: list[Suggestion]
    trials: int
    duration_s: float


class Searcher:
    """The search state for one stack: its lock, the index's releases, metadata and probe results."""

    def __init__(self, stack: Stack, gpu_arch: str, cache: WheelCache, progress: bool = True) -> None:
        self.stack, self.gpu_arch, self.cache, self.progress = stack, gpu_arch, cache, progress
        self.lock_text = stack.lock_file.read_text()
        self.locked = locks.parse_locked(self.lock_text)
        self.base = {n: p.version for n, p in self.locked.items()}
        self.env = marker_env(stack)
        self.deps = dependents(self.lock_text)
        self.top = [requirement_name(line) for line in stack.top_level]
        self.anchor = next((requirement_name(line) for line in stack.top_level
                            if any(s.operator == "==" for s in Requirement(line).specifier)), None)
        self.trials: list[Trial] = []
        self._requires: dict[tuple[str, str], list[Requirement]] = {}
        self._problem: dict[tuple[str, str], str] = {}
        self._releases: dict[str, list[str]] = {}
        self._probe_cache: dict[tuple[Any, ...], list[ProbeResult]] = {}

    # -- index and metadata ------------------------------------------------------------------------------
    def releases(self, name: str) -> list[str]:
        if name not in self._releases:
            vs = index_versions(name)
            cur = self.base.get(name)
            if cur and cur not in vs and FINAL_RE.match(cur):
                vs = sorted([*vs, cur], key=vkey)
            self._releases[name] = vs
        return self._releases[name]

    def requires(self, name: str, version: str, problems: dict[str, str] | None = None) -> list[Requirement]:
        key = (name, version)
        if key not in self._requires:
            try:
                text, problem = self.cache.metadata(name, version, self.stack.python, self.stack.platform)
            except WheelError as exc:
                if problems is not None:
                    problems[name] = exc.message
                self._requires[key] = []
                return []
            self._requires[key] = requires_dist(text, self.env)
            if problem:
                self._problem[key] = problem
        if problems is not None and key in self._problem:
            problems[name] = self._problem[key]
        return self._requires[key]

    def prefetch_requires(self, pairs: list[tuple[str, str]]) -> None:
        todo = [p for p in pairs if p not in self._requires]
        if len(todo) > 1:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda p: self.requires(*p), todo))

    def closest(self, name: str, ok: Any, floor: str | None = None) -> str | None:
        """The release of `name` nearest its locked version (newer on a tie) for which ok(version) holds, not
        below `floor`."""
        vs = self.releases(name)
        ref = self.base.get(name)
        i0 = vs.index(ref) if ref in vs else len(vs) - 1
        order = sorted(range(len(vs)), key=lambda i: (abs(i - i0), -i))
        for i in order:
            v = vs[i]
            if floor is not None and vkey(v) < vkey(floor):
                continue
            if ok(v):
                return v
        return None

    # -- closing a combination over metadata ---------------------------------------------------------------
    def closure(self, pins: dict[str, str], held: set[str]) -> Combo | str:
        """The lock with `pins` applied and everything their metadata forces moved; or why it cannot be.
        Held packages stay exactly; pinned ones may only move up from their pin (it is a floor)."""
        versions = dict(self.base)
        versions.update(pins)
        changed = {n for n in pins if pins[n] != self.base.get(n)}
        problems: dict[str, str] = {}
        queue = sorted(changed)
        steps = 0
        while queue and steps < 200:
            steps += 1
            p = queue.pop(0)
            reqs = self.requires(p, versions[p], problems)
            if p in problems and "no wheel on the index" in problems[p]:
                return f"{p}=={versions[p]}: {problems[p]}"
            for r in reqs:
                n = normalize(r.name)
                if n == p or n not in versions or contains(r.specifier, versions[n]):
                    continue
                if n in held:
                    return f"{p}=={versions[p]} requires {r}, and {n} is held at {versions[n]}"
                new = self.closest(n, lambda v, r=r: contains(r.specifier, v), floor=pins.get(n))
                if new is None:
                    return f"{p}=={versions[p]} requires {r}: no release of {n} fits"
                versions[n] = new
                changed.add(n)
                queue.append(n)
            # a dependent that pins p must still accept p's new version, or move to a release that does
            deps = sorted(self.deps.get(p, set()) & set(versions))
            self.prefetch_requires([(d, versions[d]) for d in deps])
            for d in deps:
                bad = [r for r in self.requires(d, versions[d]) if normalize(r.name) == p
                       and not contains(r.specifier, versions[p])]
                if not bad:
                    continue
                if d in held or d in pins:
                    return f"{d}=={versions[d]} requires {bad[0]}, and {p} would be {versions[p]}"

                def accepts(v: str, d: str = d, p: str = p) -> bool:
                    return all(contains(r.specifier, versions[p]) for r in self.requires(d, v)
                               if normalize(r.name) == p)

                new = self._closest_bounded(d, accepts)
                if new is None:
                    return f"{d}=={versions[d]} requires {bad[0]}, and no release of {d} near it accepts {p} " \
                           f"{versions[p]}"
                versions[d] = new
                changed.add(d)
                queue.append(d)
        combo = Combo(versions=versions, changed=changed, problems=problems)
        plat = [self.cache.platform_needed(n, versions[n], self.stack.python, self.stack.platform)
                for n in sorted(changed)]
        needed = sorted(p for p in plat if p)
        combo.platform = needed[-1] if needed else None
        return combo

    def _closest_bounded(self, name: str, ok: Any, tries: int = 24) -> str | None:
        """closest(), reading at most `tries` releases' metadata (a dependent's releases near its lock)."""
        vs = self.releases(name)
        ref = self.base.get(name)
        i0 = vs.index(ref) if ref in vs else len(vs) - 1
        order = sorted(range(len(vs)), key=lambda i: (abs(i - i0), -i))[:tries]
        self.prefetch_requires([(name, vs[i]) for i in order[:8]])
        for i in order:
            if ok(vs[i]):
                return vs[i]
        return None

    # -- probing a combination -----------------------------------------------------------------------------
    def torch_cuda(self, combo: Combo) -> str | None:
        if combo.versions.get("torch") == self.stack.torch.version:
            return self.stack.torch.cuda
        try:
            w = self.cache.open(LockedPackage("torch", combo.versions["torch"], frozenset()), self.stack.python,
                                self.stack.platform, any_platform=True)
        except WheelError:
            return None
        return toolchain.torch_version_cuda(SourceSet({"torch": w}))

    def toolkit_for(self, combo: Combo) -> tuple[str, str] | None:
        """The nvcc a combination gets: the stack's, if it has torch's CUDA major and meets the threshold of the
        combination's flashinfer; else the nvcc of torch's major at or above it, preferring torch's own CUDA
        release (the nvrtc it runs on), then torch's minor, then the lowest."""
        if not self.stack.cuda_toolkit:
            return None
        cur = (self.stack.cuda_toolkit.package, self.stack.cuda_toolkit.version)
        torch_cuda = combo.torch_cuda
        need = self.min_toolkit(combo)
        major = (torch_cuda or cur[1]).split(".")[0]
        if cur[1].split(".")[0] == major and (need is None or toolchain.version_tuple(cur[1]) >=
                                              toolchain.version_tuple(need)):
            return cur
        pkg = NVCC.get(major)
        if pkg is None:
            return cur
        vs = [v for v in self.releases(pkg) if v.split(".")[0] == major and
              (need is None or toolchain.version_tuple(v) >= toolchain.version_tuple(need))]
        if not vs:
            return cur
        nvrtc = combo.versions.get("nvidia-cuda-nvrtc") or combo.versions.get(f"nvidia-cuda-nvrtc-cu{major}")
        if combo.versions.get("torch") != self.base.get("torch"):
            pinned = [r for r in self.requires("torch", combo.versions["torch"])
                      if normalize(r.name).startswith("nvidia-cuda-nvrtc")]
            nvrtc = next((s.version for r in pinned for s in r.specifier if s.operator == "=="), None)
        if nvrtc in vs:
            return pkg, nvrtc
        same_minor = [v for v in vs if torch_cuda and v.startswith(torch_cuda + ".")]
        return pkg, (same_minor or vs)[0]

    def min_toolkit(self, combo: Combo) -> str | None:
        """The nvcc threshold the combination's own kernel libraries state for the arch (toolchain rules)."""
        need: str | None = None
        for rule in toolchain.load_rules():
            if (rule.kind != "min_toolkit" or rule.source is None
                    or toolchain.arch_major(self.gpu_arch) not in rule.arch_majors):
                continue
            pkg = normalize(rule.source.package)
            if pkg not in combo.versions:
                continue
            try:
                w = self.cache.open(LockedPackage(pkg, combo.versions[pkg], self.locked[pkg].hashes
                                                  if combo.versions[pkg] == self.base.get(pkg) else frozenset()),
                                    self.stack.python, self.stack.platform, any_platform=True)
            except WheelError:
                continue
            src = SourceSet({pkg: w})
            hit = toolchain.find_line(src, rule.source)
            src.close()
            if hit and hit[1].groupdict().get("min"):
                v = hit[1]["min"]
                if need is None or toolchain.version_tuple(v) > toolchain.version_tuple(need):
                    need = v
        return need

    def probe(self, combo: Combo, only: set[str] | None = None) -> list[ProbeResult]:
        """The contract and toolchain probes (or `only` those ids) on a combination's versions: wheels of moved
        packages are read by version (any platform: sources do not depend on the glibc tag)."""
        from rlstack.probes import suite

        combo.torch_cuda = self.torch_cuda(combo)
        combo.toolkit = self.toolkit_for(combo)
        key = (tuple(sorted(combo.versions.items())), combo.toolkit, frozenset(only or ()))
        if key in self._probe_cache:
            return self._probe_cache[key]
        locked = {n: (self.locked[n] if n in self.locked and v == self.base.get(n) else
                      LockedPackage(n, v, frozenset())) for n, v in combo.versions.items()}
        cases = [c for c in contract.load_cases() if only is None or f"contract:{c.id}" in only]
        layers = ["contract"] if only is not None and not any(o.startswith("toolchain:") for o in only) else \
            ["contract", "toolchain"]
        cand = self.stack.model_copy(update={"torch": self.stack.torch.model_copy(
            update={"version": combo.versions.get("torch", self.stack.torch.version), "cuda": combo.torch_cuda})})
        results = suite.static_results(cand, layers=layers, gpu_arch=self.gpu_arch, locked=locked, cache=self.cache,
                                       toolkit=combo.toolkit[1] if combo.toolkit else None, cases=cases,
                                       any_platform=True)
        if only is not None:
            results = [r for r in results if r.id in only]
        self._probe_cache[key] = results
        return results

    # -- the search --------------------------------------------------------------------------------------
    def first_passing(self, pins: dict[str, str], package: str, probe_id: str, held: set[str], direction: int
                      ) -> tuple[str, Combo, int] | None:
        """The release of `package` nearest its current one (in `direction`) at which `probe_id` passes, with
        the others as `pins` and `held`: gallop 1, 2, 4 ... releases, then bisect back. (version, combo, how
        many releases were probed)."""
        vs = self.releases(package)
        current = pins.get(package, self.base.get(package))
        if current not in vs:
            return None
        i0 = vs.index(current)
        seq = vs[i0 + 1:] if direction > 0 else list(reversed(vs[:i0]))
        if not seq:
            return None
        seen: dict[int, Combo | None] = {}

        def ok(k: int) -> bool:
            if k not in seen:
                trial = {**pins, package: seq[k]}
                combo = self.closure(trial, held)
                if isinstance(combo, str):
                    self.trials.append(Trial(probe_id, package, seq[k], f"not a candidate: {combo}"))
                    seen[k] = None
                else:
                    res = self.probe(combo, {probe_id})
                    status = res[0].status if res else "skip"
                    self.trials.append(Trial(probe_id, package, seq[k], status))
                    seen[k] = combo if status == "pass" else None
                    if self.progress:
                        print(f"suggest: {probe_id} with {package}=={seq[k]}: {status}", file=sys.stderr, flush=True)
            return seen[k] is not None

        lo, k, step = -1, 0, 1
        while True:
            if ok(k):
                break
            lo = k
            if k == len(seq) - 1:
                return None
            k = min(k + step, len(seq) - 1)
            step *= 2
        hi = k
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid
        combo = seen[hi]
        assert combo is not None
        return seq[hi], combo, len(seen)

    def moved_note(self, combo: Combo, package: str, exclude: set[str] | None = None) -> str:
        """'; that also moves X a -> b, ...' for the top-level packages a move dragged along (and a count of the
        others)."""
        moved = sorted(combo.changed - {package} - (exclude or set()))
        top = [x for x in moved if x in self.top or x == "torch"]
        if not moved:
            return ""
        text = ", ".join(f"{x} {self.base.get(x)} -> {combo.versions[x]}" for x in top)
        rest = len(moved) - len(top)
        return "; that also moves " + (text + (f" and {rest} other locked package(s)" if rest else "") if top else
                                       f"{rest} other locked package(s)")

    def distance(self, combo: Combo) -> tuple[int, int]:
        slots = {n for n in combo.changed if n in self.top or n == "torch"}
        rel = sum(release_distance(n, self.base.get(n), combo.versions.get(n), self.releases(n)) for n in slots)
        if combo.toolkit and self.stack.cuda_toolkit and combo.toolkit != (self.stack.cuda_toolkit.package,
                                                                           self.stack.cuda_toolkit.version):
            slots.add(TOOLKIT)
        if combo.platform:
            slots.add(PLATFORM)
        return len(slots), rel

    def failing(self, results: list[ProbeResult], must_pass: set[str]) -> list[ProbeResult]:
        return [r for r in results if r.status == "fail" or (r.id in must_pass and r.status != "pass")]

    def greedy(self, pins: dict[str, str], held: set[str], must_pass: set[str], log: list[str]
               ) -> tuple[Combo | None, dict[str, str]]:
        """Fix failing probes one at a time with the smallest single-package move each (see the module doc)."""
        before: set[str] = set()
        for _ in range(10):
            combo = self.closure(pins, held)
            if isinstance(combo, str):
                log.append(f"not a candidate: {combo}")
                return None, pins
            results = self.probe(combo)
            combo.results = results
            bad = self.failing(results, must_pass)
            if not bad:
                return combo, pins
            target = next((r for r in bad if r.id.startswith("contract:")), bad[0])
            packages = sorted(probe_packages(target.id) & set(self.base) - held)
            options = []
            for q in packages:
                found = self.first_passing(pins, q, target.id, held, +1)
                if found:
                    v, c, n = found
                    options.append((self.distance(c), q, v, c, n))
            if not options:
                log.append(f"{target.id}: no release of {', '.join(packages) or 'its packages'} makes it pass "
                           f"with the others as they are")
                return combo, pins
            _, q, v, c, n = min(options, key=lambda o: o[0])
            log.append(f"{target.id} first passes at {q} {v} ({n} releases probed)" +
                       self.moved_note(c, q, exclude=set(pins) | combo.changed | before))
            before |= combo.changed
            pins = {**pins, q: v}
        return None, pins


    def verify(self, combo: Combo, kind: str, log: list[str], must_pass: set[str]) -> Suggestion:
        """Resolve the combination with uv from the stack's requirements (the lock as preferences), then run the
        static probes on that lock: the suggestion says what uv and the probes said, not what the search hoped."""
        from rlstack.probes import suite

        stack = self.stack
        platform = combo.platform or stack.platform
        pins = {n: combo.versions[n] for n in combo.changed if n in self.top or n == "torch"}
        reqs = []
        for line in stack.top_level:
            name = requirement_name(line)
            reqs.append(f"{name}=={pins[name]}" if name in pins else line)
        reqs.append(f"torch=={combo.versions.get('torch', stack.torch.version)}")
        if combo.toolkit:
            reqs.append(f"{combo.toolkit[0]}=={combo.toolkit[1]}")
        reqs += locks.project_dependencies(stack.folder.parent.parent)
        res = _resolve(reqs, stack.python, platform, preferences=self.lock_text)
        dist = self.distance(combo)
        if not res.ok:
            return Suggestion(passes=False, kind=kind, changes=_changes(self, combo.versions), lock_lines_changed=None,
                              distance={"packages": dist[0], "releases": dist[1]}, platform=combo.platform,
                              failing=[" ".join(res.text.split())[:600]], found_by=log, resolves=False)
        new = locks.parse_locked(res.text)
        new_versions = {n: p.version for n, p in new.items()}
        cand = stack.model_copy(update={"platform": platform, "torch": stack.torch.model_copy(
            update={"version": new_versions.get("torch", stack.torch.version), "cuda": combo.torch_cuda})})
        results = suite.static_results(cand, layers=["contract", "toolchain"], gpu_arch=self.gpu_arch, locked=new,
                                       cache=self.cache, toolkit=combo.toolkit[1] if combo.toolkit else None)
        bad = self.failing(results, must_pass)
        lines = sum(1 for n in set(self.base) | set(new_versions) if self.base.get(n) != new_versions.get(n))
        final = Combo(versions=new_versions, changed={n for n in set(self.base) | set(new_versions)
                                                      if self.base.get(n) != new_versions.get(n)},
                      toolkit=combo.toolkit, platform=combo.platform)
        dist = self.distance(final)
        changes = _changes(self, new_versions)
        if combo.toolkit and stack.cuda_toolkit and combo.toolkit != (stack.cuda_toolkit.package,
                                                                      stack.cuda_toolkit.version):
            changes[TOOLKIT] = [f"{stack.cuda_toolkit.package}=={stack.cuda_toolkit.version}",
                                f"{combo.toolkit[0]}=={combo.toolkit[1]}"]
        if combo.platform:
            changes[PLATFORM] = [stack.platform, combo.platform]
        unchanged = {n: self.base[n] for n in [*self.top, "torch"] if n in self.base and n not in changes}
        return Suggestion(passes=not bad, kind=kind, changes=changes, unchanged=unchanged, lock_lines_changed=lines,
                          distance={"packages": dist[0], "releases": dist[1]}, platform=combo.platform,
                          probes={r.id: r.status for r in results},
                          failing=[f"{r.id} ({r.status}): {' '.join(r.reason.split())[:300]}" for r in bad],
                          skipped=[f"{r.id}: {' '.join(r.reason.split())[:200]}" for r in results
                                   if r.status == "skip" and r not in bad], found_by=log)


def probe_packages(probe_id: str) -> set[str]:
    """The packages whose versions decide a static probe's result (contract cases' `requires`, toolchain
    rules' packages)."""
    for c in contract.load_cases():
        if probe_id == f"contract:{c.id}":
            return contract.case_packages(c)
    for r in toolchain.load_rules():
        if probe_id.split("@")[0] == f"toolchain:{r.id}":
            return toolchain.rule_packages(r)
    if probe_id.startswith("discovered:"):
        return {normalize(p) for p in probe_id.split(":")[1].split("->")}
    return set()


def search(stack_name: str, *, gpu_arch: str, cache: WheelCache | None = None, progress: bool = True
           ) -> SuggestReport:
    """Both alternatives (anchor kept, anchor moved), each verified by uv and the static probes, ranked."""
    t0 = time.perf_counter()
    stack = load_stack(stack_name)
    s = Searcher(stack, gpu_arch, cache or WheelCache(quiet=True), progress)
    base = s.closure({}, set())
    assert not isinstance(base, str)
    base.results = s.probe(base)
    must_pass = {r.id for r in base.results if r.status == "fail" or r.undecided}
    anchor = s.anchor

    def keep() -> tuple[Combo | None, list[str]]:
        log: list[str] = []
        held = {anchor, "torch"} if anchor else {"torch"}
        return s.greedy({}, {h for h in held if h}, must_pass, log)[0], log

    def move() -> tuple[Combo | None, list[str]]:
        log: list[str] = []
        assert anchor is not None
        probe = next((r for r in base.results if r.id in must_pass and anchor in probe_packages(r.id)), None)
        if probe is None:
            return None, log
        found = s.first_passing({}, anchor, probe.id, set(), -1)
        if found is None:
            log.append(f"no older {anchor} passes {probe.id}")
            return None, log
        v, c, n = found
        log.append(f"{probe.id} first passes at {anchor} {v} going back ({n} releases probed)"
                   + s.moved_note(c, anchor))
        return s.greedy({anchor: v}, {anchor}, must_pass, log)[0], log

    jobs = [(f"keep {anchor}" if anchor else "keep", keep)] + ([(f"move {anchor}", move)] if anchor else [])
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two searches overlap their network waits
        found_combos = [(kind, pool.submit(fn)) for kind, fn in jobs]
        combos = [(kind, *f.result()) for kind, f in found_combos]
        verified = [pool.submit(s.verify, c, kind, log, must_pass) for kind, c, log in combos if c is not None]
        out: list[Suggestion] = [v.result() for v in verified]
    out.sort(key=lambda x: (not x.passes, x.distance["packages"], x.distance["releases"]))
    for i, sug in enumerate(out, 1):
        sug.rank = i
    return SuggestReport(stack=stack.name, gpu_arch=gpu_arch, anchor=s.anchor, must_pass=sorted(must_pass),
                         suggestions=out, trials=len(s.trials), duration_s=round(time.perf_counter() - t0, 1))




def _changes(self: Searcher, versions: dict[str, str]) -> dict[str, list[str | None]]:
    """[old, new] for each top-level package (requirements.in, torch) whose version differs."""
    out: dict[str, list[str | None]] = {}
    for n in [*self.top, "torch"]:
        old, new = self.base.get(n), versions.get(n)
        if old != new:
            out[n] = [old, new]
    return out


def _resolve(reqs: list[str], python: str, platform: str, preferences: str | None) -> resolver.Resolution:
    """resolver.resolve with hashes and the lock as preferences, cached by its input."""
    key = hashlib.sha256(json.dumps([sorted(reqs), python, platform,
                                     hashlib.sha256((preferences or "").encode()).hexdigest()]).encode()).hexdigest()
    path = cache_path() / f"{key}.json"
    if path.is_file():
        d = json.loads(path.read_text())
        return resolver.Resolution(d["ok"], d["text"], d["command"])
    res = resolver.resolve(reqs, python, platform, hashes=True, preferences=preferences)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps({"ok": res.ok, "text": res.text, "command": res.command}))
    return res


def render(report: SuggestReport) -> str:
    lines = [f"SUGGEST ({report.stack} on {report.gpu_arch}; closest first: packages changed, then releases moved; "
             f"{report.trials} trial probes, {report.duration_s:.0f}s). Must pass: {', '.join(report.must_pass)}"]
    if not report.suggestions:
        lines.append("  no combination found that the search could verify")
    for s in report.suggestions:
        state = "PASS" if s.passes else "fails" if s.resolves else "does not resolve"
        lines.append(f"  {s.rank}. [{state}] {s.kind}: {s.distance['packages']} changed, {s.distance['releases']} "
                     f"releases moved" + (f"; uv lock: {s.lock_lines_changed} pins differ"
                                          if s.lock_lines_changed is not None else ""))
        width = max((len(k) for k in [*s.changes, *s.unchanged]), default=10)
        for name, (old, new) in s.changes.items():
            lines.append(f"       {name:<{width}}  {old or '(none)'} -> {new or '(removed)'}")
        for name, v in s.unchanged.items():
            lines.append(f"       {name:<{width}}  {v} (unchanged)")
        for f in s.found_by:
            lines.append(f"       found: {f}")
        for f in s.failing[:4]:
            lines.append(f"       still: {f}")
        for f in s.skipped:
            lines.append(f"       skipped (does not apply to these versions): {f}")
    best = next((s for s in report.suggestions if s.passes), None)
    if best:
        lines.append(f"  -> apply rank {best.rank}: pins in images/{report.stack}/requirements.in, [torch] / "
                     "[cuda_toolkit] / platform in stack.toml, then invoke lock --stack " + report.stack)
    return "\n".join(lines)


def cache_path() -> Path:
    return cache_dir() / "suggest"
