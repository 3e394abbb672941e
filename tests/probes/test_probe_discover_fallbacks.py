"""Discovery where a dependency breaks behind a fallback or a run-time name, on small handmade packages: a
failing try's handler is the live path, a stub fallback is a finding, a keyword call to a callee B lacks is a
finding, a star import is a reference, an install excuses a read only where it runs before it, and a missing
name in a function body is a finding where A surely calls the function (excused where it does not)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rlstack.probes import discover
from rlstack.probes.discover import sites
from rlstack.probes.wheels import SourceSet
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import load_stack

HOST = {
    "hostlib/__init__.py": "__version__ = '2.0'\n",
    "hostlib/lora.py": "class LoRARequest:\n    def __init__(self, name, path):\n        self.name = name\n",
    "hostlib/newplace.py": "class Manager:\n    pass\n",
    "hostlib/api.py": "def run(x, *, mode='a'):\n    return x\n",
    "hostlib/trainers/__init__.py": "",
    "hostlib/trainers/grpo_trainer.py": "class GRPOTrainer:\n    pass\n",
}


Discover = Callable[..., discover.Discovered]
Handmade = Callable[..., tuple[SourceSet, dict[str, LockedPackage]]]  # the handmade fixture (conftest.py)


@pytest.fixture
def discovered(handmade: Handmade) -> Discover:
    """Discovery over `patcher` (the A package) against `hostlib` (HOST unless `host` is given)."""
    def run(tmp: Path, patcher: dict[str, str], host: dict[str, str] | None = None) -> discover.Discovered:
        src, locked = handmade(tmp, {"hostlib": host or HOST, "patcher": patcher}, {"hostlib": "2.0"})
        return discover.find(load_stack("cpu"), src, locked, ["patcher"])
    return run


def by_key(d: discover.Discovered) -> dict[str, discover.Finding]:
    return {f.key: f for f in d.findings}


STUBS = """
try:
    from hostlib.lora import LoRARequest
except ImportError:
    class LoRARequest: pass
try:
    from hostlib.lora import get_adapter_path
except ImportError:
    def get_adapter_path(*args, **kwargs):
        raise RuntimeError("hostlib is required")
try:
    from hostlib.lora import optional_thing
except ImportError:
    optional_thing = None
"""


def test_a_stub_fallback_is_a_finding_where_a_working_one_is_caught(tmp_path: Path, discovered: Discover) -> None:
    found = by_key(discovered(tmp_path, {"patcher/__init__.py": STUBS}))
    stub = found["hostlib.lora.get_adapter_path"]
    assert stub.rule is None and "stub fallback" in stub.message and "patcher/__init__.py:9" in stub.message
    assert found["hostlib.lora.optional_thing"].rule == "caught"  # None: a feature switched off, tested before use
    assert "hostlib.lora.LoRARequest" not in found  # there on this lock: the stub never runs
    # the same patcher against a host without LoRARequest: its stub takes over, a finding
    host = {**HOST, "hostlib/lora.py": "X = 1\n"}
    again = by_key(discovered(tmp_path / "b", {"patcher/__init__.py": STUBS}, host))
    assert again["hostlib.lora.LoRARequest"].rule is None
    assert "class LoRARequest: pass" in again["hostlib.lora.LoRARequest"].message


MOVED = """
try:
    from hostlib.oldplace import Manager
except ImportError:
    try:
        from hostlib.newplace import Manager, create_manager
    except ImportError:
        class Manager: pass
        def create_manager(*a, **k):
            raise RuntimeError("no")
"""


def test_the_handler_of_a_failing_try_is_the_live_path_and_its_imports_are_checked(
        tmp_path: Path, discovered: Discover) -> None:
    d = discovered(tmp_path, {"patcher/__init__.py": MOVED})
    found = by_key(d)
    assert found["hostlib.oldplace"].rule == "caught"  # the handler imports Manager elsewhere: a real alternative
    # hostlib.oldplace is gone, so the handler runs: its import of create_manager fails into a stub
    moved = found["hostlib.newplace.create_manager"]
    assert moved.rule is None and "stub fallback" in moved.message
    assert any(r.module == "hostlib.newplace" and r.name == "Manager" and r.live for r in d.refs)


def test_a_keyword_call_to_a_callee_the_host_lacks_is_a_finding(tmp_path: Path, discovered: Discover) -> None:
    patcher = {"patcher/__init__.py": "import hostlib.api\n\nhostlib.api.gone(1, mode='b')\n"
                                      "hostlib.api.run(1, mode='c')\n"}
    d = discovered(tmp_path, patcher)
    gone = by_key(d)["hostlib.api.gone()"]
    assert gone.kind == "keyword" and gone.rule is None and "does not define it" in gone.message
    assert any(r.kind == "keyword" and r.name == "run" and r.keyword == "mode" for r in d.refs)


def test_a_star_import_is_a_reference(tmp_path: Path, discovered: Discover) -> None:
    patcher = {"patcher/__init__.py": "from patcher.shim import *\n",
               "patcher/shim.py": "from hostlib.api import gone_name\n"}
    found = by_key(discovered(tmp_path, patcher))
    assert found["hostlib.api.gone_name"].rule is None  # patcher.shim is imported (by a star): not unreferenced


GUARDED_INSTALL = """
import sys
import hostlib.api
from hostlib.api import apple_only, added_later, added_early

