"""Toolchain probes: rules that tie the target GPU arch to the stack's CUDA toolkit and kernel libraries.

Every rule (toolchain.yaml) names the library file it comes from. The probe looks the line up in the locked
wheel, reads the threshold from it where the rule has one, and evaluates it for `--gpu-arch` against the nvcc
that the JIT compilers find in the stack's image and the torch wheel's compiled arch list, read from the
wheel's bytes without a GPU (cached by the wheel's sha256).

Which nvcc the JIT finds is not stack.toml's version but FlashInfer's lookup (rlstack.probes.environment.
find_cuda_home) run over a model of the image (Image): the ENV images/Dockerfile sets (Stack.image_env) and the
files the locked toolkit wheels install, CUDA_HOME's folder of links included (rlstack.scripts.cuda_toolkit.plan,
what the image build makes). A lookup that finds no nvcc there is a wall of its own, and then FlashInfer's
version checks read torch.version.cuda, as FlashInfer does.
"""

from __future__ import annotations

import json
import posixpath
import re
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlstack.core.fileio import sha256_file
from rlstack.core.pkgnames import normalize
from rlstack.probes.environment import Found, find_cuda_home
from rlstack.probes.model import Evidence, ProbeResult
from rlstack.probes.wheels import LocalWheel, RemoteWheel, SourceSet, cache_dir, reader
from rlstack.scripts import cuda_toolkit
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack

RULES_FILE = Path(__file__).with_name("toolchain.yaml")
ARCH_LIST_RE = re.compile(rb"(?:sm|compute)_\d{2,3}[af]?(?: (?:sm|compute)_\d{2,3}[af]?)+")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceRef(_M):
    package: str
    file: str
    pattern: str
    note: str | None = None


# Rules about the toolkit folder itself: they read the image model, not only the cited line.
IMAGE_KINDS = frozenset({"jit_toolkit", "toolkit_headers", "toolkit_release"})


class Rule(_M):
    id: str
    kind: Literal["min_toolkit", "torch_arch", "toolkit_torch_major", "jit_toolkit", "toolkit_headers",
                  "toolkit_release"]
    wall: str
    requires: list[str]
    summary: str
    source: SourceRef | None = Field(None, description="the library line the rule comes from; only a "
                                     "toolkit_release rule (about nvcc's own wheels) has none")
    fix: str
    arch_majors: list[int] = Field(default_factory=list)
    toolkit_source: SourceRef | None = None
    library: str | None = None
    header: str | None = Field(None, description="toolkit_headers: the header the library's kernels include, "
                               "looked for in each include folder its source names (the pattern's 'dir')")
    components: list[str] = Field(default_factory=list, description="toolkit_release: the wheels (with or "
                                  "without a -cuNN suffix) that must be of nvcc's own CUDA release")

    @model_validator(mode="after")
    def _shape(self) -> Rule:
        if self.source is None and self.kind != "toolkit_release":
            raise ValueError(f"rule {self.id}: a {self.kind} rule cites its library line (source)")
        if self.kind == "toolkit_headers" and not self.header:
            raise ValueError(f"rule {self.id}: a toolkit_headers rule names its header")
        if self.kind == "toolkit_release" and not self.components:
            raise ValueError(f"rule {self.id}: a toolkit_release rule names its components")
        return self


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


def find_lines(sources: SourceSet, ref: SourceRef) -> list[tuple[int, re.Match[str]]]:
    """Every line of the cited file that the pattern matches (a rule may bind on several: one per arch range)."""
    text = sources.read(ref.package, ref.file)
    rx = re.compile(ref.pattern)
    return [(n, m) for n, line in enumerate((text or "").splitlines(), 1) if (m := rx.search(line))]


