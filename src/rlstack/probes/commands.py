"""The probe commands: `probe` and `diagnose` run anywhere (the runtime layer inside a stack, on its GPU).
`probe-fp8`, which also reads the compat matrix, is rlstack.matrix.fp8's. Options are declared here once,
in the signatures (typer's `Annotated` options, read by rlstack.core.options), for both the `rlstack` command
and invoke."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import check_output_file, write_atomic

if TYPE_CHECKING:
    from rlstack.probes.model import ProbeReport

Layers = Annotated[str | None, typer.Option(help="comma-separated layers: resolve,contract,toolchain,runtime "
                                                 "(default: all)")]
AsJson = Annotated[bool, typer.Option("--json", help="print the report as JSON instead of the table")]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="also write the JSON report to this file")]
Fresh = Annotated[bool, typer.Option(help="ignore cached resolutions")]
Suggest = Annotated[bool, typer.Option(help="find the closest combination of versions that passes every static "
                                            "probe (fewest packages changed, then fewest releases moved), verified "
                                            "by uv")]
DiscoveredOnly = Annotated[bool, typer.Option(help="contract layer from discovery alone: no case data from "
                                                   "contracts.yaml (what the wheels' sources show by themselves)")]
AcceptBaseline = Annotated[bool, typer.Option(help="write images/<stack>/probe-baseline.json from discovery's "
                                                   "suppressed findings on the current lock, so that none of them is "
                                                   "new since the baseline; then probe (implies --discovered-only)")]


class ProbeReportError(RlstackError):
    """A file given as a probe report (`invoke matrix --results`) that is not one: missing, a directory, binary,
    not JSON, or JSON that is not a report. Exit 7, the code `invoke matrix` gives its other input errors."""

    exit_code = 7


REPORT_HINT = "give the JSON file that 'rlstack probe --stack S -o FILE' (or 'invoke probe-fp8 -o DIR') wrote"
# git's test for a binary file: a NUL byte in its first 8000 bytes. Logs and JSON never hold one.
BINARY_PROBE_BYTES = 8000


def read_user_text(path: Path, what: str, error: type[RlstackError] = RlstackError, *, hint: str | None = None,
                   strict: bool = True) -> str:
    """The text of a file a user named as `what`, or `error` saying why it is not one: missing, a directory,
    unreadable, binary (a NUL byte, or with `strict` bytes that are not UTF-8). A log is read with `strict`
    off: a stray invalid byte in a log is replaced, not refused."""
    try:
        if path.exists() and not (path.is_file() or path.is_dir()):  # reading a pipe would wait for a writer
            raise error(f"{path}: not a regular file (a pipe, socket or device), not a {what}", hint)
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such {what}", hint) from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}", hint) from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}", hint) from None
    nul = data.find(b"\0", 0, BINARY_PROBE_BYTES)
    if nul >= 0:
        raise error(f"{path}: a binary file, not a {what} (a NUL byte at offset {nul})", hint)
    try:
        text = data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a {what}: byte {exc.start} is not UTF-8 text", hint) from None
    if not strict and looks_binary(text):
        raise error(f"{path}: a binary file, not a {what} (over a tenth of it is not UTF-8 text)", hint)
    return text


def looks_binary(text: str) -> bool:
    """Decoded with errors='replace', text that holds a NUL or is more than a tenth replacement characters:
    a log with a few stray bytes stays a log; random bytes (about half invalid UTF-8) do not."""
    head = text[:BINARY_PROBE_BYTES]
    return "\0" in head or (bool(head) and head.count("\ufffd") * 10 > len(head))


def read_report_file(path: Path) -> ProbeReport:
    """The ProbeReport in a file a user gave, or ProbeReportError naming the file and the first field that is
    wrong (where a raw pydantic error would list every field with its internals)."""
    from pydantic import ValidationError

    from rlstack.probes.model import ProbeReport

    text = read_user_text(path, "probe report", ProbeReportError, hint=REPORT_HINT)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeReportError(f"{path}: not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}",
                               REPORT_HINT) from None
    except RecursionError:
        raise ProbeReportError(f"{path}: not a probe report: JSON nested too deeply", REPORT_HINT) from None
    try:
        return ProbeReport.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        field = ".".join(str(x) for x in first["loc"]) or "(the whole file)"
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ProbeReportError(f"{path}: not a probe report: field '{field}': {first['msg']}{more}",
                               REPORT_HINT) from None


def split_csv(spec: str | None) -> list[str] | None:
    return [x.strip() for x in spec.split(",") if x.strip()] if spec else None


def write_report(report: Any, path: Path | None) -> None:
    text = report.model_dump_json(indent=2)
    if path:
        check_output_file(path, "-o/--output")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text + "\n")
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text)


def run_suggest(stack: str, arch: str, json_: bool = False) -> tuple[int, Any]:
    """Run the --suggest search; print it (unless json_), return (exit code, the report)."""
    from rlstack.probes import suggest

    found = suggest.search(stack, gpu_arch=arch, progress=not json_)
    if not json_:
        print()
        print(suggest.render(found))
    return (0 if any(s.passes for s in found.suggestions) else 1), found


def probe(
    stack: Annotated[str, typer.Option(help="stack name (images/<stack>/stack.toml)")],
    gpu_arch: Annotated[str | None, typer.Option(help="target GPU arch, e.g. sm_120 (default: each of the stack's "
                                                      "gpu_archs)")] = None,
    layer: Layers = None,
    with_stack: Annotated[str | None, typer.Option("--with", help="also check co-installing with these stacks "
                                                                  "(comma-separated)")] = None,
    runtime_probes: Annotated[str | None, typer.Option(help="only these runtime probes (comma-separated; default: "
                                                            "all): cuda-init,bnb-4bit,fp8-matmul,vllm-lora,"
                                                            "grpo-step")] = None,
    json_: AsJson = False,
    output: Output = None,
    fresh: Fresh = False,
    suggest: Suggest = False,
    discovered_only: DiscoveredOnly = False,
    accept_baseline: AcceptBaseline = False,
) -> int:
    """Run a stack's probes (resolve, contract, toolchain, runtime): a table or JSON. Exit 1 when a probe fails,
    3 when none fails but one that decides a wall could not run (undecided, never a pass). A runtime report
    records the environment it ran in and how it departs from the lock."""
    from rlstack.core.options import UsageError
    from rlstack.probes import suite
    from rlstack.stacks.model import ARCH_RE

    if gpu_arch is not None and not ARCH_RE.match(gpu_arch):  # before any probe reads it as a target
        raise UsageError(f"--gpu-arch {gpu_arch[:40]!r} is not a GPU arch", "give one of the form sm_90, sm_120 "
                         "or sm_90a (images/<stack>/stack.toml lists each stack's gpu_archs)")
    refuse_edited_lock(stack)
    if accept_baseline:
        discovered_only = True
        if layer is not None and "contract" not in (split_csv(layer) or []):
            raise UsageError("--accept-baseline writes what the contract layer's discovery finds",
                             "add contract to --layer, or leave --layer out")
        accept(stack)
    r = suite.run(stack, layers=split_csv(layer), gpu_arch=gpu_arch, with_stacks=split_csv(with_stack) or [],
                  fresh=fresh, runtime_only=split_csv(runtime_probes), discovered_only=discovered_only)
    if suggest and json_:
        src, found = run_suggest(stack, gpu_arch or "sm_120", json_=True)
        if output:
            write_report(r, output)
        print(json.dumps({"report": r.model_dump(mode="json"), **found.model_dump(mode="json")}, indent=2))
        return max(r.exit_code, src)
    rc = _report(r, f"stack {r.stack}" if r.failed or r.undecided else None, json_=json_, output=output)
    if suggest:
        rc = max(rc, run_suggest(stack, gpu_arch or "sm_120")[0])
    return rc


def accept(stack_name: str) -> None:
    """Write the stack's probe baseline from discovery on its lock (rlstack.probes.discover.baseline)."""
    from rlstack.probes import discover, suite
    from rlstack.probes.wheels import WheelCache
    from rlstack.stacks import load_stack

    st = load_stack(stack_name)
    written = discover.accept(st, locked=suite.locked_packages(st), cache=WheelCache())
    print(f"wrote {written}: every suppressed finding on this lock accepted (review it with git diff)", file=sys.stderr)


