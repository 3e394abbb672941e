"""Contract probes on small handmade packages: a replaced class that keeps or breaks its contract, and a
pasted function whose target namespace binds or lacks what it uses."""

from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

import pytest

from rlstack.probes import contract
from rlstack.probes.wheels import SourceSet


def make_wheel(tmp: Path, name: str, files: dict[str, str]) -> Path:
    path = tmp / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, textwrap.dedent(text))
        z.writestr(f"{name}-1.0.dist-info/METADATA", f"Name: {name}\nVersion: 1.0\n")
    return path


HOST = {
    "hostlib/__init__.py": "",
    "hostlib/manager.py": """
        class Manager:
            def add(self, x): ...
            def warmup_rank(self, r): return r
            def remove(self, x): ...
    """,
    "hostlib/runner.py": """
        from hostlib.manager import Manager

        class Runner:
            def __init__(self):
                self.mgr = Manager()
            def start(self):
                r = self.mgr.warmup_rank(8)
                self.mgr.add(r)
                self.mgr.not_on_original()   # defined nowhere: not the replacement's fault
    """,
}


def patcher(base_has_warmup: bool) -> dict[str, str]:
    extra = "    def warmup_rank(self, r): return r\n" if base_has_warmup else ""
    return {
        "patcher/__init__.py": "",
        # base class in another file, imported under try with a fallback (like unsloth_zoo's)
        "patcher/base.py": "class Base:\n    def add(self, x): ...\n" + extra,
        "patcher/manager.py": """
            try:
                from hostlib.gone_module import Base
            except ImportError:
                from patcher.base import Base

            class Manager(Base):
                def remove(self, x): ...
        """,
        "patcher/install.py": """
            import hostlib.runner
            from patcher.manager import Manager

            def patch():
                hostlib.runner.Manager = Manager
        """,
    }


CASES = """
cases:
  - id: host-manager
    kind: replaced_class
    wall: lora-warmup-rank
    summary: patcher replaces hostlib's Manager
    requires: [hostlib, patcher]
    replacement: {package: patcher, file: patcher/manager.py, class: Manager}
    original: {package: hostlib, file: hostlib/manager.py, class: Manager}
    installed_at:
      - {package: patcher, file: patcher/install.py, target: hostlib.runner.Manager}
    used_by:
      - {package: hostlib, files: [hostlib/runner.py], receiver: self.mgr}
    fix: pair versions
  - id: pasted-loss
    kind: pasted_function
    wall: grpo-align-completion-tool-mask
    summary: gen pastes zoo's loss into its template
    requires: [gen, zoo]
    function: {package: zoo, file: zoo/rl.py, name: loss}
    pasted_at: {package: gen, file: gen/items.py, container: 'ITEMS["t"]'}
    namespace:
      - {package: gen, file: gen/trainer.py, template: TEMPLATE}
      - {package: gen, file: gen/items.py, appended: 'ITEMS["t"]'}
    fix: same release
"""


def gen(template_has_helper: bool) -> dict[str, str]:
    ph = "{mask_helper_code}\n" if template_has_helper else ""
    return {
        "gen/__init__.py": "",
        "gen/items.py": """
            import inspect
            from collections import defaultdict
            from zoo.rl import REG
            ITEMS = defaultdict(list)
            loss = REG["loss"]
            other = REG["other"]
            ITEMS["t"].append(inspect.getsource(loss))
            ITEMS["t"].append(inspect.getsource(other))
        """,
        "gen/trainer.py": (
            "import inspect\nfrom zoo.rl import REG\nmask_helper = REG.get('mask')\n"
            "mask_helper_code = inspect.getsource(mask_helper)\n"
            "TEMPLATE = '''\nimport math\nfrom typing import *\nopts = {{'a': 1}}\n" + ph +
            "class Unsloth{name}({name}):\n    pass\n'''\n"),
    }


ZOO = {
    "zoo/__init__.py": "",
    "zoo/rl.py": """
        REG = {}
        def align_mask(m):
            return m
        REG["mask"] = align_mask
        def other_fn(x):
            return x
        REG["other"] = other_fn
        def loss(x, *, scale=1.0):
            import os
            y = [math.sqrt(v) for v in x]          # math: from the template
            z: Optional[int] = None                # typing star import
            w = other_fn(y)                        # pasted beside it
            m = align_mask(w)                      # only when the template pastes it
            def inner(q):
                return q * scale
            return inner(m), os.sep, z
            never_reached(x)                       # after return: not a dependency
        REG["loss"] = loss
    """,
}


