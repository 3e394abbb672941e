"""Discovery on small handmade packages: each kind (replacement, import under each guard kind, paste,
keyword) passing and failing, and each suppression rule, with no case data at all."""

from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

import pytest

from rlstack.host.locks import LockedPackage
from rlstack.host.stacks import load_stack
from rlstack.probes import discover
from rlstack.probes.wheels import SourceSet

HOST = {
    "hostlib/__init__.py": "",
    "hostlib/api.py": """
        import functools

        def run(x, *, mode="a"):
            return x

        def loose(x, **kwargs):
            return x

        class Engine:
            def __init__(self, size, dtype=None):
                self.size = size

            def step(self, n):
                return self.helper(n)

            def helper(self, n):
                return n

        def deco(f):
            return f

        @deco
        def wrapped(x):
            return x

        def __getattr__(name):
            if name == "Lazy":
                return 1
            raise AttributeError(name)
    """,
    "hostlib/dyn.py": """
        def __getattr__(name):
            return name
    """,
    "hostlib/manager.py": """
        class Manager:
            def add(self, x): ...
            def warmup_rank(self, r): return r
    """,
    "hostlib/runner.py": """
        from hostlib.manager import Manager

        class Runner:
            def __init__(self):
                self.mgr = Manager()

            def start(self):
                self.mgr.add(self.mgr.warmup_rank(8))
    """,
    "hostlib/worker.py": """
        from hostlib.runner import Runner

        class Worker(Runner):
            def go(self):
                return self.mgr.warmup_rank(2)
    """,
}

PATCHER_INIT = """
from typing import TYPE_CHECKING
from packaging.version import Version
import hostlib
from hostlib.api import run, loose, Engine, wrapped
from hostlib.api import gone_plain
from hostlib.api import Lazy
from hostlib.dyn import anything
import patcher.install
try:
    from hostlib.api import gone_caught
except ImportError:
    gone_caught = None
if is_hostlib_available():
    from hostlib.api import gone_available
if is_otherlib_available():
    from hostlib.api import gone_unavailable
if TYPE_CHECKING:
    from hostlib.api import gone_typing
if Version(hostlib.__version__) >= Version("3.0"):
    from hostlib.api import gone_newer
else:
    from hostlib.api import run as run_older
if some_flag():
    from hostlib.api import gone_flag


def calls():
    from hostlib.api import gone_in_function
    run(1, mode="b")
    run(1, colour="x")
    loose(1, anything=2)
    Engine(1, dtype=3)
    Engine(1, device=3)
    wrapped(1, z=2)
"""


def patcher(base_has_warmup: bool) -> dict[str, str]:
    extra = "    def warmup_rank(self, r): return r\n" if base_has_warmup else ""
    return {
        "patcher/__init__.py": PATCHER_INIT,
        "patcher/orphan.py": "from hostlib.api import gone_orphan\n",
        "patcher/base.py": "class Base:\n    def add(self, x): ...\n" + extra,
        "patcher/install.py": """
            import hostlib.runner
            import hostlib.api
            from patcher.base import Base

            class Manager(Base):
                pass

            def my_helper(self):
                return 0

            def good_step(self, n):
                return n

            def patch():
                hostlib.runner.Manager = Manager
                hostlib.api.Engine.helper = my_helper
                hostlib.api.Engine.step = good_step
                hostlib.api.LIMIT = 3
        """,
        "patcher/items.py": """
            import inspect
            from collections import defaultdict
            from patcher.losses import loss, other
            ITEMS = defaultdict(list)
            ITEMS["gen_trainer"].append(inspect.getsource(loss))
            ITEMS["gen_trainer"].append(inspect.getsource(other))
        """,
        "patcher/losses.py": """
            def other(x):
                return x

            def loss(x):
                y = helper_from_module(x)   # bound by the module the key names (hostlib/gen_trainer.py)
                z = other(y)                # pasted beside it
                return missing_helper(z)    # bound nowhere: NameError
        """,
        "patcher/build.py": """
            from patcher.items import ITEMS
            TEMPLATE = '''
            import math
            {pre}
            class Generated:
                pass
            '''

            def build(key):
                pre = "\\n".join(ITEMS[key])
                return TEMPLATE.format(pre=pre)
        """,
    }


def make_wheel(tmp: Path, name: str, files: dict[str, str]) -> Path:
    path = tmp / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, textwrap.dedent(text))
    return path


def run(tmp: Path, *, base_has_warmup: bool = False, host_extra: dict[str, str] | None = None
        ) -> discover.Discovery:
    host = {**HOST, "hostlib/gen_trainer.py": "def helper_from_module(x):\n    return x\n", **(host_extra or {})}
    (tmp / "h").mkdir(exist_ok=True)
    (tmp / "p").mkdir(exist_ok=True)
    src = SourceSet({"hostlib": make_wheel(tmp / "h", "hostlib", host),
                     "patcher": make_wheel(tmp / "p", "patcher", patcher(base_has_warmup))})
    locked = {"hostlib": LockedPackage("hostlib", "2.0", frozenset()),
              "patcher": LockedPackage("patcher", "1.0", frozenset())}
    d = discover.Discovery(load_stack("cpu"), src, locked, ["patcher"])
    d.walk("patcher")
    d.pastes("patcher")
    return d