def covers(scope: str, arch: str) -> bool:
    """Whether an arch range as a library's message writes it covers `arch`: 'SM 12.x' (the major), 'SM 12.1+'
    (the major from that minor on), 'SM 120' (that arch)."""
    n = arch_number(arch)
    if m := re.fullmatch(r"(\d+)\.x", scope):
        return n // 10 == int(m[1])
    if m := re.fullmatch(r"(\d+)\.(\d+)\+", scope):
        return n // 10 == int(m[1]) and n % 10 >= int(m[2])
    return scope.isdigit() and n == int(scope)


_WHEEL_DATA = re.compile(r"^[^/]+\.data/(purelib|platlib|scripts)/(.+)$")


@dataclass(frozen=True)
class Image:
    """A stack's image as a JIT compiler's toolkit lookup sees it, without building it: the ENV
    images/Dockerfile sets (Stack.image_env) and the files the locked CUDA toolkit wheels install (into
    site-packages, their scripts into the venv's bin, and CUDA_HOME's folder of links that the image build makes
    with rlstack.scripts.cuda_toolkit.plan). The rest of the image is Debian, python3 and g++: no nvcc and no
    /usr/local/cuda, so only these files can answer the lookup."""

    env: Mapping[str, str]
    site: str  # the venv's site-packages in the image
    owners: Mapping[str, str]  # site-packages-relative file -> the toolkit wheel that installs it
    scripts: Mapping[str, str]  # /opt/venv/bin/<name> -> the wheel that installs it
    versions: Mapping[str, str]  # locked version of every wheel read
    layout: cuda_toolkit.Layout | None
    problem: str | None = None  # why CUDA_HOME has no toolkit folder (the toolkit wheel carries no nvcc)
    folders: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def home(self) -> str:
        return self.env.get("CUDA_HOME", "")

    def _site_file(self, path: str) -> str | None:
        """The site-packages-relative path an absolute path in the image reaches (through CUDA_HOME's links);
        '' for site-packages itself, None outside what the wheels make."""
        p = posixpath.normpath(path)
        if self.layout is not None and self.home and (p == self.home or p.startswith(self.home.rstrip("/") + "/")):
            rel = p[len(self.home.rstrip("/")) + 1:]
            return self.layout.resolve(rel) if rel else ""
        if p == self.site or p.startswith(self.site + "/"):
            return p[len(self.site) + 1:]
        return None

    def owner(self, path: str) -> str | None:
        """The wheel that installs the file at an absolute path in the image, None when there is no such file."""
        p = posixpath.normpath(path)
        if p in self.scripts:
            return self.scripts[p]
        f = self._site_file(p)
        return self.owners.get(f) if f else None

    def exists(self, path: str) -> bool:
        p = posixpath.normpath(path)
        if self.owner(p) is not None:
            return True
        if self.layout is not None and self.home and (self.home + "/").startswith(p.rstrip("/") + "/"):
            return True  # CUDA_HOME and the folders above it
        f = self._site_file(p)
        return f == "" or (f is not None and f in self.folders)

    def which(self, name: str, path: str | None) -> str | None:
        """`which name` over a PATH in the image: only a wheel's file can be there (Debian ships no nvcc)."""
        for d in (path or "").split(":"):
            if d and self.owner(posixpath.join(d, name)) is not None:
                return posixpath.join(d, name)
        return None

    def found(self) -> Found:
        """What FlashInfer's get_cuda_path() answers in the image, and the nvcc its get_cuda_version() runs (the
        locked version of the wheel that installs it)."""
        home, how = find_cuda_home(self.env, self.which, self.exists)
        if home is None:
            return Found(None, how)
        nvcc = posixpath.join(home, "bin/nvcc")
        pkg = self.owner(nvcc)
        return Found(home, how, nvcc if pkg else None, self.versions.get(pkg) if pkg else None)


PLAN_CODE = Path(cuda_toolkit.__file__)


