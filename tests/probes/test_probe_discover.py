"""Discovery on small handmade packages: each kind (replacement, import under each guard kind, paste,
keyword) passing and failing, and each suppression rule, with no case data at all."""

from __future__ import annotations

import ast
import textwrap
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rlstack.probes import discover, pyast
from rlstack.probes.wheels import SourceSet
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import load_stack

# the passes that check statements on live paths (all but pastes, which read A's files whole)
WALKED: tuple[discover.Kind, ...] = ("replacement", "import", "keyword")

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


def run(tmp: Path, *, base_has_warmup: bool = False, host_extra: dict[str, str] | None = None,
        kinds: Sequence[discover.Kind] = discover.KINDS) -> discover.Discovered:
    host = {**HOST, "hostlib/gen_trainer.py": "def helper_from_module(x):\n    return x\n", **(host_extra or {})}
    (tmp / "h").mkdir(exist_ok=True)
    (tmp / "p").mkdir(exist_ok=True)
    src = SourceSet({"hostlib": make_wheel(tmp / "h", "hostlib", host),
                     "patcher": make_wheel(tmp / "p", "patcher", patcher(base_has_warmup))})
    locked = {"hostlib": LockedPackage("hostlib", "2.0", frozenset()),
              "patcher": LockedPackage("patcher", "1.0", frozenset())}
    return discover.find(load_stack("cpu"), src, locked, ["patcher"], kinds=kinds)


def by_key(d: discover.Discovered) -> dict[str, discover.Finding]:
    return {f.key: f for f in d.findings}


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
    assert not any(k.startswith("hostlib.api.run(mode") for k in found)
    # a keyword only **kwargs takes binds: counted under its rule (what a stack's baseline compares), not reported
    assert found["hostlib.api.loose(anything)"].rule == "kwargs-only"


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
    res = discover.render(d, {})
    summary = res[-1]
    assert summary.id == "discovered:summary" and summary.status == "pass"
    assert "contracts checked" in summary.reason and "suppressed by a rule" in summary.reason
    assert any(e.text.startswith("rule caught") for e in summary.evidence)
    fails = [r for r in res if r.status == "fail"]
    assert {r.id.split(":")[2] for r in fails} == {"import", "keyword", "replacement", "paste"}
    assert d.checked["import"] > 5 and d.checked["paste"] == 2
    # a wheel that could not be read leaves the summary undecided, never a pass
    assert discover.render(d, {"hostlib": "no wheel"})[-1].undecided


# -- each pass alone: the model and the walk are shared, the passes are not ---------------------------------

@pytest.mark.parametrize(("kind", "keys"), [
    ("replacement", ["hostlib.runner.Manager", "hostlib.api.Engine.helper"]),
    ("import", ["hostlib.api.gone_plain", "hostlib.api.gone_available"]),
    ("paste", ['ITEMS["gen_trainer"]:loss']),
    ("keyword", ["hostlib.api.run(colour)", "hostlib.api.Engine(device)"]),
])
def test_each_pass_alone_finds_its_breaks(tmp_path: Path, kind: discover.Kind, keys: list[str]) -> None:
    d = run(tmp_path, kinds=[kind])
    found = by_key(d)
    for key in keys:
        assert found[key].rule is None and found[key].kind == kind, key
    assert {f.kind for f in d.findings} == {kind}
    assert set(d.checked) == {kind} and d.checked[kind] > 0
    # typed findings: A's site first, as file:line in A
    f = found[keys[0]]
    assert f.evidence and f.evidence[0].file and f.evidence[0].line


def test_the_passes_merge_in_source_order_whatever_order_they_run(tmp_path: Path) -> None:
    """Findings of separate passes come back in the walk's order, so the rendered results (which keep the first
    message of a repeated break) do not depend on which pass ran first."""
    forward = run(tmp_path)
    backward = run(tmp_path, kinds=list(reversed(discover.KINDS)))
    assert [(f.kind, f.key, f.rule) for f in forward.findings] == [(f.kind, f.key, f.rule) for f in backward.findings]
    assert [f.order for f in forward.findings] == sorted(f.order for f in forward.findings)
    dump = [r.model_dump() for r in discover.render(forward, {})]
    assert dump == [r.model_dump() for r in discover.render(backward, {})]


