"""Run the probes of the chosen layers for one stack and assemble a ProbeReport (what `rlstack probe`
prints or writes as JSON, and what compat_matrix rows are made of).

The static layers read only what they need: the resolve layer answers from a lock made from the stack's
exact inputs (uv runs for co-installs and stale locks, in the background while the rest runs), and the
contract and toolchain layers range-read the members they analyse from the locked wheels
(rlstack.probes.remote). A contract or toolchain result depends only on the wheels it read (named by
their sha256), its case or rule, the arch and toolkit, and the probes' own code, so it is cached under the
hash of all of those: a warm run re-analyses nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import platform
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rlstack.core.errors import LockError, RlstackError
from rlstack.probes import contract, discover, environment, remote, resolve, runtime, signatures, toolchain
from rlstack.probes.inputs import code_hash, fetch_sources
from rlstack.probes.model import LAYERS, Evidence, ProbeReport, ProbeResult, timed
from rlstack.probes.remote import RemoteWheel
from rlstack.probes.wheels import SourceSet, WheelCache, cache_dir
from rlstack.stacks import locks
from rlstack.stacks.locks import LockedPackage, parse_locked
from rlstack.stacks.model import Stack, load_stack


def locked_packages(stack: Stack, lock_text: str | None = None) -> dict[str, LockedPackage]:
    """The stack's lock (or another lock text for it, such as a --suggest candidate's), parsed by locks."""
    return parse_locked(lock_text) if lock_text is not None else locks.locked_packages(stack)


def _result_cache(key: Mapping[str, object], fn: Callable[[], ProbeResult]) -> ProbeResult:
    """fn's result, cached under the hash of `key` (which names everything the answer depends on). An
    undecided skip is not cached: what was missing may be there next time."""
    digest = hashlib.sha256(json.dumps({**key, "code": code_hash()}, sort_keys=True).encode()).hexdigest()
    path = cache_dir() / "results" / f"{digest}.json"
    if path.is_file():
        try:
            res = ProbeResult.model_validate_json(path.read_text())
            res.duration_s = 0.0
            return res
        except ValueError:
            pass
    res = fn()
    if not res.undecided and not res.reason.startswith("probe crashed"):
        path.parent.mkdir(parents=True, exist_ok=True)
        remote.write_text(path, res.model_dump_json())
    return res


def _coinstall(other: Stack, stack: Stack, fresh: bool) -> Callable[[], ProbeResult]:
    return lambda: resolve.probe_coinstall(other, stack, fresh=fresh)


def _cached_probe(key: Mapping[str, object], pid: str, layer: str, fn: Callable[[], ProbeResult]
                  ) -> Callable[[], ProbeResult]:
    """A probe to run later: from the result cache, or timed and stored; its id is the one asked for."""
    def go() -> ProbeResult:
        res = _result_cache(key, lambda: timed(pid, layer, fn))
        res.id = pid
        return res
    return go


def case_members(case: contract.Case) -> list[tuple[str, str]]:
    """(package, file) of every source a contract case names (what its check opens first)."""
    out = [(r.package, r.file) for r in (case.replacement, case.original) if r is not None]
    if case.function is not None:
        out.append((case.function.package, case.function.file))
    out += [(s.package, s.file) for s in case.installed_at]
    out += [(s.package, s.file) for s in case.activated_by]
    out += [(s.package, s.file) for s in case.namespace]
    out += [(u.package, f) for u in case.used_by for f in u.files]
    if case.pasted_at is not None:
        out.append((case.pasted_at.package, case.pasted_at.file))
    return out


def rule_members(rule: toolchain.Rule, sources: SourceSet) -> list[tuple[str, str]]:
    """(package, file) of every member a toolchain rule reads: its cited lines, torch's version.py, and for the
    arch-list rule the shared library, unless its arch list is already cached (the largest member the probes
    read, ~9 MB: fetched from the start of the probe, its download overlaps the analysis instead of
    following it)."""
    out = [(rule.source.package, rule.source.file)] if rule.source is not None else []
    if rule.toolkit_source is not None:
        out.append((rule.toolkit_source.package, rule.toolkit_source.file))
    if rule.kind == "toolkit_torch_major":
        out.append(("torch", "torch/version.py"))
    if rule.kind == "torch_arch" and sources.has("torch"):
        torch = sources.wheels["torch"]
        if isinstance(torch, RemoteWheel) and not toolchain.arch_list_cached(torch.sha256):
            out.append(("torch", rule.library or "torch/lib/libtorch_python.so"))
    return out


def _prefetching(sources: SourceSet, members: list[tuple[str, str]], fn: Callable[[], ProbeResult]
                 ) -> Callable[[], ProbeResult]:
    """fn, after the members it names are fetched together: a case's check opens its files one after another
    (a round trip each, from a cold cache); fetched up front, they cost one parallel round. Runs only when the
    probe's result is not cached, so a warm run fetches nothing."""
    def go() -> ProbeResult:
        by_pkg: dict[str, list[str]] = {}
        for pkg, f in members:
            if sources.has(pkg):
                by_pkg.setdefault(pkg, []).append(f)

        def one(item: tuple[str, list[str]]) -> None:
            # on failure the check reads the members itself and reports what it cannot read
            with contextlib.suppress(RlstackError, OSError, KeyError, ValueError):
                sources.reader(item[0]).prefetch(item[1])
        with ThreadPoolExecutor(max_workers=max(1, len(by_pkg))) as pool:
            list(pool.map(one, by_pkg.items()))
        return fn()
    return go


