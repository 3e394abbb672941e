"""The mutation bench's machinery (bench/probe_mutation.py) on small handmade packages: each kind of target is
deleted or renamed in a scratch copy of B's source, and the rerun kills or explains it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from rlstack.probes import discover
from rlstack.probes.discover import baseline
from rlstack.probes.discover.model import ApiModel
from rlstack.probes.wheels import SourceSet
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import load_stack

HOST = {
    "hostlib/__init__.py": "",
    "hostlib/lora.py": "class LoRARequest:\n    pass\n\nOPTIONAL = 1\nNEWER = 2\n",
    "hostlib/engine.py": "class Base:\n    def step(self):\n        return 0\n\nclass Engine(Base):\n"
                         "    def step(self):\n        return 1\n",
    "hostlib/compat.py": "OLDER = 1\n",
    "hostlib/only_orphan.py": "X = 1\n",
    "hostlib/api.py": "from hostlib._impl import *\n\ndef run(x, *, mode='a'):\n    return x\n\n"
                      "def loose(x, *, mode='a', **kwargs):\n    return x\n",
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
try:
    from hostlib.lora import NEWER
except ImportError:
    from hostlib.compat import OLDER as NEWER

hostlib.api.run(1, mode="b")
hostlib.api.loose(1, mode="b")
import hostlib.engine


def fast_step(self):
    return 2


hostlib.engine.Engine.step = fast_step
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


Handmade = Callable[..., tuple[SourceSet, dict[str, LockedPackage]]]  # the handmade fixture (conftest.py)


def test_each_live_reference_is_mutated_and_killed_or_explained(tmp_path: Path, mutation: ModuleType,
                                                                handmade: Handmade) -> None:
    stack = load_stack("cpu")
    patcher = {"patcher/__init__.py": PATCHER, "patcher/orphan.py": "from hostlib.only_orphan import X\n"}
    src, locked = handmade(tmp_path, {"hostlib": HOST, "patcher": patcher}, {"hostlib": "2.0"})
    base = ApiModel(stack, src, locked)
    found = discover.find(stack, src, locked, ["patcher"], model=base)
    assert not [f for f in found.findings if f.rule is None]
    real: set[tuple[str, str, str, str]] = set()
    population, excluded = mutation.population_of(found)
    # patcher/orphan.py is imported by nothing of patcher: its reference is left out, with the reason
    assert {t.label(): why for t, why in excluded.items()} == {"hostlib.only_orphan.X": "unreferenced-module"}
    # the baseline accepted on the unmutated sources: every key they suppress
    verdict = mutation.Verdict(baseline.of(stack, baseline.excused(found), "test"))
    got = {}
    for t in population:
        mut = mutation.Mutator(base).mutate(t)
        if mut.why_not:
            got[t.label()] = (False, mut.why_not, None)
            continue
        got[t.label()] = mutation.run_mutant(stack, base, locked, ["patcher"], found, real, t, population[t], mut,
                                             verdict)
    assert got["hostlib.lora.LoRARequest"][::2] == (True, "finding")  # the stub fallback takes over: killed
    assert got["hostlib.api.helper"][::2] == (True, "finding")  # bound through a star import: renamed where defined
    assert got["hostlib.sub"][::2] == (True, "finding")  # the module left out: killed
    assert got["hostlib.api.run(mode=)"][::2] == (True, "finding")  # the parameter renamed: killed
    # a replaced method a base class defines too: the replacement installs over the inherited one, equivalent
    assert got["hostlib.engine.Engine.step"][1].startswith("equivalent: the class still has the member")
    # the callee also takes **kwargs: the renamed keyword still binds, but now only through **kwargs, a key the
    # baseline lacks: killed through it
    assert got["hostlib.api.loose(mode=)"] == (
        True, "new-since-baseline: patcher->hostlib:keyword:hostlib.api.loose(mode) (excused as kwargs-only)",
        "new-since-baseline")
    # a None fallback: the caught import is a key the baseline lacks, killed through it
    assert got["hostlib.lora.OPTIONAL"] == (
        True, "new-since-baseline: patcher->hostlib:import:hostlib.lora.OPTIONAL (excused as caught)",
        "new-since-baseline")
    # with no baseline the same two survive, each explained: what the except-branch binds instead
    no_baseline = mutation.Verdict(None)
    for label in ("hostlib.lora.OPTIONAL", "hostlib.api.loose(mode=)"):
        t = next(t for t in population if t.label() == label)
        again = mutation.run_mutant(stack, base, locked, ["patcher"], found, real, t, population[t],
                                    mutation.Mutator(base).mutate(t), no_baseline)
        assert again[0] is False and again[2] is None, label
        got[label] = again
    assert got["hostlib.lora.OPTIONAL"][1] == ("suppressed: caught (1); the except-branch binds OPTIONAL = None "
                                               "(line 12)")
    assert got["hostlib.api.loose(mode=)"][1] == "suppressed: kwargs-only (1)"
    # the handler imports the name from a module that has it, and the rerun checked that import: equivalent
    assert got["hostlib.lora.NEWER"][1].startswith("equivalent: the except-branch imports the name from elsewhere")
    # the unmutated sources are untouched by the scratch copies
    assert "LoRARequest_mutant" not in (src.read("hostlib", "hostlib/lora.py") or "")