def image_inputs(stack: Stack, toolkit: str | None) -> dict[str, object]:
    """What the image model depends on besides its wheels (named by their sha256 in a result's key): the ENV,
    the stack's [cuda_toolkit], a candidate nvcc version, and the code that plans the toolkit folder."""
    return {"env": stack.image_env(), "python": stack.python, "candidate": toolkit,
            "cuda_toolkit": stack.cuda_toolkit.model_dump(mode="json") if stack.cuda_toolkit else None,
            "plan": sha256_file(PLAN_CODE)}


def image_wheels(stack: Stack, locked: Mapping[str, LockedPackage], rules: list[Rule]) -> set[str]:
    """The locked wheels whose files make the image's toolkit: every CUDA toolkit wheel the image build's plan
    reads (cuda_toolkit.TOOLKIT_DIST), the stack's [cuda_toolkit] wheels, and the release rules' components."""
    names = {n for n in locked if cuda_toolkit.TOOLKIT_DIST.match(n)}
    if stack.cuda_toolkit is not None:
        names |= {normalize(stack.cuda_toolkit.package), *map(normalize, stack.cuda_toolkit.components)}
    names |= {n for r in rules for c in r.components for n in locked if _is_component(n, c)}
    return names & set(locked)


def _is_component(name: str, component: str) -> bool:
    return re.fullmatch(re.escape(normalize(component)) + r"(-cu\d+)?", name) is not None


def read_image(stack: Stack, locked: Mapping[str, LockedPackage], sources: SourceSet, names: set[str],
               toolkit: str | None = None) -> Image:
    """The image model from the locked wheels `names` (image_wheels) in `sources`, their member lists read side
    by side (a round trip each from a cold cache). `toolkit`: an nvcc version to model instead of the lock's
    (a --suggest candidate's, whose lock does not hold that wheel)."""
    todo = sorted(names)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(todo)))) as pool:
        files = dict(zip(todo, pool.map(sources.names, todo), strict=True))
    versions = {n: locked[n].version for n in todo}
    if toolkit and stack.cuda_toolkit is not None and normalize(stack.cuda_toolkit.package) in versions:
        versions[normalize(stack.cuda_toolkit.package)] = toolkit
    return image_of(stack, versions, files)


