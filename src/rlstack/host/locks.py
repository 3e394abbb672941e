"""Hash-locked resolution with uv, for each stack's own platform (linux x86_64, its Python).

A lock starts with a header that records a hash of everything resolution depends on (the stack's Python
and platform, the pins stack.toml owns, requirements.in, rlstack's own dependencies). `check` recomputes
that hash: a lock is stale exactly when an input changed, and the message names the stack and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from rlstack.core.errors import LockError, RlstackError, StaleLockError
from rlstack.core.paths import project_root
from rlstack.core.pkgnames import normalize  # re-exported: lock.normalize is used across the package
from rlstack.host import runner
from rlstack.host.stacks import Stack

HEADER_RE = re.compile(r"^# rlstack-lock: (?P<fields>.*)$", re.M)
PIN_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)", re.M)


def project_dependencies(root: Path | None = None) -> list[str]:
    """rlstack's own runtime dependencies: installed into every image, so part of every lock."""
    data = tomllib.loads(((root or project_root()) / "pyproject.toml").read_text())
    return list(data["project"].get("dependencies", []))


def resolver_input(stack: Stack) -> list[str]:
    """Every requirement the resolver sees for this stack, in a stable order."""
    return [*stack.top_level, *stack.derived_pins(), *project_dependencies(stack.folder.parent.parent)]


def inputs_hash(stack: Stack) -> str:
    payload = {
        "python": stack.python,
        "platform": stack.platform,
        "requirements": resolver_input(stack),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def lock_hash(stack: Stack) -> str:
    """Identity of the resolved environment: the hash of the lock file's bytes."""
    if not stack.lock_file.is_file():
        raise LockError(
            f"{stack.lock_file}: no lock for stack '{stack.name}'", f"run: invoke lock --stack {stack.name}"
        )
    return hashlib.sha256(stack.lock_file.read_bytes()).hexdigest()


def read_header(text: str) -> dict[str, str]:
    m = HEADER_RE.search(text)
    if not m:
        return {}
    return dict(part.split("=", 1) for part in m.group("fields").split() if "=" in part)


def locked_versions(stack: Stack) -> dict[str, str]:
    """{normalized package name: version} from the stack's lock."""
    return parse_pins(stack.lock_file.read_text())


def parse_pins(text: str) -> dict[str, str]:
    return {normalize(m["name"]): m["version"] for m in PIN_RE.finditer(text)}


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
    """uv verifies TLS against SSL_CERT_FILE: pass a corporate CA bundle through when pip has one."""
    env: dict[str, str] = {}
    for var in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var):
            env["SSL_CERT_FILE"] = os.environ[var]
            break
    return env


def resolve(requirements: list[str], python: str, platform: str, *, hashes: bool = True) -> Resolution:
    """Resolve `requirements` for (python, platform) without installing anything."""
    with tempfile.TemporaryDirectory(prefix="rlstack-lock-") as tmp:
        req = Path(tmp) / "requirements.in"
        req.write_text("\n".join(requirements) + "\n")
        out = Path(tmp) / "requirements.lock"
        cmd = [
            _uv(), "pip", "compile", req.name, "--output-file", out.name,
            "--python-version", python, "--python-platform", platform,
            "--no-header", "--quiet", "--no-annotate" if not hashes else "--annotate",
        ]
        if hashes:
            cmd.append("--generate-hashes")
        proc = runner.run(cmd, capture=True, check=False, env=uv_env(), cwd=tmp)
        if proc.returncode != 0:
            return Resolution(False, explain_failure(proc.stderr), cmd)
        return Resolution(True, out.read_text(), cmd)


def explain_failure(stderr: str) -> str:
    """Keep the resolver's own explanation; drop uv's progress noise."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("Resolved", "Using"))]
    return "\n".join(lines).strip() or "the resolver failed without an explanation"


def write_lock(stack: Stack) -> Path:
    res = resolve(resolver_input(stack), stack.python, stack.platform)
    if not res.ok:
        raise LockError(
            f"stack '{stack.name}' does not resolve for Python {stack.python} on {stack.platform}:\n{res.text}",
            f"change the conflicting pins in {stack.requirements_in} or {stack.stack_file}",
        )
    header = (
        f"# rlstack-lock: stack={stack.name} inputs={inputs_hash(stack)} python={stack.python} "
        f"platform={stack.platform}\n"
        f"# Generated by 'invoke lock --stack {stack.name}' from stack.toml + requirements.in. Do not edit.\n"
    )
    tmp = stack.lock_file.with_suffix(".lock.tmp")
    tmp.write_text(header + res.text)
    os.replace(tmp, stack.lock_file)
    check_lock_consistency(stack)
    return stack.lock_file


def check_lock_consistency(stack: Stack) -> None:
    """The lock must hold the torch and CUDA build that stack.toml names: a resolver cannot pick another
    torch, but PyPI's torch decides its CUDA runtime, and a hand-edited lock can say anything."""
    versions = locked_versions(stack)
    got = versions.get("torch")
    if got != stack.torch.version:
        raise LockError(f"{stack.lock_file}: torch is {got}, stack.toml says {stack.torch.version}")
    if stack.torch.cuda:
        runtime = versions.get("nvidia-cuda-runtime-cu12") or versions.get("nvidia-cuda-runtime")
        got_cuda = ".".join(runtime.split(".")[:2]) if runtime else None
        if got_cuda != stack.torch.cuda:
            raise LockError(
                f"{stack.lock_file}: torch {got} brings CUDA runtime {got_cuda}, stack.toml says torch.cuda = "
                f"'{stack.torch.cuda}'",
                f"set [torch] cuda = \"{got_cuda}\" in {stack.stack_file}, or pick the torch that is built for it",
            )


def check(stack: Stack) -> None:
    """Raise StaleLockError when the lock is missing or was made from other inputs."""
    fix = f"run: invoke lock --stack {stack.name}   (then commit {stack.lock_file.name})"
    if not stack.lock_file.is_file():
        raise StaleLockError(f"stack '{stack.name}': {stack.lock_file} is missing", fix)
    header = read_header(stack.lock_file.read_text())
    if not header:
        raise StaleLockError(f"stack '{stack.name}': {stack.lock_file} has no rlstack-lock header", fix)
    want = inputs_hash(stack)
    if header.get("inputs") != want:
        raise StaleLockError(
            f"stack '{stack.name}': lock is stale: requirements.in, stack.toml (python/platform/torch/toolkit) "
            f"or rlstack's dependencies changed since {stack.lock_file.name} was made",
            fix,
        )
    check_lock_consistency(stack)
