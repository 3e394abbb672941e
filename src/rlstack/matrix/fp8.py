"""`probe-fp8`: the report's FP8 RL question, asked from the host of both FP8 stacks: the report's combination
(fp8-report, walls intact) and the working FP8 stack (fp8), with what compat_matrix.yaml measured of either on a
GPU. It reads the probes and the matrix, so it sits with the matrix (the probes never read the matrix:
docs/decisions/0001-layers.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rlstack.matrix.runtime_rows import matrix_runtime_rows as runtime_rows_of
from rlstack.matrix.runtime_rows import render_runtime_rows
from rlstack.probes.commands import Fresh, run_suggest, split_csv, write_report

# The two stacks `probe-fp8` compares, named here once: the report's FP8 RL combination with its walls intact
# (the reference), and the FP8 RL stack that gets through them.
FP8_REPORT_STACK = "fp8-report"
FP8_STACK = "fp8"
FP8_QUESTION = "FP8 GRPO (Unsloth load_in_fp8 + vLLM rollouts, {stack} stack) on {arch}"
FP8_LAYERS = "resolve,contract,toolchain"


def probe_fp8(
    gpu_arch: Annotated[str, typer.Option(help="target GPU arch (sm_120 is the report's RTX 5090)")] = "sm_120",
    layer: Annotated[str | None, typer.Option(help=f"comma-separated layers (default: {FP8_LAYERS}; runtime "
                                                   "measures this machine's Python, so GPU rows come from the "
                                                   "stack's image: invoke ci.probe-job)")] = None,
    json_: Annotated[bool, typer.Option("--json", help="print both reports (and the matrix's runtime rows) as one "
                                                       "JSON object")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="also write each stack's JSON report into "
                                                                       "this folder (probe-STACK-ARCH.json, for "
                                                                       "invoke matrix --results)")] = None,
    fresh: Fresh = False,
    suggest: Annotated[bool, typer.Option(help=f"find the combination closest to {FP8_REPORT_STACK}'s lock that "
                                               "passes every static probe (and the alternative that moves its "
                                               "vLLM)")] = False,
) -> int:
    """The report's FP8 RL question for both FP8 stacks: the report's combination (fp8-report) with each wall
    and its fix, then the working fp8 stack's verdict; exits 0 when fp8 passes (fp8-report keeps its walls).

    Both run the same layers on the same arch (default: the static ones, from the committed locks, no GPU);
    fp8-report is also resolved together with the portable stack (the report's torch pin conflict). Each wall
    of fp8-report is then looked up in fp8's results, and the runtime rows compat_matrix.yaml holds for
    either stack are listed with whether their lock is still the stack's lock. The exit is non-zero when a
    probe of fp8 fails, or when a runtime row measured at fp8's current lock has a failing probe (except on a
    wall that rlstack's own probe setup caused and fixed after that row: listed, to be measured again)."""
    from rlstack.probes import report as rep
    from rlstack.probes import suite

    layers = split_csv(layer or FP8_LAYERS)
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
            write_report(r, output / f"probe-{r.stack}-{gpu_arch}.json")
    if json_:
        found = run_suggest(FP8_REPORT_STACK, gpu_arch, json_=True)[1] if suggest else None
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
        run_suggest(FP8_REPORT_STACK, gpu_arch)
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
