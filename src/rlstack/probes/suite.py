"""Run the probes of the chosen layers for one stack and assemble a ProbeReport (what `rlstack probe`
prints or writes as JSON, and what compat_matrix rows are made of)."""

from __future__ import annotations

import datetime as dt
import platform
import time
from pathlib import Path

from rlstack.core.errors import RlstackError
from rlstack.host import locks
from rlstack.host.locks import LockedPackage, parse_locked
from rlstack.host.stacks import Stack, load_stack
from rlstack.probes import contract, environment, resolve, runtime, signatures, toolchain
from rlstack.probes.model import LAYERS, Evidence, ProbeReport, ProbeResult, timed
from rlstack.probes.wheels import SourceSet, WheelCache, WheelError


def locked_packages(stack: Stack, lock_text: str | None = None) -> dict[str, LockedPackage]:
    """The stack's lock (or another lock text for it, such as a --suggest candidate's), parsed by locks."""
    return parse_locked(lock_text) if lock_text is not None else locks.locked_packages(stack)


def fetch_sources(stack: Stack, names: set[str], locked: dict[str, LockedPackage], cache: WheelCache
                  ) -> tuple[SourceSet, dict[str, str]]:
    """Verified local wheels for `names` (those in the lock), and {package: why} for those that failed."""
    wheels: dict[str, Path] = {}
    errors: dict[str, str] = {}
    for name in sorted(names):
        if name not in locked:
            continue
        try:
            wheels[name] = cache.fetch(locked[name], stack.python, stack.platform)
        except WheelError as exc:
            errors[name] = str(exc)
    return SourceSet(wheels), errors


def static_results(stack: Stack, *, layers: list[str], gpu_arch: str | None, locked: dict[str, LockedPackage],
                   cache: WheelCache, toolkit: str | None, with_stacks: list[Stack] | None = None,
                   fresh: bool = False, resolve_stack: bool = True) -> list[ProbeResult]:
    """The static layers (resolve, contract, toolchain) for a stack as locked (or as a candidate lock)."""
    out: list[ProbeResult] = []
    if "resolve" in layers:
        if resolve_stack:
            out.append(timed(f"resolve:{stack.name}", "resolve", lambda: resolve.probe_stack(stack, fresh=fresh)))
        for other in with_stacks or []:
            # the other (proven) stack's full pins, joined by this stack's top-level requirements
            out.append(timed(f"resolve:coinstall:{other.name}+{stack.name}", "resolve",
                             lambda o=other: resolve.probe_coinstall(o, stack, fresh=fresh)))  # type: ignore[misc]
    cases = contract.load_cases() if "contract" in layers else []
    rules = toolchain.load_rules() if "toolchain" in layers else []
    archs = [gpu_arch] if gpu_arch else list(stack.gpu_archs)
    need: set[str] = set()
    for c in cases:
        if contract.case_packages(c) <= set(locked):
            need |= contract.case_packages(c)
    for r in rules:
        if toolchain.rule_packages(r) <= set(locked) and archs:
            need |= toolchain.rule_packages(r)
    t0 = time.perf_counter()
    sources, errors = fetch_sources(stack, need, locked, cache)
    fetch_s = time.perf_counter() - t0
    try:
        for c in cases:
            pid = f"contract:{c.id}"
            absent = sorted(contract.case_packages(c) - set(locked))
            bad = sorted(p for p in contract.case_packages(c) if p in errors)
            if absent:
                out.append(ProbeResult(id=pid, layer="contract", status="skip",
                                       reason=f"not applicable: {', '.join(absent)} not in the {stack.name} lock"))
            elif bad:
                out.append(ProbeResult(id=pid, layer="contract", status="skip", reason=errors[bad[0]][:500]))
            else:
                out.append(timed(pid, "contract", lambda c=c: contract.run_case(c, sources)))  # type: ignore[misc]
        for r in rules:
            pid = f"toolchain:{r.id}"
            absent = sorted(toolchain.rule_packages(r) - set(locked))
            if not archs:
                out.append(ProbeResult(id=pid, layer="toolchain", status="skip",
                                       reason=f"stack '{stack.name}' targets no GPU arch (gpu_archs = [])"))
                continue
            if absent:
                out.append(ProbeResult(id=pid, layer="toolchain", status="skip",
                                       reason=f"not applicable: {', '.join(absent)} not in the {stack.name} lock"))
                continue
            bad = sorted(p for p in toolchain.rule_packages(r) if p in errors)
            for arch in archs:
                aid = pid if gpu_arch else f"{pid}@{arch}"
                if bad:
                    out.append(ProbeResult(id=aid, layer="toolchain", status="skip", reason=errors[bad[0]][:500]))
                    continue
                res = timed(aid, "toolchain", lambda r=r, arch=arch: toolchain.evaluate(  # type: ignore[misc]
                    r, sources, gpu_arch=arch, toolkit=toolkit, torch_cuda=stack.torch.cuda,
                    torch_wheel=sources.wheels.get("torch")))
                res.id = aid
                out.append(res)
    finally:
        sources.close()
    if cache.downloaded and out:
        out[-1].evidence.append(Evidence(text=f"downloaded {len(cache.downloaded)} wheel(s) in {fetch_s:.1f}s: "
                                              + ", ".join(cache.downloaded)))
    return out


def run(stack_name: str, *, layers: list[str] | None = None, gpu_arch: str | None = None,
        with_stacks: list[str] | None = None, fresh: bool = False, cache: WheelCache | None = None,
        fp8_runtime: bool | None = None, runtime_only: list[str] | None = None) -> ProbeReport:
    t0 = time.perf_counter()
    stack = load_stack(stack_name)
    layers = list(layers or LAYERS)
    unknown = sorted(set(layers) - set(LAYERS))
    if unknown:
        raise RlstackError(f"unknown probe layer(s): {', '.join(unknown)}", f"choose from {', '.join(LAYERS)}")
    cache = cache or WheelCache()
    locked = locked_packages(stack)
    toolkit = stack.cuda_toolkit.version if stack.cuda_toolkit else None
    results = static_results(stack, layers=layers, gpu_arch=gpu_arch, locked=locked, cache=cache, toolkit=toolkit,
                             with_stacks=[load_stack(n) for n in with_stacks or []], fresh=fresh)
    facts: dict[str, str] = {}
    env = None
    torch_cuda = stack.torch.cuda
    if "runtime" in layers:
        # the runtime layer reports on what it imported, which natively need not be the lock
        env = environment.capture(stack, locked)
        toolkit, torch_cuda = env.toolkit, env.torch_cuda
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
    results = [signatures.match_result(r) for r in results]
    return ProbeReport(
        stack=stack.name, lock_hash=locks.lock_hash(stack), gpu_arch=gpu_arch or facts.get("arch"),
        toolkit=toolkit, torch_cuda=torch_cuda, driver=facts.get("driver"), host=platform.node(),
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), layers=layers, results=results,
        duration_s=round(time.perf_counter() - t0, 3), environment=env)
