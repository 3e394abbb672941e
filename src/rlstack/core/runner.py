"""The one place external commands run. Every command is printed before it runs (so a user can copy and
re-run it by hand), and a missing executable becomes an RlstackError that says what to install."""

from __future__ import annotations

import collections
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

from rlstack.core.errors import RlstackError

_INSTALL_HINTS = {
    "uv": "install it with 'python3 -m pip install uv' (the dev extras of rlstack pin it)",
    "docker": "install Docker (Debian: apt-get install docker.io) and start the engine",
    "/usr/bin/docker": "install Docker (Debian: apt-get install docker.io) and start the engine",
}


def echo(cmd: Sequence[str]) -> None:
    print(f"$ {shlex.join(cmd)}", file=sys.stderr, flush=True)


def run(
    cmd: Sequence[str],
    *,
    capture: bool = False,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    quiet: bool = False,
    timeout: float | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `cmd`, printing it first. With capture=True stdout/stderr are returned, not streamed."""
    if not quiet:
        echo(cmd)
    exe = cmd[0]
    if shutil.which(exe) is None and not os.path.exists(exe):
        raise RlstackError(f"'{exe}' is not installed or not on PATH", _INSTALL_HINTS.get(exe))
    full_env = None if env is None else {**os.environ, **env}
    proc = subprocess.run(
        list(cmd),
        text=True,
        capture_output=capture,
        env=full_env,
        input=input_text,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or "").strip()[-4000:] if capture else ""
        raise RlstackError(
            f"command failed with exit code {proc.returncode}: {shlex.join(cmd)}" + (f"\n{detail}" if detail else "")
        )
    return proc


def run_tee(cmd: Sequence[str], *, keep: int = 400, env: Mapping[str, str] | None = None) -> tuple[int, list[str]]:
    """Run `cmd` with its output (stdout and stderr, merged) streamed to our stdout as it comes, and its last
    `keep` lines returned with the exit code: for long runs whose failure is read afterwards (compose up)."""
    echo(cmd)
    exe = cmd[0]
    if shutil.which(exe) is None and not os.path.exists(exe):
        raise RlstackError(f"'{exe}' is not installed or not on PATH", _INSTALL_HINTS.get(exe))
    tail: collections.deque[str] = collections.deque(maxlen=keep)
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                          env=None if env is None else {**os.environ, **env}) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line.rstrip("\n"))
        rc = proc.wait()
    return rc, list(tail)
