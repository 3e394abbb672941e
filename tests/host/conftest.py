"""What the bench tests share: loading a bench script (bench/ is not a package) as a module, and running one as
a command."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="session")
def load_bench() -> Callable[[str], ModuleType]:
    """load_bench("rollout_peers") -> bench/rollout_peers.py as module bench_rollout_peers, with bench/ on the
    path for its own `import common` (registered in sys.modules, as dataclasses and pickling need)."""
    def load(name: str) -> ModuleType:
        if str(BENCH) not in sys.path:
            sys.path.insert(0, str(BENCH))
        spec = importlib.util.spec_from_file_location(f"bench_{name.replace('/', '_')}", BENCH / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(f"bench_{name.replace('/', '_')}", module)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def run_bench() -> Callable[..., subprocess.CompletedProcess]:
    """run_bench("rollout_peers", "merge", DIR, env={...}) -> python bench/rollout_peers.py merge DIR, its output
    captured (what a user types, in a process of its own)."""
    def run(name: str, *args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], env=env, capture_output=True,
                              text=True, timeout=timeout)

    return run