def image_of(stack: Stack, versions: Mapping[str, str], files: Mapping[str, list[str]],
             env: Mapping[str, str] | None = None) -> Image:
    """The image model from the toolkit wheels' member lists ({wheel: members}) and their locked versions.
    `env` replaces the image's ENV (Stack.image_env), to ask what an image without CUDA_HOME would find."""
    env = dict(stack.image_env() if env is None else env)
    venv = env.get("VIRTUAL_ENV", "/opt/venv")
    site = f"{venv}/lib/python{stack.python}/site-packages"
    owners: dict[str, str] = {}
    scripts: dict[str, str] = {}
    installed: dict[str, list[str]] = {}
    for name, members in sorted(files.items()):
        mine = installed.setdefault(name, [])
        for member in members:
            m = _WHEEL_DATA.match(member)
            if m and m[1] == "scripts":
                scripts[f"{venv}/bin/{m[2]}"] = name
                continue
            rel = m[2] if m else member
            owners.setdefault(rel, name)
            mine.append(rel)
    folders = frozenset(posixpath.dirname(f)[: i] for f in owners for i in
                        [j for j, c in enumerate(posixpath.dirname(f) + "/") if c == "/"])
    layout, problem = None, None
    if stack.cuda_toolkit is not None and env.get("CUDA_HOME"):
        try:
            layout = cuda_toolkit.plan(installed, stack.cuda_toolkit.package)
        except cuda_toolkit.ToolkitError as exc:
            pkg = normalize(stack.cuda_toolkit.package)
            bins = sorted(posixpath.basename(f) for f in installed.get(pkg, []) if "/bin/" in f)
            problem = (f"{pkg} {versions.get(pkg, '')} carries no nvcc (its bin/: {', '.join(bins) or 'nothing'})"
                       if pkg in installed else str(exc))
    return Image(env=env, site=site, owners=owners, scripts=scripts, versions=dict(versions), layout=layout,
                 problem=problem, folders=folders)


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
             torch_wheel: Path | RemoteWheel | LocalWheel | None = None, image: Image | None = None) -> ProbeResult:
    """One rule for one arch. `toolkit`: the version of the nvcc the JIT compilers find (None: they find none,
    and FlashInfer's version checks read torch.version.cuda); `image`: the image model that answer came from
    (the rules about the toolkit folder itself need it)."""
    pid = f"toolchain:{rule.id}"

    def res(status: str, reason: str, ev: list[Evidence]) -> ProbeResult:
        fail = status == "fail"
        return ProbeResult(id=pid, layer="toolchain", status=status, reason=reason, evidence=ev,  # type: ignore[arg-type]
                           signature=rule.wall if fail else None, fix=rule.fix if fail else None)

    if rule.kind == "toolkit_release":
        return _release(rule, res, image)
    assert rule.source is not None  # Rule._shape
    hits = find_lines(sources, rule.source)
    if not hits:
        return res("skip", f"the rule's source ({rule.source.file}: /{rule.source.pattern}/) is not in this "
                           f"{rule.source.package}: rule does not apply to this version", [])
    line, m = hits[0]
    ev = [Evidence(text=m.string.strip(), package=rule.source.package, file=rule.source.file, line=line)]
    found = image.found() if image is not None else None
    if rule.kind == "jit_toolkit":
        return _jit(rule, res, ev, sources, image, found, torch_cuda)
    if rule.kind == "toolkit_headers":
        return _headers(rule, res, ev, sources, hits, image, found)
    if rule.kind == "min_toolkit":
        if rule.arch_majors and arch_major(gpu_arch) not in rule.arch_majors:
            return res("pass", f"{gpu_arch} is not SM {'/'.join(map(str, rule.arch_majors))}.x: rule does not bind",
                       ev)
        if "scope" in re.compile(rule.source.pattern).groupindex:  # one line per arch range, as the source has it
            bound = [(n, h) for n, h in hits if covers(h["scope"], gpu_arch)]
            if not bound:
                return res("pass", f"no line of {rule.source.file} binds {gpu_arch} "
                                   f"({'; '.join(h.string.strip() for _, h in hits)})", ev)
            line, m = bound[0]
            ev = [Evidence(text=m.string.strip(), package=rule.source.package, file=rule.source.file, line=line)]
        need = m.groupdict().get("min")
        if need is None:
            return res("skip", "rule source has no threshold", ev)
        ev += toolkit_evidence(rule, sources)
        have: str | None = toolkit
        if toolkit:
            what = f"nvcc at {found.where()}" if found and found.nvcc else "nvcc"
        else:
            have = torch_cuda
            what = ("torch.version.cuda (FlashInfer's JIT finds no nvcc in the image"
                    + (f": {found.where()})" if found else ")"))
        if have is None:
            return res("skip", "the image has no nvcc and torch has no CUDA build", ev)
        ev.append(Evidence(text=f"{what} = {have}; {gpu_arch} needs >= {need}"))
        scope = m.groupdict().get("scope") or f"{arch_major(gpu_arch)}.x"
        if version_tuple(have) < version_tuple(need):
            return res("fail", f"SM {scope} requires CUDA >= {need}; the CUDA version FlashInfer's JIT reads in the "
                               f"image is {have}, from {what}", ev)
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


def _lookup_evidence(image: Image, found: Found) -> Evidence:
    env = ", ".join(f"{k}={v!r}" for k, v in image.env.items() if k in ("CUDA_HOME", "CUDA_PATH", "PATH"))
    return Evidence(text=f"the image's ENV ({env}) -> {found.describe()}")


