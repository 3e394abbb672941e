"""Toolchain probes: rules that tie the target GPU arch to the stack's CUDA toolkit and kernel libraries.

Every rule (toolchain.yaml) names the library file it comes from. The probe looks the line up in the locked
wheel, reads the threshold from it where the rule has one, and evaluates it for `--gpu-arch` against the
stack's pinned nvcc (stack.toml [cuda_toolkit]) and the torch wheel's compiled arch list, read from the
wheel's bytes without a GPU (cached by the wheel's sha256).
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rlstack.core.fileio import sha256_file
from rlstack.core.pkgnames import normalize
from rlstack.probes.model import Evidence, ProbeResult
from rlstack.probes.wheels import LocalWheel, RemoteWheel, SourceSet, cache_dir, reader

RULES_FILE = Path(__file__).with_name("toolchain.yaml")
ARCH_LIST_RE = re.compile(rb"(?:sm|compute)_\d{2,3}[af]?(?: (?:sm|compute)_\d{2,3}[af]?)+")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceRef(_M):
    package: str
    file: str
    pattern: str
    note: str | None = None


class Rule(_M):
    id: str
    kind: Literal["min_toolkit", "torch_arch", "toolkit_torch_major"]
    wall: str
    requires: list[str]
    summary: str
    source: SourceRef
    fix: str
    arch_majors: list[int] = Field(default_factory=list)
    toolkit_source: SourceRef | None = None
    library: str | None = None


def load_rules(path: Path = RULES_FILE) -> list[Rule]:
    data = yaml.safe_load(path.read_text()) or {}
    return [Rule.model_validate(r) for r in data.get("rules", [])]


def arch_number(arch: str) -> int:
    """'sm_120' -> 120, 'sm_90a' -> 90."""
    m = re.fullmatch(r"(?:sm|compute)_(\d{2,3})[af]?", arch)
    if not m:
        raise ValueError(f"not a GPU arch: {arch}")
    return int(m[1])


def arch_major(arch: str) -> int:
    return arch_number(arch) // 10


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def find_line(sources: SourceSet, ref: SourceRef) -> tuple[int, re.Match[str]] | None:
    text = sources.read(ref.package, ref.file)
    if text is None:
        return None
    rx = re.compile(ref.pattern)
    for n, line in enumerate(text.splitlines(), 1):
        m = rx.search(line)
        if m:
            return n, m
    return None


def torch_arch_list(wheel: Path | RemoteWheel | LocalWheel, member: str = "torch/lib/libtorch_python.so"
                    ) -> list[str]:
    """The arch flags torch was compiled with (what torch.cuda.get_arch_list() reports), read from the
    string constant in the wheel's shared library: no GPU, no import. Cached by the wheel's sha256 (a
    whole wheel's from its verified marker, a remote one's from the lock)."""
    if isinstance(wheel, RemoteWheel):
        digest = wheel.sha256
    else:
        path = wheel.path if isinstance(wheel, LocalWheel) else wheel
        marker = path.with_name(path.name + ".sha256")
        digest = json.loads(marker.read_text())["sha256"] if marker.is_file() else sha256_file(path)
    cache = _arch_cache(digest)
    with _FACT_LOCKS.setdefault(digest, threading.Lock()):  # two stacks on one torch read it once
        if cache.is_file():
            return list(json.loads(cache.read_text()))
        found = _arch_list(reader(wheel).read(member) or b"")
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(found))
    return found


_FACT_LOCKS: dict[str, threading.Lock] = {}


def _arch_cache(digest: str) -> Path:
    return cache_dir() / "facts" / f"torch-arch-{digest}.json"


def arch_list_cached(digest: str) -> bool:
    """Whether the arch list of the torch wheel with this sha256 is cached (its library need not be read)."""
    return _arch_cache(digest).is_file()


_ARCH_CHARS = frozenset(b"smcoputeaf0123456789_ ")


def _arch_list(data: bytes) -> list[str]:
    """The longest arch list (ARCH_LIST_RE) in a shared library's bytes. A list has at least two entries, so
    it contains b' sm_' or b' compute_': the regex runs only on the runs of arch-list characters around those
    (the same matches as over the whole 30 MB, in a fraction of the time)."""
    found: list[str] = []
    done: set[int] = set()
    for needle in (b" sm_", b" compute_"):
        at = data.find(needle)
        while at >= 0:
            lo = at
            while lo > 0 and data[lo - 1] in _ARCH_CHARS:
                lo -= 1
            if lo not in done:
                done.add(lo)
                hi = at + len(needle)
                while hi < len(data) and data[hi] in _ARCH_CHARS:
                    hi += 1
                for m in ARCH_LIST_RE.finditer(data, lo, hi):
                    archs = m.group().decode().split()
                    if len(archs) > len(found):
                        found = archs
            at = data.find(needle, at + 1)
    return found


def torch_supports(arch_list: list[str], target: str) -> bool:
    """torch runs on `target` when it has a cubin of the same major at or below it, or PTX at or below it
    (torch/cuda/__init__.py _check_capability / _check_cubins)."""
    t = arch_number(target)
    for a in arch_list:
        n = arch_number(a)
        if a.startswith("sm_") and n // 10 == t // 10 and n <= t:
            return True
        if a.startswith("compute_") and n <= t:
            return True
    return False


def evaluate(rule: Rule, sources: SourceSet, *, gpu_arch: str, toolkit: str | None, torch_cuda: str | None,
             torch_wheel: Path | RemoteWheel | LocalWheel | None = None) -> ProbeResult:
    pid = f"toolchain:{rule.id}"

    def res(status: str, reason: str, ev: list[Evidence]) -> ProbeResult:
        fail = status == "fail"
        return ProbeResult(id=pid, layer="toolchain", status=status, reason=reason, evidence=ev,  # type: ignore[arg-type]
                           signature=rule.wall if fail else None, fix=rule.fix if fail else None)

    hit = find_line(sources, rule.source)
    if hit is None:
        return res("skip", f"the rule's source ({rule.source.file}: /{rule.source.pattern}/) is not in this "
                           f"{rule.source.package}: rule does not apply to this version", [])
    line, m = hit
    ev = [Evidence(text=m.string.strip(), package=rule.source.package, file=rule.source.file, line=line)]
    if rule.kind == "min_toolkit":
        if rule.arch_majors and arch_major(gpu_arch) not in rule.arch_majors:
            return res("pass", f"{gpu_arch} is not SM {'/'.join(map(str, rule.arch_majors))}.x: rule does not bind",
                       ev)
        need = m.groupdict().get("min")
        if need is None:
            return res("skip", "rule source has no threshold", ev)
        if rule.toolkit_source:
            tl = find_line(sources, rule.toolkit_source)
            if tl:
                ev.append(Evidence(text=rule.toolkit_source.note or tl[1].string.strip(),
                                   package=rule.toolkit_source.package, file=rule.toolkit_source.file, line=tl[0]))
        have, what = (toolkit, "nvcc (stack.toml [cuda_toolkit])") if toolkit else (torch_cuda, "torch.version.cuda")
        if have is None:
            return res("skip", "the stack pins no CUDA toolkit and torch has no CUDA build", ev)
        ev.append(Evidence(text=f"{what} = {have}; {gpu_arch} needs >= {need}"))
        if version_tuple(have) < version_tuple(need):
            return res("fail", f"SM {arch_major(gpu_arch)}.x requires CUDA >= {need}; the stack's {what} is {have}", ev)
        return res("pass", f"{what} {have} >= {need} for {gpu_arch}", ev)
    if rule.kind == "toolkit_torch_major":
        return _torch_major(rule, res, ev, sources, toolkit=toolkit, torch_cuda=torch_cuda)
    # torch_arch
    if torch_wheel is None:
        return res("skip", "torch wheel not available to read its compiled arch list", ev)
    archs = torch_arch_list(torch_wheel, rule.library or "torch/lib/libtorch_python.so")
    if not archs:
        return res("skip", f"no arch list found in {rule.library} of {torch_wheel.name}", ev)
    ev.append(Evidence(text=f"compiled arch list: {' '.join(archs)}", package="torch", file=rule.library))
    if torch_supports(archs, gpu_arch):
        return res("pass", f"torch carries kernels for {gpu_arch} ({' '.join(archs)})", ev)
    return res("fail", f"{gpu_arch} is not compatible with the current PyTorch installation (torch has "
                       f"{' '.join(archs)})", ev)


def _torch_major(rule: Rule, res: Any, ev: list[Evidence], sources: SourceSet, *, toolkit: str | None,
                 torch_cuda: str | None) -> ProbeResult:
    """The stack's nvcc against the CUDA torch was built with (torch/version.py in the wheel, else stack.toml):
    a major mismatch fails (torch raises), a minor one passes with torch's warning in the reason."""
    if toolkit is None:
        return res("pass", "the stack pins no nvcc: nothing here compiles against torch's CUDA", ev)
    built = torch_version_cuda(sources) or torch_cuda
    if built is None:
        return res("pass", "torch is not built for CUDA: the rule does not bind", ev)
    if rule.toolkit_source:
        tl = find_line(sources, rule.toolkit_source) if sources.has(rule.toolkit_source.package) else None
        if tl:
            ev.append(Evidence(text=rule.toolkit_source.note or tl[1].string.strip(),
                               package=rule.toolkit_source.package, file=rule.toolkit_source.file, line=tl[0]))
    ev.append(Evidence(text=f"nvcc (stack.toml [cuda_toolkit]) = {toolkit}; torch.version.cuda = {built}"))
    have, want = version_tuple(toolkit), version_tuple(built)
    if have[:1] != want[:1]:
        return res("fail", f"nvcc {toolkit} is CUDA {have[0]}, torch is built for CUDA {built}: torch refuses to build "
                           f"a CUDA extension with it (\"The detected CUDA version ({'.'.join(map(str, have))}) "
                           f"mismatches the version that was used to compile PyTorch ({built})\")", ev)
    if have != want:
        return res("pass", f"nvcc {toolkit} and torch's CUDA {built} share the major (a minor mismatch: torch warns)",
                   ev)
    return res("pass", f"nvcc {toolkit} is torch's CUDA {built}", ev)


def torch_version_cuda(sources: SourceSet) -> str | None:
    """torch.version.cuda of the torch wheel in the set, read from torch/version.py."""
    text = sources.read("torch", "torch/version.py") if sources.has("torch") else None
    m = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]+)['\"]", text or "", re.M)
    return m[1] if m else None


def rule_packages(rule: Rule) -> set[str]:
    return {normalize(p) for p in rule.requires} | {normalize(rule.source.package)}
