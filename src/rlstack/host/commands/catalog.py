"""The stacks, their locks and this machine's settings: `invoke stacks`, `invoke settings`, `invoke lock`."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from rlstack.core.errors import LockError, StaleLockError
from rlstack.core.tables import text_table
from rlstack.host.commands.aliases import StackList
from rlstack.payload import commands as payload


def stacks(stack: StackList = None, json_: payload.AsJson = False) -> int:
    """List the stacks and their key versions (from stack.toml and the locks), and this machine's settings."""
    from rlstack import stacks as stack_files
    from rlstack.host import docs
    from rlstack.stacks import settings

    chosen = [stack_files.load_stack(n) for n in stack_files.resolve_names(stack)]
    if json_:
        print(json.dumps([dict(zip(docs.HEADERS, docs.stack_row(s), strict=True)) for s in chosen], indent=2))
        return 0
    print(text_table(docs.HEADERS, [docs.stack_row(s) for s in chosen]))
    print()
    print(settings_table(settings))
    return 0


def settings_table(settings: Any) -> str:
    rows = []
    for name, (_, what) in settings.FIELDS.items():
        s = settings.lookup(name)
        value = s.value or {"base_image": "each stack's base_image", "docker": settings.docker_client(),
                            "ca_cert": "none"}[name]
        rows.append([name, value, s.source, what])
    return text_table(["setting", "value", "from", "what"], rows)


def settings(
    base_image: Annotated[str | None, typer.Option(help="image every stack builds on, e.g. the local "
                                                        "rlstack-test/bookworm-minbase made by .ci/docker-setup.sh")]
    = None,
    ca_cert: Annotated[str | None, typer.Option(help="CA bundle (PEM) of a TLS-intercepting proxy")] = None,
    docker: Annotated[str | None, typer.Option(help="docker client to call, e.g. /usr/bin/docker")] = None,
    unset: Annotated[list[str] | None, typer.Option(help="forget a setting: base_image, ca_cert or docker "
                                                         "(repeatable)")] = None,
) -> int:
    """Show this machine's settings, or set them once (kept in invoke.yaml, not committed): the base image,
    the CA bundle and the docker client every later command uses unless its own flag says otherwise."""
    from rlstack.stacks import settings as machine

    updates: dict[str, str | None] = {k: v for k, v in (("base_image", base_image), ("ca_cert", ca_cert),
                                                        ("docker", docker)) if v}
    for name in unset or []:
        updates[name.replace("-", "_")] = None
    if updates:
        path = machine.store(updates)
        print(f"wrote {path}", file=sys.stderr)
    print(settings_table(machine))
    return 0


def lock(
    stack: StackList = None,
    check: Annotated[bool, typer.Option(help="write nothing: fail when a lock is stale against "
                                             "stack.toml/requirements.in, or its pins and hashes were edited "
                                             "(named by re-resolving offline from uv's cache)")] = False,
) -> int:
    """Resolve each stack with uv for its platform into images/<stack>/requirements.lock, with hashes."""
    from rlstack import stacks as stack_files
    from rlstack.stacks import locks, resolver

    names = stack_files.resolve_names(stack)
    if check:
        bad: dict[str, LockError] = {}
        for name in names:
            try:
                locks.check(stack_files.load_stack(name), reference=resolver.offline_reference)
                print(f"lock ok: {name}")
            except LockError as exc:
                word = "STALE" if isinstance(exc, StaleLockError) else \
                    "EDITED" if isinstance(exc, locks.EditedLockError) else "WRONG"
                print(f"lock {word}: {exc}", file=sys.stderr)
                bad[name] = exc
        if bad:
            print(f"{len(bad)} lock(s) to rewrite: {', '.join(bad)}", file=sys.stderr)
            return max(exc.exit_code for exc in bad.values())
        return 0
    for name in names:
        print(f"wrote {resolver.write_lock(stack_files.load_stack(name))}")
    return 0