def sources(tmp: Path, *, base_has_warmup: bool = False, template_has_helper: bool = False) -> SourceSet:
    return SourceSet({
        "hostlib": make_wheel(tmp, "hostlib", HOST),
        "patcher": make_wheel(tmp, "patcher", patcher(base_has_warmup)),
        "gen": make_wheel(tmp, "gen", gen(template_has_helper)),
        "zoo": make_wheel(tmp, "zoo", ZOO),
    })


@pytest.fixture
def cases(tmp_path: Path) -> dict[str, contract.Case]:
    p = tmp_path / "cases.yaml"
    p.write_text(CASES)
    return {c.id: c for c in contract.load_cases(p)}


def test_replaced_class_missing_method_fails_with_locations(tmp_path: Path, cases: dict[str, contract.Case]) -> None:
    res = contract.run_case(cases["host-manager"], sources(tmp_path))
    assert res.status == "fail"
    assert "'Manager' object has no attribute 'warmup_rank'" in res.reason
    assert "not_on_original" not in res.reason
    where = {(e.file, e.line) for e in res.evidence}
    assert ("hostlib/runner.py", 8) in where  # the call
    assert ("hostlib/manager.py", 4) in where  # the original's method
    assert ("patcher/install.py", 6) in where  # the install site
    assert res.signature == "lora-warmup-rank"


def test_replaced_class_passes_when_a_base_in_another_file_provides_it(tmp_path: Path,
                                                                       cases: dict[str, contract.Case]) -> None:
    res = contract.run_case(cases["host-manager"], sources(tmp_path, base_has_warmup=True))
    assert res.status == "pass", res.reason


def test_replaced_class_skips_when_not_installed(tmp_path: Path, cases: dict[str, contract.Case]) -> None:
    case = cases["host-manager"].model_copy(update={"installed_at": [
        contract.InstallSite(package="patcher", file="patcher/install.py", target="hostlib.other.Manager")]})
    assert contract.run_case(case, sources(tmp_path)).status == "skip"


def test_pasted_function_missing_name_is_a_name_error(tmp_path: Path, cases: dict[str, contract.Case]) -> None:
    res = contract.run_case(cases["pasted-loss"], sources(tmp_path))
    assert res.status == "fail"
    assert "name 'align_mask' is not defined" in res.reason
    # only align_mask: math/typing come from the template, other_fn is pasted beside it, code after return is dead
    assert "never_reached" not in res.reason and "other_fn" not in res.reason and "math" not in res.reason
    assert ("zoo/rl.py", 14) in {(e.file, e.line) for e in res.evidence}


def test_pasted_function_passes_when_template_pastes_the_helper(tmp_path: Path,
                                                                cases: dict[str, contract.Case]) -> None:
    res = contract.run_case(cases["pasted-loss"], sources(tmp_path, template_has_helper=True))
    assert res.status == "pass", res.reason


def test_shipped_cases_validate_and_name_known_walls() -> None:
    from rlstack.probes import signatures

    ids = {s.id for s in signatures.load()}
    for case in contract.load_cases():
        assert case.wall in ids, case.id


def test_transformed_paste_and_literal_code_count(tmp_path: Path, cases: dict[str, contract.Case]) -> None:
    """Newer unsloth pastes through a helper (paster(fn) calls inspect.getsource) and appends literal code
    that binds names: both are part of the generated module."""
    g = gen(template_has_helper=False)
    g["gen/items.py"] = (
        "import inspect\nfrom collections import defaultdict\nfrom zoo.rl import REG\nITEMS = defaultdict(list)\n"
        "loss = REG['loss']\nother = REG['other']\n"
        "def paster(fn):\n    return inspect.getsource(fn).replace('a', 'a')\n"
        "ITEMS['t'].append(\n    paster(loss)\n)\nITEMS['t'].append(inspect.getsource(other))\n"
        "ITEMS['t'].append('try:\\n    align_mask = REG2\\nexcept Exception:\\n    align_mask = None\\n')\n")
    (tmp_path / "g2").mkdir()
    src = sources(tmp_path)
    src.wheels["gen"] = make_wheel(tmp_path / "g2", "gen", g)
    res = contract.run_case(cases["pasted-loss"], src)
    assert res.status == "pass", res.reason
    g["gen/items.py"] = g["gen/items.py"].replace("align_mask = ", "other_name = ")
    (tmp_path / "g3").mkdir()
    src = sources(tmp_path)
    src.wheels["gen"] = make_wheel(tmp_path / "g3", "gen", g)
    assert contract.run_case(cases["pasted-loss"], src).status == "fail"
