"""The mutation bench's machinery (bench/probe_mutation.py) on small handmade packages: each kind of target is
deleted or renamed in a scratch copy of B's source, and the rerun kills or explains it."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from rlstack.probes import discover
from rlstack.probes.discover.model import ApiModel
from rlstack.probes.wheels import SourceSet
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import load_stack

HOST = {
    "hostlib/__init__.py": "",
    "hostlib/lora.py": "class LoRARequest:\n    pass\n\nOPTIONAL = 1\n",
    "hostlib/api.py": "from hostlib._impl import *\n\ndef run(x, *, mode='a'):\n    return x\n",
    "hostlib/_impl.py": "def helper(x):\n    return x\n",
    "hostlib/sub.py": "",
}

PATCHER = """
import hostlib.api
import hostlib.sub
from hostlib.api import helper
try:
    from hostlib.lora import LoRARequest
except ImportError:
    class LoRARequest: pass
try:
    from hostlib.lora import OPTIONAL
except ImportError:
    OPTIONAL = None

hostlib.api.run(1, mode="b")
"""


@pytest.fixture(scope="module")
def mutation() -> ModuleType:
    """bench/probe_mutation.py as a module (registered in sys.modules, as its dataclasses need)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "probe_mutation.py"
    spec = importlib.util.spec_from_file_location("bench_probe_mutation", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_probe_mutation", module)
    spec.loader.exec_module(module)
    return module


def _wheel(tmp: Path, name: str, files: dict[str, str]) -> Path:
    (tmp / name).mkdir(parents=True, exist_ok=True)
    path = tmp / name / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, textwrap.dedent(text))
    return path


def test_each_live_reference_is_mutated_and_killed_or_explained(tmp_path: Path, mutation: ModuleType) -> None:
    stack = load_stack("cpu")
    src = SourceSet({"hostlib": _wheel(tmp_path, "hostlib", HOST),
                     "patcher": _wheel(tmp_path, "patcher", {"patcher/__init__.py": PATCHER})})
    locked = {"hostlib": LockedPackage("hostlib", "2.0", frozenset()),
              "patcher": LockedPackage("patcher", "1.0", frozenset())}
    base = ApiModel(stack, src, locked)
    found = discover.find(stack, src, locked, ["patcher"], model=base)
    assert not [f for f in found.findings if f.rule is None]
    real: set[tuple[str, str, str, str]] = set()
    population = mutation.targets(found)
    got = {}
    for t in population:
        mut = mutation.Mutator(base).mutate(t)
        assert mut.why_not is None, t
        got[t.label()] = mutation.run_mutant(stack, base, locked, ["patcher"], found, real, t, population[t], mut)
    assert got["hostlib.lora.LoRARequest"][0]  # the stub fallback takes over: killed
    assert got["hostlib.api.helper"][0]  # bound through a star import: renamed where it is defined, killed
    assert got["hostlib.sub"][0]  # the module left out: killed
    assert got["hostlib.api.run(mode=)"][0]  # the parameter renamed: killed
    assert got["hostlib.lora.OPTIONAL"] == (False, "suppressed: caught (1)")  # None fallback: explained
    # the unmutated sources are untouched by the scratch copies
    assert "LoRARequest_mutant" not in (src.read("hostlib", "hostlib/lora.py") or "")
