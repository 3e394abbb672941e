"""The probe commands: `probe` and `diagnose` run anywhere (the runtime layer inside a stack, on its GPU);
`probe-fp8` is the report's FP8 RL question, asked from the host. Options are declared here once
(rlstack.core.options) for both the `rlstack` CLI and invoke."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import write_atomic
from rlstack.core.options import Opt

FP8_QUESTION = "FP8 GRPO (Unsloth load_in_fp8 + vLLM rollouts, fp8 stack) on {arch}"

Layers = Annotated[str | None, Opt("comma-separated layers: resolve,contract,toolchain,runtime (default: all)")]
AsJson = Annotated[bool, Opt("print the report as JSON instead of the table", flag="--json")]
Output = Annotated[Path | None, Opt("also write the JSON report to this file", short="-o")]
Fresh = Annotated[bool, Opt("ignore cached resolutions")]
Suggest = Annotated[bool, Opt("search nearby versions for a combination that passes the static probes")]
MaxCandidates = Annotated[int, Opt("bound of the --suggest search")]


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


def _suggest(stack: str, arch: str, bound: int) -> int:
    from rlstack.probes import suggest

    best, tried = suggest.search(stack, gpu_arch=arch, max_candidates=bound)
    print()
    print(suggest.render(stack, arch, best, tried, bound))
    return 0 if best else 1


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
    max_candidates: MaxCandidates = 12,
) -> int:
    """Run a stack's probes (resolve, contract, toolchain, runtime): a table or JSON, non-zero exit when a probe
    fails. A runtime report records the environment it ran in and how it departs from the lock."""
    from rlstack.probes import suite

    r = suite.run(stack, layers=_split(layer), gpu_arch=gpu_arch, with_stacks=_split(with_stack) or [],
                  fresh=fresh, runtime_only=_split(runtime_probes))
    rc = _report(r, f"stack {r.stack}" if r.failed else None, json_=json_, output=output)
    if suggest:
        rc = max(rc, _suggest(stack, gpu_arch or "sm_120", max_candidates))
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
    return 1 if r.failed else 0


def probe_fp8(
    gpu_arch: Annotated[str, Opt("target GPU arch (default sm_120, the report's RTX 5090)")] = "sm_120",
    layer: Layers = None,
    json_: AsJson = False,
    output: Output = None,
    fresh: Fresh = False,
    suggest: Suggest = False,
    max_candidates: MaxCandidates = 12,
) -> int:
    """The report's FP8 RL question end to end: every layer for the fp8 stack, then a verdict naming each wall
    and its fix."""
    from rlstack.probes import suite

    r = suite.run("fp8", layers=_split(layer), gpu_arch=gpu_arch, with_stacks=["portable"], fresh=fresh)
    rc = _report(r, FP8_QUESTION.format(arch=gpu_arch), json_=json_, output=output)
    if suggest:
        _suggest("fp8", gpu_arch, max_candidates)
    return rc


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
