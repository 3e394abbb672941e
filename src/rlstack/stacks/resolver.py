"""Hash-locked resolution with uv, for each stack's own platform (linux x86_64, its Python). What a lock is, how it
is parsed and when it is stale are rlstack.stacks.locks'; this module runs uv and writes the files. It sits with
the stack model, not on the host side, because the static probes resolve too (`resolve`, `--suggest`): uv is a
process on this machine, not Docker (docs/decisions/0001-layers.md).

Relocking changes only what must change: the committed lock's pins (name==version, without its hashes) are
handed to uv as its preferred pins, so a pin that still satisfies the new inputs stays, and only what the
change forces moves. The hashes are left out because uv keeps a preferred pin's hashes as it finds them: a
sha256 edited by hand would survive a relock and be sealed into the new digest. Without them every sha256
comes from the index.

Every lock written here carries the digest of its resolved set (rlstack.stacks.locks.digest_line), and
`offline_reference` re-resolves a lock's inputs from uv's cache alone, which is how `invoke lock --check`
and the resolve probe name the line of a hand edit.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlstack.core import runner
from rlstack.core.errors import LockError, RlstackError
from rlstack.core.fileio import write_atomic
from rlstack.stacks import locks
from rlstack.stacks.model import Stack


@dataclass(frozen=True)
class Resolution:
    ok: bool
    text: str  # the lock text when ok, else the resolver's explanation
    command: list[str]


def _uv() -> str:
    exe = shutil.which("uv")
    if exe is None:
        raise RlstackError("uv is not installed", "python3 -m pip install uv==0.13.9 (or: pip install -e '.[dev]')")
    return exe


def uv_env() -> dict[str, str]:
    """uv verifies TLS against SSL_CERT_FILE: hand it the machine's CA bundle (rlstack.stacks.settings)."""
    from rlstack.stacks import settings

    ca = settings.ca_cert()
    return {"SSL_CERT_FILE": str(ca)} if ca else {}


def resolve(requirements: list[str], python: str, platform: str | None, *, hashes: bool = True,
            preferences: str | None = None, offline: bool = False) -> Resolution:
    """Resolve `requirements` for (python, platform) without installing anything.

    platform None resolves for every platform (uv --universal; `python` is then the lowest Python). With
    `preferences` (the text of an existing lock) uv starts from those pins: it reads its --output-file as
    preferred versions before writing it, and keeps each one while it still satisfies the requirements (with
    the hashes the file gives it, if any: hand it locks.pins_only to have the index's). Without them it picks
    the newest versions that fit. `offline` answers from uv's cache alone."""
    with tempfile.TemporaryDirectory(prefix="rlstack-lock-") as tmp:
        req = Path(tmp) / "requirements.in"
        req.write_text("\n".join(requirements) + "\n")
        out = Path(tmp) / "requirements.lock"
        if preferences is not None:
            out.write_text(preferences)
        target = ["--universal"] if platform is None else ["--python-platform", platform]
        cmd = [
            _uv(), "pip", "compile", req.name, "--output-file", out.name, "--python-version", python, *target,
            "--no-header", "--quiet", "--no-annotate" if not hashes else "--annotate",
        ]
        if hashes:
            cmd.append("--generate-hashes")
        if offline:
            cmd.append("--offline")
        proc = runner.run(cmd, capture=True, check=False, env=uv_env(), cwd=tmp)
        if proc.returncode != 0:
            return Resolution(False, explain_failure(proc.stderr), cmd)
        return Resolution(True, out.read_text(), cmd)


def offline_reference(requirements: list[str], python: str, platform: str | None, text: str) -> str | None:
    """The lock uv writes for these inputs from its cache alone (--offline), starting from `text`'s pins
    without their hashes; None when uv is missing or its cache cannot answer (the caller then says the lock
    was edited without naming the line). Offline, because a check must not depend on the network, and
    because a version the cache lacks then shows up as a difference rather than being fetched."""
    if shutil.which("uv") is None:
        return None
    res = resolve(requirements, python, platform, preferences=locks.pins_only(text), offline=True)
    return res.text if res.ok else None


def explain_failure(stderr: str) -> str:
    """Keep the resolver's own explanation; drop uv's progress noise."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("Resolved", "Using"))]
    return "\n".join(lines).strip() or "the resolver failed without an explanation"


def _preferences(path: Path, upgrade: bool) -> str | None:
    """The committed lock's pins without hashes (see the module's docstring), or None to resolve afresh. A file
    that is no text (binary garbage) has no pins to keep."""
    if upgrade or not path.is_file():
        return None
    try:
        return locks.pins_only(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        return None


def write_lock(stack: Stack, *, upgrade: bool = False) -> Path:
    """Resolve the stack and write its lock. The committed lock is the resolver's preference, so only the pins
    an input change forces move; `upgrade=True` resolves from scratch (newest versions that fit).

    The build backend's lock (images/build-backend.lock) is refreshed on the way when it is stale: `check`
    checks it with every stack, so `invoke lock` must be able to fix it."""
    if not locks.build_backend_is_fresh(stack.folder.parent.parent):
        write_build_backend_lock(stack.folder.parent.parent)
    current = _preferences(stack.lock_file, upgrade)
    res = resolve(locks.resolver_input(stack), stack.python, stack.platform, preferences=current)
    if not res.ok:
        raise LockError(
            f"stack '{stack.name}' does not resolve for Python {stack.python} on {stack.platform}:\n{res.text}",
            f"change the conflicting pins in {stack.requirements_in} or {stack.stack_file}",
        )
    header = (
        f"# rlstack-lock: stack={stack.name} inputs={locks.inputs_hash(stack)} python={stack.python} "
        f"platform={stack.platform}\n"
        f"# Generated by 'invoke lock --stack {stack.name}' from stack.toml + requirements.in. Do not edit.\n"
        + locks.digest_line(res.text)
    )
    write_atomic(stack.lock_file, header + res.text)
    locks.check_lock_consistency(stack)
    return stack.lock_file


def write_build_backend_lock(root: Path | None = None, *, upgrade: bool = False) -> Path:
    """Resolve pyproject's build requirements (universal, hashed) into images/build-backend.lock, keeping the
    committed pins that still fit, as write_lock does."""
    path = locks.build_backend_lock_file(root)
    python = locks.build_backend_python(root)
    current = _preferences(path, upgrade)
    res = resolve(locks.build_requirements(root), python, None, preferences=current)
    if not res.ok:
        raise LockError(f"pyproject.toml's [build-system] requires do not resolve for Python >= {python}:\n{res.text}",
                        "change the build backend pin in pyproject.toml")
    header = (
        f"# rlstack-lock: lock=build-backend inputs={locks.build_backend_inputs_hash(root)} python={python} "
        "platform=universal\n"
        "# Generated by 'invoke lock' from pyproject.toml's [build-system] requires. Do not edit.\n"
        "# images/Dockerfile installs it with --require-hashes to build rlstack's wheel (no build isolation).\n"
        + locks.digest_line(res.text)
    )
    write_atomic(path, header + res.text)
    locks.check_build_backend(root)
    print(f"rlstack: wrote {path}", file=sys.stderr, flush=True)
    return path