class _LazyImage:
    """The image model of one stack (toolchain.read_image), read once, by the first toolchain probe whose result
    is not cached: its toolkit wheels' directories are a round trip each from a cold cache."""

    def __init__(self, stack: Stack, locked: dict[str, LockedPackage], sources: SourceSet, names: set[str],
                 toolkit: str | None) -> None:
        self.args = (stack, locked, sources, names, toolkit)
        self.lock = threading.Lock()
        self.image: toolchain.Image | None = None

    def get(self) -> toolchain.Image | None:
        if not self.args[3]:
            return None
        with self.lock:
            if self.image is None:
                self.image = toolchain.read_image(*self.args)
            return self.image

    def evaluate(self, rule: toolchain.Rule, sources: SourceSet, *, in_image: bool, **kw: Any) -> ProbeResult:
        """toolchain.evaluate with the nvcc the image's JIT finds (none without a model: no toolkit wheel); a
        rule that does not read the toolkit (`in_image` false) does not wait for the model."""
        image = self.get() if in_image else None
        found = image.found() if image is not None else None
        return toolchain.evaluate(rule, sources, toolkit=found.version if found else None, image=image, **kw)


def _unreadable(pid: str, layer: str, package: str, why: str) -> ProbeResult:
    """A probe whose packages are all locked but one of whose wheels cannot be read: it would have decided a
    wall, so it is undecided (never a pass), and the reason says what blocks it and how to fix that."""
    return ProbeResult(id=pid, layer=layer, status="skip", undecided=True,
                       reason=f"undecided: cannot read {package}'s locked wheel: {why[:600]}")


def static_results(stack: Stack, *, layers: list[str], gpu_arch: str | None, locked: dict[str, LockedPackage],
                   cache: WheelCache, toolkit: str | None, with_stacks: list[Stack] | None = None,
                   fresh: bool = False, resolve_stack: bool = True, cases: list[contract.Case] | None = None,
                   discovered_only: bool = False, any_platform: bool = False) -> list[ProbeResult]:
    """The static layers (resolve, contract, toolchain) for a stack as locked (or as a candidate lock).
    `cases`: the contract cases to check (default contracts.yaml); `discovered_only`: no case data at all,
    only what discovery finds (rlstack.probes.discover). The toolchain rules read the nvcc the JIT compilers
    find in the stack's image, modelled from its locked toolkit wheels (toolchain.read_image); `toolkit` replaces
    the version of the stack's toolkit wheel there (a --suggest candidate's), None keeps the lock's."""
    out: list[ProbeResult] = []
    pending: list[tuple[int, Future[ProbeResult]]] = []
    pool = ThreadPoolExecutor(max_workers=4)
    try:
        if "resolve" in layers:
            # uv runs in the background while the wheels are read
            if resolve_stack:
                out.append(ProbeResult(id=f"resolve:{stack.name}", layer="resolve", status="skip", reason="-"))
                pending.append((len(out) - 1, pool.submit(
                    timed, f"resolve:{stack.name}", "resolve", lambda: resolve.probe_stack(stack, fresh=fresh))))
            for other in with_stacks or []:
                # the other (proven) stack's full pins, joined by this stack's top-level requirements
                pid = f"resolve:coinstall:{other.name}+{stack.name}"
                out.append(ProbeResult(id=pid, layer="resolve", status="skip", reason="-"))
                pending.append((len(out) - 1, pool.submit(timed, pid, "resolve", _coinstall(other, stack, fresh))))
        out += _source_layers(stack, layers=layers, gpu_arch=gpu_arch, locked=locked, cache=cache, toolkit=toolkit,
                              cases=cases, discovered_only=discovered_only, any_platform=any_platform)
        for i, fut in pending:
            out[i] = fut.result()
    finally:
        pool.shutdown(wait=True)
    return out