def test_the_code_hash_reads_every_discovery_module() -> None:
    """A cached discovery result is keyed by the probes' code: each listed file must exist (a renamed one would
    silently drop out of the key), and every module of the discover package counts."""
    from rlstack.probes import inputs

    here = Path(inputs.__file__).parent
    assert all((here / name).exists() for name in inputs._CODE)
    assert "discover" in inputs._CODE and (here / "discover" / "imports.py").is_file()


# -- attribute chains on B's modules: `import B.x` then `B.x.Y` is checked like `from B.x import Y` ---------

CHAIN_HOST = {
    "hostlib/__init__.py": "",
    "hostlib/sub/__init__.py": "",
    "hostlib/sub/mod.py": "class Thing:\n    x = 1\n\nVALUE = 2\n",
    "hostlib/lazy.py": "def __getattr__(name):\n    return name\n",
}

CHAIN_PATCHER = """
from typing import TYPE_CHECKING
import hostlib.sub.mod
import hostlib.sub.mod as m
from hostlib.sub import mod as m2
from hostlib import sub
import hostlib.lazy

OK_CLASS_ATTR = hostlib.sub.mod.Thing.x
OK_ALIAS = m.VALUE
BAD_CHAIN = hostlib.sub.mod.Gone
BAD_ALIAS = m.GoneAlias
BAD_FROM = m2.GoneFrom
BAD_SUB = sub.nomod.X
LAZY = hostlib.lazy.Whatever


class K(hostlib.sub.mod.GoneBase):
    pass


try:
    CAUGHT = m.GoneCaught
except AttributeError:
    CAUGHT = None
if is_hostlib_available():
    AVAILABLE = m.GoneAvailable
if is_otherlib_available():
    UNAVAILABLE = m.GoneUnavailable
if TYPE_CHECKING:
    TYPING = m.GoneTyping
if some_flag():
    FLAG = m.GoneFlag
hostlib.sub.mod.Added = 1
hostlib.sub.mod.Thing.y = 2
ADDED = hostlib.sub.mod.Added


def uses(model):
    return m.GoneInFunction


def shadowed(m):
    return m.Anything
"""


def chains(tmp: Path) -> dict[str, discover.Finding]:
    (tmp / "h").mkdir()
    (tmp / "p").mkdir()
    src = SourceSet({"hostlib": make_wheel(tmp / "h", "hostlib", CHAIN_HOST),
                     "patcher": make_wheel(tmp / "p", "patcher", {"patcher/__init__.py": CHAIN_PATCHER})})
    locked = {"hostlib": LockedPackage("hostlib", "2.0", frozenset()),
              "patcher": LockedPackage("patcher", "1.0", frozenset())}
    return by_key(discover.find(load_stack("cpu"), src, locked, ["patcher"], kinds=WALKED))


def test_attribute_chains_on_modules_are_checked_like_from_imports(tmp_path: Path) -> None:
    found = chains(tmp_path)
    for key in ("hostlib.sub.mod.Gone", "hostlib.sub.mod.GoneAlias", "hostlib.sub.mod.GoneFrom",
                "hostlib.sub.nomod", "hostlib.sub.mod.GoneBase", "hostlib.sub.mod.GoneAvailable"):
        assert found[key].rule is None, key  # module level, or under a guard that holds: a real finding
        assert "has no attribute" in found[key].message and found[key].evidence[0].line
    bad = found["hostlib.sub.mod.Gone"]
    assert bad.kind == "import" and (bad.evidence[0].file, bad.evidence[0].line) == ("patcher/__init__.py", 11)
    for absent in ("hostlib.sub.mod.Thing", "hostlib.sub.mod.VALUE", "hostlib.sub.mod.GoneUnavailable",
                   "hostlib.sub.mod.GoneTyping", "hostlib.sub.mod.Anything"):  # exist, dead paths, a parameter
        assert absent not in found, absent