def refuse_edited_lock(stack_name: str) -> None:
    """Raise EditedLockError when the stack's lock is not as `invoke lock` wrote it: every layer reads its pins
    and hashes (the runtime layer compares what is installed against it), so no layer runs on an edited one."""
    from rlstack.probes import resolve
    from rlstack.stacks import load_stack, locks

    failed = resolve.edited_lock(load_stack(stack_name))
    if failed is not None:
        raise locks.EditedLockError(failed.evidence[0].text, failed.fix)


def _report(r: Any, question: str | None, *, json_: bool, output: Path | None) -> int:
    """The report as a table with the verdict on `question` (or as JSON on stdout), also written to `output`;
    exit 1 when a probe failed."""
    from rlstack.probes import report as rep

    if output:
        write_report(r, output)
    if json_:
        write_report(r, None)
    else:
        print(rep.table(r))
        if question:
            print()
            print(rep.verdict(r, question))
    return int(r.exit_code)


def diagnose(
    log: Annotated[str, typer.Argument(help="the log file to read, or - for standard input")],
    json_: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> int:
    """Name the known walls in any log (signatures.yaml): the wall, why, and the fix. Exits 1 when one
    matches."""
    from rlstack.probes import signatures

    hint = "give a text log file, or - to read standard input"
    if log == "-":
        stream = getattr(sys.stdin, "buffer", None)
        text = stream.read().decode("utf-8", errors="replace") if stream is not None else sys.stdin.read()
        if looks_binary(text):
            raise RlstackError("standard input is binary, not a log", hint)
    else:
        text = read_user_text(Path(log), "log file", hint=hint, strict=False)
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


IN_STACK: list[Callable[..., Any]] = [probe, diagnose]