def by_key(d: discover.Discovery) -> dict[str, discover.Finding]:
    return {f.key: f for f in d.tally.findings}


@pytest.fixture
def found(tmp_path: Path) -> dict[str, discover.Finding]:
    return by_key(run(tmp_path))


def test_imports_checked_on_live_paths_only(found: dict[str, discover.Finding]) -> None:
    assert found["hostlib.api.gone_plain"].rule is None  # module level: a real finding
    assert "cannot import name 'gone_plain'" in found["hostlib.api.gone_plain"].message
    assert found["hostlib.api.gone_available"].rule is None  # is_hostlib_available(): hostlib is locked
    for dead in ("gone_unavailable", "gone_typing", "gone_newer"):  # guards false in this lock: no path
        assert f"hostlib.api.{dead}" not in found
    assert "hostlib.api.Lazy" not in found  # the module's __getattr__ names it
    assert "hostlib.api.run" not in found


@pytest.mark.parametrize(("key", "rule"), [
    ("hostlib.api.gone_caught", "caught"),
    ("hostlib.api.gone_flag", "guard-unknown"),
    ("hostlib.dyn.anything", "dynamic-module"),
    ("hostlib.api.gone_in_function", "in-function-import"),
    ("hostlib.api.gone_orphan", "unreferenced-module"),
    ("hostlib.api.wrapped", "decorated-callee"),
])
def test_each_suppression_rule_is_stated(found: dict[str, discover.Finding], key: str, rule: str) -> None:
    assert found[key].rule == rule
    assert rule in discover.RULES and len(discover.RULES[rule]) > 40


def test_keywords_against_the_callees_signature(found: dict[str, discover.Finding]) -> None:
    bad = found["hostlib.api.run(colour)"]
    assert bad.rule is None and "unexpected keyword argument 'colour'" in bad.message
    assert bad.evidence[-1].file == "hostlib/api.py"  # the callee's def, as evidence
    ctor = found["hostlib.api.Engine(device)"]
    assert ctor.rule is None and "'device'" in ctor.message
    assert not any(k.startswith(("hostlib.api.loose", "hostlib.api.run(mode")) for k in found)


def test_replaced_class_and_method_checked_against_the_hosts_uses(found: dict[str, discover.Finding]) -> None:
    cls = found["hostlib.runner.Manager"]
    assert cls.rule is None and "'Manager' object has no attribute 'warmup_rank'" in cls.message
    where = {(e.file, e.line) for e in cls.evidence}
    assert ("hostlib/runner.py", 9) in where or ("hostlib/worker.py", 5) in where
    meth = found["hostlib.api.Engine.helper"]
    assert meth.rule is None and "takes 1 positional arguments but 2 were given" in meth.message
    assert "hostlib.api.Engine.step" not in found  # good_step(self, n) fits self.step(n)


def test_replaced_class_passes_when_it_provides_the_method(tmp_path: Path) -> None:
    assert "hostlib.runner.Manager" not in by_key(run(tmp_path, base_has_warmup=True))


def test_pasted_source_finds_its_names_in_template_items_and_key_module(found: dict[str, discover.Finding]) -> None:
    paste = found['ITEMS["gen_trainer"]:loss']
    assert paste.rule is None and "missing_helper" in paste.message
    assert "helper_from_module" not in paste.message and "other" not in paste.message
    assert 'ITEMS["gen_trainer"]:other' not in found


def test_paste_passes_when_the_key_module_binds_the_name(tmp_path: Path) -> None:
    extra = {"hostlib/gen_trainer.py": "def helper_from_module(x):\n    return x\n\ndef missing_helper(z):\n"
                                       "    return z\n"}
    assert 'ITEMS["gen_trainer"]:loss' not in by_key(run(tmp_path, host_extra=extra))


def test_counts_and_results(tmp_path: Path) -> None:
    d = run(tmp_path)
    res = discover._as_results(d, {})
    summary = res[-1]
    assert summary.id == "discovered:summary" and summary.status == "pass"
    assert "contracts checked" in summary.reason and "suppressed by a rule" in summary.reason
    assert any(e.text.startswith("rule caught") for e in summary.evidence)
    fails = [r for r in res if r.status == "fail"]
    assert {r.id.split(":")[2] for r in fails} == {"import", "keyword", "replacement", "paste"}
    assert d.tally.checked["import"] > 5 and d.tally.checked["paste"] == 2
    # a wheel that could not be read leaves the summary undecided, never a pass
    assert discover._as_results(d, {"hostlib": "no wheel"})[-1].undecided