@pytest.mark.parametrize(("key", "rule"), [
    ("hostlib.sub.mod.GoneCaught", "caught"),
    ("hostlib.sub.mod.GoneFlag", "guard-unknown"),
    ("hostlib.lazy.Whatever", "dynamic-module"),
    ("hostlib.sub.mod.GoneInFunction", "in-function-import"),
    ("hostlib.sub.mod.Added", "installed-by-a"),
])
def test_attribute_chains_follow_the_same_suppression_rules(tmp_path: Path, key: str, rule: str) -> None:
    assert chains(tmp_path)[key].rule == rule
    assert rule in discover.RULES


# -- early exits, Python-version guards, missing modules, names another package installs -------------------

EXITS_PATCHER = """
import sys
import hostlib.api
from hostlib.api import run

if sys.version_info < (3, 9):
    raise ImportError("needs Python 3.9")  # false on the stack's Python 3.11: the rest of the module runs
from hostlib.api import gone_after_version_exit
from hostlib.gone import One, Two
from hostlib.gone.deeper import Three


def restore():
    permitted = can_restore()
    if not permitted:
        return False  # cannot be evaluated: what follows runs only when it did not return
    run(1, colour="unknowable")


def newer_only():
    if sys.version_info[:2] >= (3, 11):
        return None  # always returns on the stack's Python: what follows never runs
    run(1, colour="dead")


def plain():
    run(1, colour="live")
"""

SHIMMER = """
import hostlib.api


class Shim:
    pass


def install():
    hostlib.api.Shim = Shim
"""


def two_as(tmp: Path, patcher_files: dict[str, str], others: dict[str, dict[str, str]] | None = None
           ) -> discover.Discovered:
    wheels_: dict[str, Path] = {}
    for name, files in {"hostlib": {**HOST, "hostlib/gen_trainer.py": ""}, "patcher": patcher_files,
                        **(others or {})}.items():
        (tmp / name).mkdir()
        wheels_[name] = make_wheel(tmp / name, name, files)
    locked = {n: LockedPackage(n, "2.0" if n == "hostlib" else "1.0", frozenset()) for n in wheels_}
    a = sorted(n for n in wheels_ if n != "hostlib")
    return discover.find(load_stack("cpu"), SourceSet(dict(wheels_)), locked, a, kinds=WALKED)


def test_an_early_exit_guards_the_rest_of_its_block(tmp_path: Path) -> None:
    d = two_as(tmp_path, {"patcher/__init__.py": EXITS_PATCHER})
    assert by_key(d)["hostlib.api.gone_after_version_exit"].rule is None  # the version exit does not fire on 3.11
    runs = {f.evidence[0].line: f.rule for f in d.findings if f.key == "hostlib.api.run(colour)"}
    assert runs == {17: "guard-unknown",  # after `if not permitted: return`: runs only when it did not return
                    27: None}  # plain(): live; line 23, after a return that always happens on 3.11, never runs


def test_a_missing_module_is_one_finding_whatever_is_imported_from_it(tmp_path: Path) -> None:
    d = two_as(tmp_path, {"patcher/__init__.py": EXITS_PATCHER})
    gone = [f for f in d.findings if "hostlib.gone" in f.key]
    assert {f.key for f in gone} == {"hostlib.gone"}
    assert all("No module named 'hostlib.gone'" in f.message for f in gone)
    res = [r for r in discover.render(d, {}) if r.id.endswith(":import:hostlib.gone")]
    assert len(res) == 1 and {e.line for e in res[0].evidence} == {9, 10}