if sys.platform == "darwin":
    hostlib.api.apple_only = 1
hostlib.api.added_later = 2
"""


def test_an_install_excuses_a_read_only_where_it_runs_before_it(tmp_path: Path, discovered: Discover) -> None:
    patcher = {"patcher/__init__.py": GUARDED_INSTALL,
               "patcher/early.py": "import hostlib.api\n\ndef patch():\n    hostlib.api.added_early = 3\n"}
    found = by_key(discovered(tmp_path, patcher))
    assert found["hostlib.api.apple_only"].rule is None  # an Apple-only shim: a dead path on a Linux stack
    assert found["hostlib.api.added_later"].rule is None  # assigned after the import that needs it failed
    assert found["hostlib.api.added_early"].rule == "installed-by-a"  # a patch function: the order is not read


def test_module_dunders_are_never_missing_and_version_is_checked(tmp_path: Path, discovered: Discover) -> None:
    patcher = {"patcher/__init__.py": "import hostlib.api\nimport hostlib.lora\n\nA = hostlib.api.__dict__\n"
                                      "B = hostlib.lora.__file__\nC = hostlib.api.__version__\n"}
    found = by_key(discovered(tmp_path, patcher))
    assert "hostlib.api.__dict__" not in found and "hostlib.lora.__file__" not in found
    assert found["hostlib.api.__version__"].rule is None


RUNTIME = """
import hostlib.trainers


def patch(trainer_file="grpo_trainer"):
    if trainer_file == "sft_trainer":
        pass
    mod = eval(f"hostlib.trainers.{trainer_file}")
    exec(f"from hostlib.trainers.grpo_trainer import {trainer_file.upper()}")
    return mod


import hostlib.trainers.grpo_trainer
X = eval("hostlib.trainers.grpo_trainer.GRPOTrainer")
patch()
"""


def test_names_built_at_run_time_are_resolved_where_the_source_pins_them(tmp_path: Path, discovered: Discover) -> None:
    d = discovered(tmp_path, {"patcher/__init__.py": RUNTIME})
    found = by_key(d)
    # compared with: a known value; a module a function picks at run time stays excused, called or not
    assert found["hostlib.trainers.sft_trainer"].rule == "in-function-import"
    assert "at run time" in found["hostlib.trainers.sft_trainer"].message
    assert any(r.module == "hostlib.trainers.grpo_trainer" and r.name == "GRPOTrainer" for r in d.refs)
    assert d.unchecked["runtime-name"] == 1  # {trainer_file.upper()}: not pinned down, counted


def test_a_replacement_whose_original_is_gone_is_a_finding(tmp_path: Path, discovered: Discover) -> None:
    patcher = {"patcher/__init__.py": "import hostlib.api\nimport hostlib.lora\n\ndef mine(x, *, mode='a'):\n"
                                      "    return x\n\nhostlib.api.run = mine\nhostlib.api.ran = mine\n"
                                      "hostlib.lora.LoRARequest.gone = mine\n"}
    d = discovered(tmp_path, patcher)
    found = by_key(d)
    gone = found["hostlib.lora.LoRARequest.gone"]  # a method B renamed: the patch no longer fixes anything
    assert gone.kind == "replacement" and gone.rule is None and "does not define" in gone.message
    assert found["hostlib.api.ran"].rule == "adds-name"  # a module attribute: added, read by nothing in B
    assert any(r.kind == "replacement" and r.name == "run" for r in d.refs)


def test_every_suppression_is_in_the_side_file_counted_per_rule_and_pair(tmp_path: Path, discovered: Discover) -> None:
    d = discovered(tmp_path, {"patcher/__init__.py": STUBS + MOVED})
    side = discover.suppressed_file(load_stack("cpu"), d)
    assert len(side["suppressed"]) == sum(d.suppressed().values()) > 0  # type: ignore[arg-type]
    assert side["pairs"] == {"patcher->hostlib": dict(d.suppressed().most_common())}
    path = tmp_path / "side.json"
    path.write_text(json.dumps(side))
    summary = discover.render(d, {}, path)[-1]
    assert any(e.text.startswith("suppressed patcher->hostlib: caught") for e in summary.evidence)
    assert any(str(path) in e.text for e in summary.evidence)


def test_fallbacks_read_placeholders_from_shims() -> None:
    import ast

    tree = ast.parse("try:\n    pass\nexcept ImportError:\n    class A: pass\n    class B:\n"
                     "        def f(self): return 1\n    def c(): raise RuntimeError\n    d = None\n")
    got = {k: v[0] for k, v in sites.fallbacks(tree.body[0].handlers).items()}  # type: ignore[attr-defined]
    assert got == {"A": "stub", "B": "alternative", "c": "stub", "d": "none"}


def test_a_read_behind_hasattr_is_made_only_where_the_module_has_the_name(tmp_path: Path, discovered: Discover) -> None:
    patcher = {"patcher/__init__.py": "import hostlib.api\n\n"
                                      "if hasattr(hostlib.api, 'gone') and hostlib.api.gone.__name__ != 'x':\n"
                                      "    Y = hostlib.api.gone_too\n"
                                      "if not hasattr(hostlib.api, 'run'):\n    Z = hostlib.api.dead\n"
                                      "if hasattr(hostlib.api, 'run') and hostlib.api.run_gone:\n    pass\n"}
    found = by_key(discovered(tmp_path, patcher))
    assert not {"hostlib.api.gone", "hostlib.api.gone_too", "hostlib.api.dead"} & set(found)
    assert found["hostlib.api.run_gone"].rule is None  # hostlib.api has run: the second operand is read


REACHED = """
import hostlib.api
import patcher.other
import patcher.tools