def _source_layers(stack: Stack, *, layers: list[str], gpu_arch: str | None, locked: dict[str, LockedPackage],
                   cache: WheelCache, toolkit: str | None, cases: list[contract.Case] | None,
                   discovered_only: bool, any_platform: bool = False) -> list[ProbeResult]:
    out: list[ProbeResult] = []
    if "contract" in layers:
        cases = [] if discovered_only else contract.load_cases() if cases is None else cases
    else:
        cases = []
    rules = toolchain.load_rules() if "toolchain" in layers else []
    archs = [gpu_arch] if gpu_arch else list(stack.gpu_archs)
    need: set[str] = set()
    for c in cases:
        if contract.case_packages(c) <= set(locked):
            need |= contract.case_packages(c)
    for r in rules:
        if toolchain.rule_packages(r) <= set(locked) and archs:
            need |= toolchain.rule_packages(r)
    # the toolkit the JIT compilers find is evaluated in the image: its ENV and its toolkit wheels' files
    image_names = toolchain.image_wheels(stack, locked, rules) if rules and archs else set()
    need |= image_names
    t0 = time.perf_counter()
    before = (remote.TRAFFIC.requests, remote.TRAFFIC.bytes, len(cache.downloaded))
    sources, errors, digests = fetch_sources(stack, need, locked, cache, any_platform=any_platform, prefetch=False)
    image_bad = sorted(n for n in image_names if n in errors)
    # the image model is read only when a toolchain result is not cached, beside the other probes
    image = _LazyImage(stack, locked, sources, image_names, toolkit)
    image_key = {**toolchain.image_inputs(stack, toolkit), "wheels": {n: digests[n] for n in sorted(image_names)
                                                                      if n in digests}}
    # each probe reads a few members lazily; run side by side, their round trips overlap
    jobs: list[ProbeResult | Callable[[], ProbeResult]] = []
    pool = ThreadPoolExecutor(max_workers=6)
    try:
        for c in cases:
            pid = f"contract:{c.id}"
            absent = sorted(contract.case_packages(c) - set(locked))
            bad = sorted(p for p in contract.case_packages(c) if p in errors)
            if absent:
                jobs.append(ProbeResult(id=pid, layer="contract", status="skip",
                                        reason=f"not applicable: {', '.join(absent)} not in the {stack.name} lock"))
            elif bad:
                jobs.append(_unreadable(pid, "contract", bad[0], errors[bad[0]]))
            else:
                ckey: dict[str, object] = {"probe": pid, "case": c.model_dump(mode="json"),
                                           "wheels": {p: digests[p] for p in sorted(contract.case_packages(c))}}
                jobs.append(_cached_probe(ckey, pid, "contract", _prefetching(
                    sources, case_members(c), functools.partial(contract.run_case, c, sources))))
        for r in rules:
            pid = f"toolchain:{r.id}"
            absent = sorted(toolchain.rule_packages(r) - set(locked))
            if not archs:
                jobs.append(ProbeResult(id=pid, layer="toolchain", status="skip",
                                        reason=f"stack '{stack.name}' targets no GPU arch (gpu_archs = [])"))
                continue
            if absent:
                jobs.append(ProbeResult(id=pid, layer="toolchain", status="skip",
                                        reason=f"not applicable: {', '.join(absent)} not in the {stack.name} lock"))
                continue
            bad = sorted(p for p in toolchain.rule_packages(r) if p in errors)
            in_image = r.kind != "torch_arch"  # every other rule reads the toolkit the image's JIT finds
            for arch in archs:
                aid = pid if gpu_arch else f"{pid}@{arch}"
                if bad:
                    jobs.append(_unreadable(aid, "toolchain", bad[0], errors[bad[0]]))
                    continue
                if in_image and image_bad:
                    jobs.append(_unreadable(aid, "toolchain", image_bad[0], errors[image_bad[0]]))
                    continue
                key: dict[str, object] = {
                    "probe": aid, "rule": r.model_dump(mode="json"), "arch": arch,
                    "image": image_key if in_image else None,
                    "torch_cuda": stack.torch.cuda, "torch": digests.get("torch"),
                    "wheels": {p: digests[p] for p in sorted(toolchain.rule_packages(r))}}
                check = functools.partial(image.evaluate, r, sources, gpu_arch=arch, torch_cuda=stack.torch.cuda,
                                          torch_wheel=sources.wheels.get("torch"), in_image=in_image)
                jobs.append(_cached_probe(key, aid, "toolchain",
                                          _prefetching(sources, rule_members(r, sources), check)))
        futures = [pool.submit(j) if callable(j) else j for j in jobs]
        out += [f.result() if isinstance(f, Future) else f for f in futures]
        if "contract" in layers and discovered_only:
            out += discover.results(stack, locked=locked, cache=cache)
    finally:
        pool.shutdown(wait=True)
        sources.close()
    requests = remote.TRAFFIC.requests - before[0]
    if requests and out:
        whole = cache.downloaded[before[2]:]
        out[-1].evidence.append(Evidence(
            text=f"read {len(need)} locked wheel(s) in {time.perf_counter() - t0:.1f}s: {requests} request(s), "
                 f"{(remote.TRAFFIC.bytes - before[1]) / 1e6:.1f} MB"
                 + (f"; whole wheels (the index refused byte ranges): {', '.join(whole)}" if whole else "")))
    return out