def _jit(rule: Rule, res: Any, ev: list[Evidence], sources: SourceSet, image: Image | None, found: Found | None,
         torch_cuda: str | None) -> ProbeResult:
    """The nvcc FlashInfer's JIT finds in the image: none is a wall (it compiles nothing, and its version checks
    read torch's CUDA instead); one that is not the stack's pinned wheel is too."""
    if image is None or found is None:
        return res("skip", "undecided: no model of the image's toolkit (its wheels were not read)", ev)
    ev += toolkit_evidence(rule, sources)
    ev.append(_lookup_evidence(image, found))
    if found.nvcc is None:
        why = f" ({image.problem}: the image build cannot make {image.home})" if image.problem else ""
        return res("fail", f"FlashInfer's JIT finds no nvcc in the image{why}; its version check reads torch's "
                           f"CUDA {torch_cuda or '(none: it raises)'}", ev)
    pkg = image.owner(found.nvcc)
    ev.append(Evidence(text=f"{found.nvcc} is {pkg} {found.version}"))
    if pkg != image_toolkit_package(image):
        return res("fail", f"FlashInfer's JIT finds {pkg} {found.version} at {found.nvcc}, not the stack's "
                           f"[cuda_toolkit] wheel", ev)
    return res("pass", f"FlashInfer's JIT finds nvcc {found.version} ({pkg}) at {found.where()}", ev)


def image_toolkit_package(image: Image) -> str | None:
    """The stack's [cuda_toolkit] wheel, as the image's toolkit folder was planned from it."""
    return image.layout.nvcc_package if image.layout is not None else None


def _headers(rule: Rule, res: Any, ev: list[Evidence], sources: SourceSet, hits: list[tuple[int, re.Match[str]]],
             image: Image | None, found: Found | None) -> ProbeResult:
    """A header the library's JIT kernels include: in one of the toolkit include folders its source names
    (relative to the CUDA home it found), or carried in the library's own wheel."""
    assert rule.header is not None and rule.source is not None  # Rule._shape
    header = rule.header
    vendored = [n for n in sources.names(rule.source.package) if n.endswith("/" + header)]
    if vendored:
        ev.append(Evidence(text=f"{rule.source.package} carries {header}: {vendored[0]}",
                           package=rule.source.package, file=vendored[0]))
        return res("pass", f"{rule.source.package} carries its own {header} ({vendored[0]})", ev)
    if image is None or found is None:
        return res("skip", "undecided: no model of the image's toolkit (its wheels were not read)", ev)
    if found.home is None or found.nvcc is None:
        return res("skip", f"FlashInfer's JIT finds no toolkit in the image ({found.where()}): "
                           f"see toolchain:flashinfer-jit-nvcc", ev)
    first: dict[str, tuple[int, re.Match[str]]] = {}
    for n, h in hits:
        first.setdefault(h.groupdict().get("dir") or "include", (n, h))
    dirs = list(first)
    ev = [Evidence(text=h.string.strip(), package=rule.source.package, file=rule.source.file, line=n)
          for n, h in first.values()]
    for d in dirs:
        path = posixpath.join(found.home, d, header)
        owner = image.owner(path)
        if owner:
            return res("pass", f"{path} is there ({owner} {image.versions.get(owner, '')})".replace(" )", ")"), ev)
    tried = ", ".join(posixpath.join(found.home, d, header) for d in dirs)
    ev.append(Evidence(text=f"no locked toolkit wheel puts {header} in the image's toolkit folder (tried {tried})"))
    return res("fail", f"FlashInfer's kernels include <{header}>, and the image's toolkit folder {found.home} has "
                       f"none ({tried})", ev)


