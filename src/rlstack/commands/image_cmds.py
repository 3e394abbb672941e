"""`rlstack image build | train | eval | shell | adapters | inspect`: the host side of the stacks. Each
builds (when needed) the stack's image and runs the payload CLI (`rlstack train/eval/adapters`) inside it,
with the shared volumes. `invoke build/train/eval/shell/adapters` call these."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from rlstack.core.errors import DockerError
from rlstack.core.tables import text_table
from rlstack.host import containers, engine, images, runner, stacks


def _build_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", default="cpu", help="stack name (images/<stack>/stack.toml), default: cpu")
    p.add_argument("--base-image", help="override stack.toml base_image (default: $RLSTACK_BASE_IMAGE or the file's)")
    p.add_argument("--ca-cert", help="CA bundle passed to the build as a BuildKit secret (default: $RLSTACK_CA_CERT, "
                   "$SSL_CERT_FILE)")


def register(sub: Any) -> None:
    image = sub.add_parser("image", help="build stack images and run the payload in them (host side)")
    isub = image.add_subparsers(dest="image_command", metavar="ACTION", required=True)

    p = isub.add_parser("build", help="build rlstack/<stack>:<hash12> (skipped when that tag exists)")
    _build_flags(p)
    p.add_argument("--no-cache", action="store_true", help="rebuild every layer")
    p.add_argument("--force", action="store_true", help="build even when the content tag exists")
    p.add_argument("--buildx", action="store_true", help="build with `docker buildx build --load` (CI)")
    p.add_argument("--cache", choices=["gha"], help="remote BuildKit cache: gha = GitHub Actions (needs --buildx)")
    p.set_defaults(func=cmd_build)

    p = isub.add_parser("smoke", help="run the image: --version, then the build-time checks again inside it")
    _build_flags(p)
    p.set_defaults(func=cmd_smoke)

    p = isub.add_parser("size", help="the image's size; fails over the stack's max_image_gb")
    _build_flags(p)
    p.set_defaults(func=cmd_size)

    p = isub.add_parser("push", help="push the content tag to a registry as <registry>/rlstack-<stack>")
    _build_flags(p)
    p.add_argument("--registry", required=True, help="e.g. ghcr.io/OWNER")
    p.set_defaults(func=cmd_push)

    p = isub.add_parser("train", help="rlstack train in the stack's container (adapters volume read-write)")
    _build_flags(p)
    p.add_argument("--recipe", help="recipe file or name")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("args", nargs=argparse.REMAINDER, help="more `rlstack train` flags (after --)")
    p.set_defaults(func=cmd_train)

    p = isub.add_parser("eval", help="rlstack eval in the stack's container (adapters volume read-only)")
    _build_flags(p)
    p.add_argument("--adapter", help="adapter name in the volume")
    p.add_argument("args", nargs=argparse.REMAINDER, help="more `rlstack eval` flags (after --)")
    p.set_defaults(func=cmd_eval)

    p = isub.add_parser("shell", help="an interactive bash in the stack's container, volumes mounted")
    _build_flags(p)
    p.set_defaults(func=cmd_shell)

    p = isub.add_parser("adapters", help="list the adapters in the volume (read through a container)")
    _build_flags(p)
    p.add_argument("--verify", action="store_true", help="also check every file's sha256")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_adapters)

    p = isub.add_parser("inspect", help="tag, labels and size of the stack's current image")
    _build_flags(p)
    p.set_defaults(func=cmd_inspect)


def _plan(args: argparse.Namespace, **kw: Any) -> images.BuildPlan:
    return images.plan(stacks.load_stack(args.stack), base_image=args.base_image, ca_cert=args.ca_cert, **kw)


def _existing(args: argparse.Namespace) -> images.BuildPlan:
    p = _plan(args)
    engine.engine_info()
    if not engine.image_exists(p.tag):
        raise DockerError(f"{p.tag} is not built (the source or lock changed since)",
                          f"build it: invoke build --stack {args.stack}")
    return p


def _ensure(args: argparse.Namespace, *, force: bool = False, **kw: Any) -> tuple[stacks.Stack, str]:
    plan = _plan(args, **kw)
    return plan.stack, images.ensure_built(plan, force=force)


def _rest(args: argparse.Namespace) -> list[str]:
    rest = list(getattr(args, "args", []) or [])
    return rest[1:] if rest[:1] == ["--"] else rest


def cmd_build(args: argparse.Namespace) -> int:
    _, tag = _ensure(args, no_cache=args.no_cache, force=args.force, buildx=args.buildx, cache=args.cache)
    print(tag)
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    images.smoke(_existing(args))
    return 0


def cmd_size(args: argparse.Namespace) -> int:
    images.check_size(_existing(args))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    print(images.push(_existing(args), args.registry))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    stack, tag = _ensure(args)
    argv = containers.train_argv(args.recipe, args.overrides, _rest(args))
    return containers.run(containers.spec_for(stack, tag, argv))


def cmd_eval(args: argparse.Namespace) -> int:
    stack, tag = _ensure(args)
    argv = containers.eval_argv(args.adapter, _rest(args))
    return containers.run(containers.spec_for(stack, tag, argv, adapters_read_only=True))


def cmd_shell(args: argparse.Namespace) -> int:
    stack, tag = _ensure(args)
    return containers.run(containers.spec_for(stack, tag, [], interactive=sys.stdin.isatty(), entrypoint="bash"))


def adapter_rows(manifests: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for m in manifests:
        metrics = m.get("metrics") or {}
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(metrics.items())[:4])
        rows.append([m.get("name", "?"), m.get("base_model", "?"), m.get("stack", "?"),
                     str(m.get("created", "?"))[:19], shown or "-"])
    return rows


def cmd_adapters(args: argparse.Namespace) -> int:
    stack, tag = _ensure(args)
    argv = ["adapters", "--json", *(["--verify"] if args.verify else [])]
    spec = containers.spec_for(stack, tag, argv, adapters_read_only=True)
    spec = replace(spec, gpus=False)  # reading manifests needs no GPU
    engine.engine_info()
    proc = runner.run(containers.run_command(spec, engine.client()), capture=True, check=False)
    if proc.returncode != 0:
        raise DockerError(f"listing the adapters volume failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    manifests = json.loads(proc.stdout or "[]")
    if args.json:
        print(json.dumps(manifests, indent=2))
    elif not manifests:
        print(f"no adapters in the volume {containers.ADAPTERS_VOLUME}")
    else:
        print(text_table(["name", "base model", "stack", "created", "metrics"], adapter_rows(manifests)))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    plan = _existing(args)
    labels = images.labels_of(plan.tag)
    print(json.dumps({"tag": plan.tag, "size_bytes": images.size_bytes(plan.tag), "labels": labels}, indent=2))
    return 0