def _require_lock(stack: Stack) -> None:
    """A stack without a lock: either its pins do not resolve (uv's explanation, non-zero) or it was never
    locked. Either way there is nothing to probe; say which, not a traceback."""
    if stack.lock_file.is_file():
        return
    res = resolve.probe_stack(stack, fresh=True)
    text = res.evidence[0].text if res.evidence else res.reason
    if res.status == "fail":
        raise LockError(f"stack '{stack.name}' does not resolve for Python {stack.python} on {stack.platform}, so it "
                        f"has no lock to probe. uv says:\n{text}",
                        f"change the conflicting pins in {stack.requirements_in} or {stack.stack_file}, then "
                        f"invoke lock --stack {stack.name}")
    if res.status == "skip":
        raise LockError(f"stack '{stack.name}' has no lock, and uv could not reach the index to resolve it:\n{text}",
                        "check the network, then invoke lock --stack " + stack.name)
    raise LockError(f"stack '{stack.name}' resolves but has no lock ({stack.lock_file})",
                    f"invoke lock --stack {stack.name}")


def run(stack_name: str, *, layers: list[str] | None = None, gpu_arch: str | None = None,
        with_stacks: list[str] | None = None, fresh: bool = False, cache: WheelCache | None = None,
        fp8_runtime: bool | None = None, runtime_only: list[str] | None = None,
        discovered_only: bool = False) -> ProbeReport:
    t0 = time.perf_counter()
    stack = load_stack(stack_name)
    layers = list(layers or LAYERS)
    unknown = sorted(set(layers) - set(LAYERS))
    if unknown:
        raise RlstackError(f"unknown probe layer(s): {', '.join(unknown)}", f"choose from {', '.join(LAYERS)}")
    _require_lock(stack)
    cache = cache or WheelCache()
    locked = locked_packages(stack)
    toolkit = stack.cuda_toolkit.version if stack.cuda_toolkit else None
    results = static_results(stack, layers=layers, gpu_arch=gpu_arch, locked=locked, cache=cache, toolkit=None,
                             with_stacks=[load_stack(n) for n in with_stacks or []], fresh=fresh,
                             discovered_only=discovered_only)
    facts: dict[str, str] = {}
    env = None
    torch_cuda = stack.torch.cuda
    if "runtime" in layers:
        # the runtime layer reports on what it imported, which natively need not be the lock
        env = environment.capture(stack, locked)
        torch_cuda = env.torch_cuda
        facts = runtime.gpu_facts()
        if gpu_arch and facts.get("arch") and facts["arch"] != gpu_arch:
            raise RlstackError(f"--gpu-arch {gpu_arch}, but the GPU here is {facts['arch']} "
                               f"({facts.get('gpu', 'unnamed')}): runtime results would be filed under the wrong arch",
                               "leave out --gpu-arch for a runtime run (the GPU present is what gets measured), "
                               "or check the runner's labels")
        fp8 = fp8_runtime if fp8_runtime is not None else stack.fp8_rl  # stack.toml: Unsloth's FP8 RL path
        unknown_probes = sorted(set(runtime_only or []) - set(runtime.BODIES))
        if unknown_probes:
            raise RlstackError(f"unknown runtime probe(s): {', '.join(unknown_probes)}",
                               f"choose from {', '.join(runtime.BODIES)}")
        results += runtime.run_all(fp8=fp8, only=runtime_only or None)
    host_toolkit = env.toolkit if env is not None else environment.toolkit()[0]
    results = [signatures.match_result(r) for r in results]
    return ProbeReport(
        stack=stack.name, lock_hash=locks.lock_hash(stack), gpu_arch=gpu_arch or facts.get("arch"),
        toolkit=toolkit, host_toolkit=host_toolkit, torch_cuda=torch_cuda, driver=facts.get("driver"),
        host=platform.node(), date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), layers=layers,
        results=results, duration_s=round(time.perf_counter() - t0, 3), environment=env)