def test_a_name_another_package_installs_is_real_and_says_who_installs_it(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    d = two_as(tmp_path / "x", {"patcher/__init__.py": "from hostlib.api import Shim\n"},
               {"shimmer": {"shimmer/__init__.py": SHIMMER}})
    res = next(r for r in discover.render(d, {}) if r.id.endswith(":import:hostlib.api.Shim"))
    assert res.status == "fail" and "shimmer assigns hostlib.api.Shim itself (shimmer/__init__.py:10)" in res.reason
    assert ("shimmer", "shimmer/__init__.py", 10) in {(e.package, e.file, e.line) for e in res.evidence}


def test_relative_imports_in_a_package_init_resolve_inside_the_package(tmp_path: Path) -> None:
    """`from .core import *` in pkg/__init__.py is pkg.core (in pkg/mod.py too): read as the parent's sibling,
    numpy.ma's names looked missing, or a star import looked unreadable and hid a real missing name."""
    assert pyast.module_info(ast.parse("from .core import *"), pyast.relative_base("numpy/ma/__init__.py")
                             ).star_imports == ["numpy.ma.core"]
    assert pyast.module_info(ast.parse("from .core import *"), pyast.relative_base("numpy/ma/extras.py")
                             ).star_imports == ["numpy.ma.core"]
    assert pyast.module_info(ast.parse("from ..core import x"), pyast.relative_base("numpy/ma/__init__.py")
                             ).bindings["x"][0].module == "numpy.core"
    host = {"hostlib/__init__.py": "", "hostlib/pkg/__init__.py": "from .core import *\n",
            "hostlib/pkg/core.py": "def there():\n    pass\n"}
    (tmp_path / "h").mkdir()
    (tmp_path / "p").mkdir()
    src = SourceSet({"hostlib": make_wheel(tmp_path / "h", "hostlib", host),
                     "patcher": make_wheel(tmp_path / "p", "patcher", {
                         "patcher/__init__.py": "from hostlib.pkg import there, not_there\n"})})
    locked = {"hostlib": LockedPackage("hostlib", "2.0", frozenset()),
              "patcher": LockedPackage("patcher", "1.0", frozenset())}
    found = by_key(discover.find(load_stack("cpu"), src, locked, ["patcher"], kinds=WALKED))
    assert "hostlib.pkg.there" not in found
    assert found["hostlib.pkg.not_there"].rule is None  # read through the star import, not suppressed as unreadable


def test_a_flag_imported_through_a_chain_is_read_however_deep_it_was_first_met(tmp_path: Path) -> None:
    """A module whose flags were first read from deep in an import chain (imports not followed there) is read
    again, whole, when its own statements are walked: cached half-read, its guard looked unknowable."""
    files = {
        "patcher/__init__.py": "",
        "patcher/a.py": "from patcher.b import nothing\n",
        "patcher/b.py": "from patcher.c import nothing\n",
        "patcher/c.py": "from patcher.d import nothing\n",
        "patcher/d.py": "from patcher.flags import is_v3\nif is_v3:\n    from hostlib.api import gone_v3\n",
        "patcher/flags.py": "import hostlib\nfrom packaging.version import parse\n"
                            "is_v3 = parse(hostlib.__version__) >= parse('3.0')\n",
    }
    assert "hostlib.api.gone_v3" not in by_key(two_as(tmp_path, files))  # hostlib 2.0: the guard is false


def test_parses_run_one_at_a_time_with_the_collector_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython 3.11's AST conversion shares its recursion-depth state between threads (gh-106905: a
    SystemError seen in the probes' thread pools), so pyast.parse lets one thread parse at a time."""
    import gc
    import threading
    import time

    real_parse = ast.parse
    inside, most = [0], [0]
    guard = threading.Lock()

    def slow_parse(text: str, *args: Any, **kwargs: Any) -> ast.Module:
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        with guard:
            inside[0] -= 1
        return real_parse(text, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", slow_parse)
    threads = [threading.Thread(target=pyast.parse, args=(f"x{i} = {i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert gc.isenabled()
