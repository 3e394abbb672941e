"""The probe commands: `probe` and `diagnose` run anywhere (the runtime layer inside a stack, on its GPU);
`probe-fp8` is the report's FP8 RL question, asked from the host of both FP8 stacks: the report's combination
(fp8-report, walls intact) and the working FP8 stack (fp8). Options are declared here once
(rlstack.core.options) for both the `rlstack` CLI and invoke."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import write_atomic
from rlstack.core.options import Opt

# The two stacks `probe-fp8` compares, named here once: the report's FP8 RL combination with its walls intact
# (the reference), and the FP8 RL stack that gets through them.
FP8_REPORT_STACK = "fp8-report"
FP8_STACK = "fp8"
FP8_QUESTION = "FP8 GRPO (Unsloth load_in_fp8 + vLLM rollouts, {stack} stack) on {arch}"
FP8_LAYERS = "resolve,contract,toolchain"

Layers = Annotated[str | None, Opt("comma-separated layers: resolve,contract,toolchain,runtime (default: all)")]
AsJson = Annotated[bool, Opt("print the report as JSON instead of the table", flag="--json")]
Output = Annotated[Path | None, Opt("also write the JSON report to this file", short="-o")]
Fresh = Annotated[bool, Opt("ignore cached resolutions")]
Suggest = Annotated[bool, Opt("find the closest combination of versions that passes every static probe (fewest "
                               "packages changed, then fewest releases moved), verified by uv")]
DiscoveredOnly = Annotated[bool, Opt("contract layer from discovery alone: no case data from contracts.yaml (what "
                                     "the wheels' sources show by themselves)")]


def _split(spec: str | None) -> list[str] | None:
    return [x.strip() for x in spec.split(",") if x.strip()] if spec else None


def _write_json(report: Any, path: Path | None) -> None:
    text = report.model_dump_json(indent=2)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text + "\n")
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text)


def _suggest(stack: str, arch: str, json_: bool = False) -> tuple[int, Any]:
    """Run the --suggest search; print it (unless json_), return (exit code, the report)."""
    from rlstack.probes import suggest

    found = suggest.search(stack, gpu_arch=arch, progress=not json_)
    if not json_:
        print()
        print(suggest.render(found))
    return (0 if any(s.passes for s in found.suggestions) else 1), found


def probe(
    stack: Annotated[str, Opt("stack name (images/<stack>/stack.toml)")],
    gpu_arch: Annotated[str | None, Opt("target GPU arch, e.g. sm_120 (default: each of the stack's gpu_archs)")]
    = None,
    layer: Layers = None,
    with_stack: Annotated[str | None, Opt("also check co-installing with these stacks (comma-separated)",
                                          flag="--with")] = None,
    runtime_probes: Annotated[str | None, Opt("only these runtime probes (comma-separated; default: all): "
                                              "cuda-init,bnb-4bit,fp8-matmul,vllm-lora,grpo-step")] = None,
    json_: AsJson = False,
    output: Output = None,
    fresh: Fresh = False,
    suggest: Suggest = False,
    discovered_only: DiscoveredOnly = False,
) -> int:
    """Run a stack's probes (resolve, contract, toolchain, runtime): a table or JSON. Exit 1 when a probe fails,
    3 when none fails but one that decides a wall could not run (undecided, never a pass). A runtime report
    records the environment it ran in and how it departs from the lock."""
    from rlstack.probes import suite

    r = suite.run(stack, layers=_split(layer), gpu_arch=gpu_arch, with_stacks=_split(with_stack) or [],
                  fresh=fresh, runtime_only=_split(runtime_probes), discovered_only=discovered_only)
    if suggest and json_:
        src, found = _suggest(stack, gpu_arch or "sm_120", json_=True)
        if output:
            _write_json(r, output)
        print(json.dumps({"report": r.model_dump(mode="json"), **found.model_dump(mode="json")}, indent=2))
        return max(r.exit_code, src)
    rc = _report(r, f"stack {r.stack}" if r.failed or r.undecided else None, json_=json_, output=output)
    if suggest:
        rc = max(rc, _suggest(stack, gpu_arch or "sm_120")[0])
    return rc


def _report(r: Any, question: str | None, *, json_: bool, output: Path | None) -> int:
    """The report as a table with the verdict on `question` (or as JSON on stdout), also written to `output`;
    exit 1 when a probe failed."""
    from rlstack.probes import report as rep

    if output:
        _write_json(r, output)
    if json_:
        _write_json(r, None)
    else:
        print(rep.table(r))
        if question:
            print()
            print(rep.verdict(r, question))
    return int(r.exit_code)


def probe_fp8(
    gpu_arch: Annotated[str, Opt("target GPU arch (default sm_120, the report's RTX 5090)")] = "sm_120",
    layer: Annotated[str | None, Opt(f"comma-separated layers (default: {FP8_LAYERS}; runtime measures this "
                                     "machine's Python, so GPU rows come from the stack's image: "
                                     "invoke probe-job)")] = None,
    json_: Annotated[bool, Opt("print both reports (and the matrix's runtime rows) as one JSON object",
                               flag="--json")] = False,
    output: Annotated[Path | None, Opt("also write each stack's JSON report into this folder "
                                       "(probe-STACK-ARCH.json, for invoke matrix --results)", short="-o")] = None,
    fresh: Fresh = False,
    suggest: Annotated[bool, Opt(f"find the combination closest to {FP8_REPORT_STACK}'s lock that passes every "
                                 "static probe (and the alternative that moves its vLLM)")] = False,
) -> int:
    """The report's FP8 RL question for both FP8 stacks: the report's combination (fp8-report) with each wall
    and its fix, then the working fp8 stack's verdict; exits 0 when fp8 passes (fp8-report keeps its walls).

    Both run the same layers on the same arch (default: the static ones, from the committed locks, no GPU);
    fp8-report is also resolved together with the portable stack (the report's torch pin conflict). Each wall
    of fp8-report is then looked up in fp8's results, and the runtime rows compat_matrix.yaml holds for
    either stack are listed with whether their lock is still the stack's lock. The exit is non-zero when a
    probe of fp8 fails, or when a runtime row measured at fp8's current lock has a failing probe (except on a
    wall that rlstack's own probe setup caused and fixed after that row: listed, to be measured again)."""
    from rlstack.matrix.runtime_rows import matrix_runtime_rows as runtime_rows_of
    from rlstack.matrix.runtime_rows import render_runtime_rows
    from rlstack.probes import report as rep
    from rlstack.probes import suite

    layers = _split(layer or FP8_LAYERS)
    from concurrent.futures import ThreadPoolExecutor

    from rlstack.probes import remote
    from rlstack.probes.wheels import WheelCache

    cache = WheelCache()  # one cache object: what one stack's run fetched (vLLM's, torch's) serves the other
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two stacks overlap their network waits
        ref_f = pool.submit(suite.run, FP8_REPORT_STACK, layers=layers, gpu_arch=gpu_arch, with_stacks=["portable"],
                            fresh=fresh, cache=cache)
        new_f = pool.submit(suite.run, FP8_STACK, layers=layers, gpu_arch=gpu_arch, fresh=fresh, cache=cache)
        ref, new = ref_f.result(), new_f.result()
    runtime_rows = runtime_rows_of([ref, new])
    rc = 1 if new.failed or _runtime_failures(new.stack, runtime_rows) else 3 if new.undecided else 0
    if output:
        for r in (ref, new):
            _write_json(r, output / f"probe-{r.stack}-{gpu_arch}.json")
    if json_:
        found = _suggest(FP8_REPORT_STACK, gpu_arch, json_=True)[1] if suggest else None
        print(json.dumps({"gpu_arch": gpu_arch, "reference": FP8_REPORT_STACK, "stack": FP8_STACK,
                          "reports": {r.stack: r.model_dump(mode="json") for r in (ref, new)},
                          "matrix_runtime_rows": [r.model_dump(mode="json") for r in runtime_rows],
                          "traffic": remote.TRAFFIC.as_dict(),
                          **({"suggest": found.model_dump(mode="json")} if found else {}),
                          "exit": rc}, indent=2))
        return rc
    else:
        for title, r in ((f"{FP8_REPORT_STACK}: the report's combination, walls intact (the reference)", ref),
                         (f"{FP8_STACK}: the working FP8 RL stack", new)):
            print(f"== {title} ==")
            print(rep.table(r))
            print()
            print(rep.verdict(r, FP8_QUESTION.format(stack=r.stack, arch=gpu_arch)))
            print()
        print(rep.walls_compared(ref, new))
        print()
        print(render_runtime_rows(runtime_rows, [FP8_REPORT_STACK, FP8_STACK]))
        print()
        print(_fp8_answer(ref, new, gpu_arch, runtime_rows))
    if suggest:
        _suggest(FP8_REPORT_STACK, gpu_arch)
    return rc


def _runtime_failures(stack: str, runtime_rows: list[Any]) -> list[Any]:
    """Matrix rows of `stack` measured at its current lock in which a runtime probe failed, other than on a wall
    rlstack's own probe setup caused and fixed after the row was measured (RuntimeRow.superseded)."""
    return [r for r in runtime_rows if r.stack == stack and r.lock_current and r.blocking]


def _fp8_answer(ref: Any, new: Any, arch: str, runtime_rows: list[Any]) -> str:
    """The last word of probe-fp8: the reference's walls in one line, the working stack's verdict in another."""
    from rlstack.probes import report as rep

    layers = ", ".join(new.layers)
    found = [w for w, _ in rep.walls(ref.results)]
    lines = [f"ANSWER ({arch}; {layers}):",
             f"  {ref.stack}: " + (f"BLOCKED by {len(found)} wall(s): {', '.join(found)} (the report's combination)"
                                   if found else "no wall found")]
    current = [r for r in runtime_rows if r.stack == new.stack and r.lock_current]
    gpu_fail = _runtime_failures(new.stack, runtime_rows)
    if current:
        states = [f"{r.gpu_arch or '-'} " + (f"FAIL ({', '.join(r.walls) or 'no wall named'})" if r in gpu_fail
                                             else f"failed only on rlstack's own {', '.join(r.superseded)}, fixed "
                                                  "in rlstack since: to be measured again" if r.superseded
                                             else "no failure") for r in current]
        gpu = f"runtime at this lock: {'; '.join(states)}"
    else:
        gpu = "no runtime row at this lock yet: not measured on a GPU"
    if new.failed or gpu_fail:
        bad = [w for w, _ in rep.walls(new.results)]
        what = f"{len(new.failed)} probe(s) fail: {', '.join(bad)}" if new.failed else "a measured runtime row fails"
        lines.append(f"  {new.stack}: FAILS, {what} ({gpu}) -> exit 1")
    elif new.undecided:
        lines.append(f"  {new.stack}: UNDECIDED, {len(new.undecided)} probe(s) that decide a wall could not run: "
                     f"{', '.join(r.id for r in new.undecided)} ({gpu}) -> exit 3")
    else:
        skipped = sum(r.status == "skip" for r in new.results)
        lines.append(f"  {new.stack}: no probe fails ({len(new.results) - skipped} pass, {skipped} skip; {gpu}) "
                     "-> exit 0")
    return "\n".join(lines)


def diagnose(
    log: Annotated[str, Opt("the log file to read, or - for standard input", positional=True)],
    json_: Annotated[bool, Opt("machine-readable output", flag="--json")] = False,
) -> int:
    """Name the known walls in any log (signatures.yaml): the wall, why, and the fix. Exits 1 when one
    matches."""
    from rlstack.probes import signatures

    try:
        text = sys.stdin.read() if log == "-" else Path(log).read_text(errors="replace")
    except FileNotFoundError:
        raise RlstackError(f"{log}: no such log file") from None
    hits = signatures.diagnose(text)
    if json_:
        print(json.dumps([{"wall": h.signature.id, "line": h.line, "excerpt": h.excerpt, "title": h.signature.title,
                           "explanation": h.signature.explanation, "fix": h.signature.fix} for h in hits], indent=2))
        return 1 if hits else 0
    if not hits:
        print(f"no known failure signature in {log} ({len(text.splitlines())} lines)")
        return 0
    for h in hits:
        print(f"[{h.signature.id}] line {h.line}: {h.signature.title}")
        print(f"  log: {h.excerpt}")
        print(f"  why: {h.signature.explanation}")
        print(f"  fix: {h.signature.fix}")
    return 1


IN_STACK = [probe, diagnose]
