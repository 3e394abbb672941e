"""`rlstack probe`, `rlstack probe-fp8`, `rlstack diagnose` and `rlstack matrix`: probes, failure
signatures and the compat matrix (host side for the static layers; any machine for the runtime layer)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlstack.core.errors import RlstackError

FP8_QUESTION = "FP8 GRPO (Unsloth load_in_fp8 + vLLM rollouts, fp8 stack) on {arch}"


def _layers(spec: str | None) -> list[str] | None:
    return [x.strip() for x in spec.split(",") if x.strip()] if spec else None


def _write_json(report: object, path: Path | None) -> None:
    text = report.model_dump_json(indent=2)  # type: ignore[attr-defined]
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text)


def cmd_probe(args: argparse.Namespace) -> int:
    from rlstack.probes import report as rep
    from rlstack.probes import suite

    r = suite.run(args.stack, layers=_layers(args.layer), gpu_arch=args.gpu_arch,
                  with_stacks=[s for s in (args.with_stack or "").split(",") if s], fresh=args.fresh,
                  runtime_only=_layers(args.runtime_probes))
    if args.json:
        _write_json(r, args.output)
    else:
        print(rep.table(r))
        if r.failed:
            print()
            print(rep.verdict(r, f"stack {r.stack}"))
        if args.output:
            _write_json(r, args.output)
    rc = 1 if r.failed else 0
    if args.suggest:
        rc = max(rc, _suggest(args.stack, args.gpu_arch or "sm_120", args.max_candidates))
    return rc


def _suggest(stack: str, arch: str, bound: int) -> int:
    from rlstack.probes import suggest

    best, tried = suggest.search(stack, gpu_arch=arch, max_candidates=bound)
    print()
    print(suggest.render(stack, arch, best, tried, bound))
    return 0 if best else 1


def cmd_probe_fp8(args: argparse.Namespace) -> int:
    from rlstack.probes import report as rep
    from rlstack.probes import suite

    r = suite.run("fp8", layers=_layers(args.layer), gpu_arch=args.gpu_arch, with_stacks=["portable"],
                  fresh=args.fresh)
    if args.output:
        _write_json(r, args.output)
    if args.json:
        _write_json(r, None)
    else:
        print(rep.table(r))
        print()
        print(rep.verdict(r, FP8_QUESTION.format(arch=args.gpu_arch)))
    rc = 1 if r.failed else 0
    if args.suggest:
        _suggest("fp8", args.gpu_arch, args.max_candidates)
    return rc


def cmd_diagnose(args: argparse.Namespace) -> int:
    from rlstack.probes import signatures

    try:
        text = sys.stdin.read() if str(args.log) == "-" else args.log.read_text(errors="replace")
    except FileNotFoundError:
        raise RlstackError(f"{args.log}: no such log file") from None
    hits = signatures.diagnose(text)
    if args.json:
        print(json.dumps([{"wall": h.signature.id, "line": h.line, "excerpt": h.excerpt, "title": h.signature.title,
                           "explanation": h.signature.explanation, "fix": h.signature.fix} for h in hits], indent=2))
        return 1 if hits else 0
    if not hits:
        print(f"no known failure signature in {args.log} ({len(text.splitlines())} lines)")
        return 0
    for h in hits:
        print(f"[{h.signature.id}] line {h.line}: {h.signature.title}")
        print(f"  log: {h.excerpt}")
        print(f"  why: {h.signature.explanation}")
        print(f"  fix: {h.signature.fix}")
    return 1


def cmd_matrix(args: argparse.Namespace) -> int:
    from rlstack import matrix

    path = args.file or matrix.matrix_path()
    m = matrix.merge(args.results, path) if args.results else matrix.load(path)
    if args.results:
        print(f"merged {len(args.results)} result file(s) into {path} ({len(m.rows)} rows)")
    if args.check:
        print(f"{path}: {len(m.rows)} rows, schema ok")
        return 0
    for p in matrix.render(m, readme=not args.no_readme):
        print(f"wrote {p}")
    return 0


def _skips(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        for item in spec.split(","):
            name, _, why = item.partition(":")
            if name.strip():
                out[name.strip()] = why.strip() or "left out with --skip"
    return out


def cmd_native_stage(args: argparse.Namespace) -> int:
    from rlstack.host import native

    out = args.out or Path(".stage") / args.stack
    index = native.stage(args.stack, args.host_packages, out, python=args.python, platform=args.platform,
                         skip=_skips(args.skip or []), keep_host={k for s in args.keep_host or [] for k in s.split(",")
                                                                  if k}, part_mb=args.part_mb)
    mib = index["tar_size"] / 2**20
    print(f"staged {index['carry']} wheels of stack {index['stack']} for Python {index['python']} in {out}: "
          f"{len(index['parts'])} part(s), {mib:.0f} MiB; {index['host']} locked packages come from the host, "
          f"{len(index['skip'])} left out")
    for name, why in index["skip"].items():
        print(f"  left out {name}: {why}")
    print(f"on the GPU host, with every part and {native.PARTS_FILE} in one folder DIR:\n"
          f"  python3 -m rlstack.host.native install --parts DIR --target /tmp/site-{index['stack']}\n"
          f"  PYTHONPATH=/tmp/site-{index['stack']}:src python3 -m rlstack.cli probe --stack {index['stack']} "
          f"--layer runtime --json -o probe.json")
    return 0


def _report_options(p: argparse.ArgumentParser) -> None:
    """Options `probe` and `probe-fp8` share: how the report is written and the --suggest search."""
    p.add_argument("--json", action="store_true", help="print the report as JSON (or write it with -o)")
    p.add_argument("-o", "--output", type=Path, help="also write the JSON report to this file")
    p.add_argument("--fresh", action="store_true", help="ignore cached resolutions")
    p.add_argument("--suggest", action="store_true", help="search nearby versions for a passing combination")
    p.add_argument("--max-candidates", type=int, default=12, help="bound of the --suggest search")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="run a stack's probes (resolve, contract, toolchain, runtime)")
    p.add_argument("--stack", required=True, help="stack name")
    p.add_argument("--gpu-arch", help="target GPU arch, e.g. sm_120 (default: each of the stack's gpu_archs)")
    p.add_argument("--layer", help="comma-separated layers (default: all): resolve,contract,toolchain,runtime")
    p.add_argument("--with", dest="with_stack", help="also check co-installing with these stacks (comma-separated)")
    p.add_argument("--runtime-probes", help="only these runtime probes (comma-separated; default: all): "
                   "cuda-init,bnb-4bit,fp8-matmul,vllm-lora,grpo-step")
    _report_options(p)
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("probe-fp8", help="the report's FP8 RL question: all layers for the fp8 stack, a verdict")
    p.add_argument("--gpu-arch", default="sm_120", help="target GPU arch (default sm_120, the report's RTX 5090)")
    p.add_argument("--layer", help="comma-separated layers (default: all)")
    _report_options(p)
    p.set_defaults(func=cmd_probe_fp8)

    p = sub.add_parser("native-stage", help="stage a stack's locked wheels for a GPU host without Docker or network")
    p.add_argument("--stack", required=True, help="stack name")
    p.add_argument("--host-packages", type=Path, required=True,
                   help="the host's 'python3 -m pip list --format=json' output (what it already has)")
    p.add_argument("--python", required=True, help="the host's Python, e.g. 3.12 (wheels are chosen for it)")
    p.add_argument("--platform", default="x86_64-manylinux_2_28", help="the host's platform tag")
    p.add_argument("--skip", action="append", help="NAME[:why], comma-separated or repeated: locked packages the "
                   "probes do not need there (recorded as missing)")
    p.add_argument("--keep-host", action="append", help="packages whose host copy stays at its own version")
    p.add_argument("--out", type=Path, help="output folder (default .stage/STACK)")
    p.add_argument("--part-mb", type=int, default=55, help="largest part, in MiB (default 55)")
    p.set_defaults(func=cmd_native_stage)

    p = sub.add_parser("diagnose", help="name the known walls in a log (signatures.yaml)")
    p.add_argument("log", type=Path, help="log file, or - for stdin")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("matrix", help="merge probe JSON into compat_matrix.yaml and render README + HTML")
    p.add_argument("results", nargs="*", type=Path, help="probe report JSON files (rlstack probe --json -o)")
    p.add_argument("--file", type=Path, help="matrix file (default: compat_matrix.yaml in the project)")
    p.add_argument("--check", action="store_true", help="only validate the file")
    p.add_argument("--no-readme", action="store_true", help="do not rewrite the README section")
    p.set_defaults(func=cmd_matrix)