def _release(rule: Rule, res: Any, image: Image | None) -> ProbeResult:
    """nvcc runs cicc and includes the crt headers from its own folder; when those come in wheels of their own,
    they must be of nvcc's CUDA release (major.minor), or ptxas refuses the newer PTX cicc writes."""
    if image is None:
        return res("skip", "undecided: no model of the image's toolkit (its wheels were not read)", [])
    found = image.found()
    if found.nvcc is None or found.version is None:
        return res("skip", f"the image has no nvcc ({found.where()}): nothing to be coherent with", [])
    want = version_tuple(found.version)
    nvcc_pkg = image.owner(found.nvcc)
    ev = [Evidence(text=f"{found.nvcc}: {nvcc_pkg} {found.version}")]
    parts = sorted((n, v) for n, v in image.versions.items() for c in rule.components if _is_component(n, c))
    bad = []
    for name, version in parts:
        where = sorted({f.split("/", 2)[1] for f, o in image.owners.items() if o == name and f.count("/") >= 2})
        ev.append(Evidence(text=f"{name} {version} (lock)" + (f", installs into nvidia/{', '.join(where)}"
                                                               if where else "")))
        if version_tuple(version) != want:
            bad.append(f"{name} {version}")
    if bad:
        return res("fail", f"nvcc is CUDA {'.'.join(map(str, want))} ({nvcc_pkg} {found.version}), but "
                           f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} of another CUDA release: ptxas "
                           f"refuses the newer PTX a newer cicc writes", ev)
    if not parts:
        return res("pass", f"nvcc's own parts come in {nvcc_pkg} itself", ev)
    return res("pass", f"{', '.join(n for n, _ in parts)} {'is' if len(parts) == 1 else 'are'} of nvcc's CUDA "
                       f"{'.'.join(map(str, want))}", ev)


def _torch_major(rule: Rule, res: Any, ev: list[Evidence], sources: SourceSet, *, toolkit: str | None,
                 torch_cuda: str | None) -> ProbeResult:
    """The stack's nvcc against the CUDA torch was built with (torch/version.py in the wheel, else stack.toml):
    a major mismatch fails (torch raises), a minor one passes with torch's warning in the reason."""
    if toolkit is None:
        return res("pass", "the image has no nvcc: nothing there compiles against torch's CUDA", ev)
    built = torch_version_cuda(sources) or torch_cuda
    if built is None:
        return res("pass", "torch is not built for CUDA: the rule does not bind", ev)
    ev += toolkit_evidence(rule, sources)
    ev.append(Evidence(text=f"nvcc (the one the image's JIT compilers find) = {toolkit}; torch.version.cuda = {built}"))
    have, want = version_tuple(toolkit), version_tuple(built)
    if have[:1] != want[:1]:
        return res("fail", f"nvcc {toolkit} is CUDA {have[0]}, torch is built for CUDA {built}: torch refuses to build "
                           f"a CUDA extension with it (\"The detected CUDA version ({'.'.join(map(str, have))}) "
                           f"mismatches the version that was used to compile PyTorch ({built})\")", ev)
    if have != want:
        return res("pass", f"nvcc {toolkit} and torch's CUDA {built} share the major (a minor mismatch: torch warns)",
                   ev)
    return res("pass", f"nvcc {toolkit} is torch's CUDA {built}", ev)


def toolkit_evidence(rule: Rule, sources: SourceSet) -> list[Evidence]:
    """The line of the rule's toolkit_source (where the library reads its toolkit), when the rule names one and
    the package is in the set."""
    ref = rule.toolkit_source
    tl = find_line(sources, ref) if ref and sources.has(ref.package) else None
    if ref is None or tl is None:
        return []
    return [Evidence(text=ref.note or tl[1].string.strip(), package=ref.package, file=ref.file, line=tl[0])]


def torch_version_cuda(sources: SourceSet) -> str | None:
    """torch.version.cuda of the torch wheel in the set, read from torch/version.py."""
    text = sources.read("torch", "torch/version.py") if sources.has("torch") else None
    m = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]+)['\"]", text or "", re.M)
    return m[1] if m else None


def rule_packages(rule: Rule) -> set[str]:
    return {normalize(p) for p in rule.requires} | ({normalize(rule.source.package)} if rule.source else set())