def install():
    pass


def setup():
    from hostlib.api import gone_in_setup
    hostlib.api.gone_callee(1, mode="b")
    return hostlib.api.gone_read_in_setup


def never_called():
    from hostlib.api import gone_uncalled
    hostlib.api.gone_callee_uncalled(1, mode="b")


def called_under_a_flag():
    from hostlib.api import gone_flagged


def conditional(x):
    return x and hostlib.api.gone_after_and


def register(f):
    hostlib.api.gone_in_decorator
    return f


@register
def decorated():
    pass


def entry():
    _helper()


def _helper():
    from hostlib.api import gone_in_helper


def _unused():
    _helper_of_unused()


def _helper_of_unused():
    from hostlib.api import gone_in_private_chain


class Engine:
    def __init__(self):
        from hostlib.api import gone_in_init

    def later(self):
        from hostlib.api import gone_in_method


def kernel():
    from hostlib.api import gone_in_kernel


def only_behind_and():
    from hostlib.api import gone_behind_and


setup()
install()  # this module's install, not patcher.other's
patcher.tools.run_tool()
conditional(1)
kernel[(1,)]()
FLAG = some_flag() and only_behind_and()
ENGINE = Engine()
if some_flag():
    called_under_a_flag()
"""


def test_a_missing_name_in_a_function_a_calls_is_a_finding(tmp_path: Path, discovered: Discover) -> None:
    # called from module level, a class body, a decorator, a constructor, a public function, a launch: reached
    patcher = {"patcher/__init__.py": REACHED,
               "patcher/other.py": "def install():\n    from hostlib.api import gone_in_other_install\n",
               "patcher/tools.py": "def run_tool():\n    from hostlib.api import gone_in_tool\n"}
    found = by_key(discovered(tmp_path, patcher))
    for key in ("gone_in_setup", "gone_read_in_setup", "gone_in_decorator", "gone_in_init", "gone_in_helper",
                "gone_in_kernel", "gone_in_tool"):
        assert found[f"hostlib.api.{key}"].rule is None, key  # called where the call surely runs: checked
    assert "in setup()" in found["hostlib.api.gone_in_setup"].message
    assert found["hostlib.api.gone_callee()"].rule is None  # a keyword call to a callee B lacks, the same way
    assert found["hostlib.api.gone_callee_uncalled()"].rule == "in-function-import"
    for key in ("gone_uncalled", "gone_flagged", "gone_after_and", "gone_in_method", "gone_in_private_chain",
                "gone_behind_and", "gone_in_other_install"):
        assert found[f"hostlib.api.{key}"].rule == "in-function-import", key  # no call that surely runs: excused


def test_calls_count_only_where_they_surely_run() -> None:
    import ast

    tree = ast.parse("f(a) or g(b if c() else d())\n[h(x) for x in k()]\n")
    got = {ast.unparse(n.func): cond for top in tree.body for n, cond in sites.walk_paths(top)
           if isinstance(n, ast.Call)}
    assert got == {"f": False, "g": True, "c": True, "d": True, "h": True, "k": False}
