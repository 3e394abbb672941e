"""Small CI chores that workflows call through invoke, so no logic lives only in YAML."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rlstack import runner
from rlstack.errors import RlstackError

# Large toolchains preinstalled on GitHub's hosted Ubuntu runners that an image build never uses;
# CUDA stack images need ~30 GB of free disk while they build.
HOSTED_RUNNER_BLOAT = ["/usr/share/dotnet", "/usr/local/lib/android", "/opt/ghc", "/opt/hostedtoolcache/CodeQL"]


def free_gb(path: str = "/") -> float:
    return shutil.disk_usage(path).free / 1e9


def free_disk(paths: list[str] | None = None, *, force: bool = False) -> float:
    """Delete the hosted runner's unused toolchains. Refuses outside GitHub Actions unless forced, so a
    developer who runs it by mistake loses nothing."""
    if not force and os.environ.get("GITHUB_ACTIONS") != "true":
        raise RlstackError(
            "ci-free-disk deletes system folders and only runs on GitHub's hosted runners",
            "pass --force if you really mean to run it elsewhere",
        )
    before = free_gb()
    for p in paths or HOSTED_RUNNER_BLOAT:
        if Path(p).exists():
            runner.run(["sudo", "rm", "-rf", p] if os.geteuid() != 0 else ["rm", "-rf", p], check=False)
    after = free_gb()
    print(f"free disk: {before:.1f} GB -> {after:.1f} GB")
    return after
