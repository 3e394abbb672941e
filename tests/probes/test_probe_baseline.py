"""A stack's baseline of suppressed findings (rlstack.probes.discover.baseline), on small handmade packages: a
caught path that newly fails relative to the baseline is a finding, the same one in the baseline is not, a
baseline key no longer met is info only, a keyword that newly lands in **kwargs is a finding, accepting writes a
file the next run accepts, and a stack without a baseline behaves as before."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rlstack.probes import discover
from rlstack.probes.discover import baseline
from rlstack.probes.model import ProbeResult
from rlstack.probes.wheels import SourceSet
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack, load_stack

Handmade = Callable[..., tuple[SourceSet, dict[str, LockedPackage]]]  # the handmade fixture (conftest.py)

PATCHER = """
import hostlib.api
try:
    from hostlib.lora import fast_kernel
except ImportError:
    fast_kernel = None
try:
    from hostlib.lora import never_there
except ImportError:
    never_there = None

hostlib.api.run(1, mode="b")
"""

HOST_OLD = {
    "hostlib/__init__.py": "",
    "hostlib/lora.py": "def fast_kernel(x):\n    return x\n",
    "hostlib/api.py": "def run(x, *, mode='a', **kwargs):\n    return x\n",
}
# the next release: the optional kernel is gone (the caught import falls back to None) and `mode` renamed (the
# keyword binds through **kwargs, and its value no longer reaches the parameter)
HOST_NEW = {
    "hostlib/__init__.py": "",
    "hostlib/lora.py": "def other(x):\n    return x\n",
    "hostlib/api.py": "def run(x, *, style='a', **kwargs):\n    return x\n",
}
KERNEL = "patcher->hostlib:import:hostlib.lora.fast_kernel"
ALWAYS = "patcher->hostlib:import:hostlib.lora.never_there"
MODE = "patcher->hostlib:keyword:hostlib.api.run(mode)"


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    """The cpu stack with its folder (where the baseline lives) in a scratch copy: no test writes into images/."""
    cpu = load_stack("cpu")
    folder = tmp_path / "stack"
    folder.mkdir()
    for f in (cpu.stack_file, cpu.requirements_in, cpu.lock_file):
        shutil.copy(f, folder / f.name)
    return cpu.model_copy(update={"folder": folder})


def run(tmp: Path, handmade: Handmade, host: dict[str, str]) -> discover.Discovered:
    src, locked = handmade(tmp, {"hostlib": host, "patcher": {"patcher/__init__.py": PATCHER}}, {"hostlib": "2.0"})
    return discover.find(load_stack("cpu"), src, locked, ["patcher"])


def probe(stack: Stack, found: discover.Discovered, accepted: baseline.Baseline | None) -> list[ProbeResult]:
    """The results `invoke probe --discovered-only` shows: rendered, then compared with the baseline."""
    return baseline.apply(stack, discover.render(found, {}), baseline.excused(found), accepted, "code")


def failing(results: list[ProbeResult]) -> list[str]:
    return [r.id for r in results if r.status == "fail"]


def test_a_caught_path_that_newly_fails_is_a_finding_against_the_baseline(
    tmp_path: Path, handmade: Handmade, stack: Stack
) -> None:
    old = run(tmp_path / "old", handmade, HOST_OLD)
    accepted = baseline.of(stack, baseline.excused(old), "code")
    assert ALWAYS in accepted.keys["caught"] and KERNEL not in accepted.all()
    new = run(tmp_path / "new", handmade, HOST_NEW)
    # without the baseline both breaks are excused: the caught import and the keyword in **kwargs
    assert failing(discover.render(new, {})) == []
    res = probe(stack, new, accepted)
    assert failing(res) == [f"discovered:new-since-baseline:{KERNEL}", f"discovered:new-since-baseline:{MODE}"]
    kernel = res[0]
    assert "cannot import name 'fast_kernel'" in kernel.reason and "'caught'" in kernel.reason
    assert accepted.lock[:12] in kernel.reason
    assert kernel.fix and baseline.accept_command(stack) in kernel.fix
    assert kernel.evidence[0].package == "patcher" and kernel.evidence[0].file == "patcher/__init__.py"
    assert "1 of its" not in res[-1].reason and "2 suppressed key(s) new since it" in res[-1].reason


def test_a_suppressed_key_in_the_baseline_is_not_a_finding(tmp_path: Path, handmade: Handmade, stack: Stack) -> None:
    new = run(tmp_path, handmade, HOST_NEW)
    accepted = baseline.of(stack, baseline.excused(new), "code")
    assert {KERNEL, ALWAYS, MODE} <= accepted.all() and MODE in accepted.keys["kwargs-only"]
    res = probe(stack, new, accepted)
    assert failing(res) == []
    assert "0 suppressed key(s) new since it, 0 of its" in res[-1].reason


def test_a_baseline_key_no_longer_met_is_info_only(tmp_path: Path, handmade: Handmade, stack: Stack) -> None:
    accepted = baseline.of(stack, baseline.excused(run(tmp_path / "new", handmade, HOST_NEW)), "code")
    res = probe(stack, run(tmp_path / "old", handmade, HOST_OLD), accepted)  # the break was fixed upstream
    assert failing(res) == [] and res[-1].status == "pass"
    assert f"2 of its {len(accepted.all())} no longer met" in res[-1].reason
    gone = [e.text for e in res[-1].evidence if e.text.startswith("info: baseline key no longer met")]
    assert [t.rsplit(": ", 1)[1] for t in gone] == [KERNEL, MODE]


def test_accepting_writes_a_file_the_next_run_accepts(tmp_path: Path, handmade: Handmade, stack: Stack) -> None:
    new = run(tmp_path, handmade, HOST_NEW)
    assert baseline.load(stack) is None
    path = baseline.write(stack, baseline.of(stack, baseline.excused(new), "code"))
    assert path == stack.folder / "probe-baseline.json"
    text = path.read_text()
    assert f'  "{KERNEL}",\n' in text  # one key a line, reviewable in a diff
    data = json.loads(text)
    assert data["keys"]["caught"] == sorted(data["keys"]["caught"]) and data["counts"]["kwargs-only"] == 1
    assert data["accept"] == "invoke probe --stack cpu --discovered-only --accept-baseline"
    assert failing(probe(stack, new, baseline.load(stack))) == []


def test_without_a_baseline_the_probe_behaves_as_before_and_says_so(
    tmp_path: Path, handmade: Handmade, stack: Stack
) -> None:
    new = run(tmp_path, handmade, HOST_NEW)
    before = discover.render(new, {})
    res = probe(stack, new, baseline.load(stack))
    assert [r.model_dump() for r in res[:-1]] == [r.model_dump() for r in before[:-1]]
    assert res[-1].reason == before[-1].reason and res[-1].status == "pass"
    said = [e.text for e in res[-1].evidence if e.text.startswith("no probe baseline")]
    assert len(said) == 1 and baseline.accept_command(stack) in said[0]


def test_a_handler_that_imports_the_name_from_elsewhere_is_not_a_key(
    tmp_path: Path, handmade: Handmade, stack: Stack
) -> None:
    """The handler's import is checked as the live path: taking it is not a path switched off."""
    moved = {
        "patcher/__init__.py": "try:\n    from hostlib.lora import fast_kernel\nexcept ImportError:\n"
        "    from hostlib.api import run as fast_kernel\n"
    }
    src, locked = handmade(tmp_path, {"hostlib": HOST_NEW, "patcher": moved}, {"hostlib": "2.0"})
    found = discover.find(load_stack("cpu"), src, locked, ["patcher"])
    assert any(f.rule == "caught" and f.key == "hostlib.lora.fast_kernel" for f in found.findings)
    assert KERNEL not in baseline.excused(found)


@pytest.mark.parametrize(("text", "field"), [("{", "not JSON"), ('{"stack": "cpu"}', "field 'lock'")])
def test_a_broken_baseline_file_says_what_is_wrong_and_how_to_recover(stack: Stack, text: str, field: str) -> None:
    baseline.path(stack).write_text(text)
    with pytest.raises(baseline.BaselineFileError) as err:
        baseline.load(stack)
    assert field in str(err.value) and "--accept-baseline" in str(err.value)


def test_the_committed_baselines_read_as_their_own_stacks() -> None:
    """Each committed baseline parses, names the stack whose folder holds it, and lists its keys sorted, counted."""
    from rlstack.stacks import load_all

    for st in load_all():
        got = baseline.load(st)
        if got is not None:
            assert got.stack == st.name, st.name
            assert all(keys == sorted(keys) and got.counts[r] == len(keys) for r, keys in got.keys.items())


def test_a_key_that_already_fails_as_a_finding_is_not_reported_again(
    tmp_path: Path, handmade: Handmade, stack: Stack
) -> None:
    both = {"patcher/__init__.py": PATCHER + "from hostlib.lora import fast_kernel as required\n"}
    src, locked = handmade(tmp_path, {"hostlib": HOST_NEW, "patcher": both}, {"hostlib": "2.0"})
    found = discover.find(load_stack("cpu"), src, locked, ["patcher"])
    assert KERNEL in baseline.excused(found)  # caught at one site, plain at the other
    accepted = baseline.of(stack, {k: e for k, e in baseline.excused(found).items() if k != KERNEL}, "code")
    assert failing(probe(stack, found, accepted)) == [f"discovered:{KERNEL}"]


def test_accept_writes_what_the_next_probe_run_accepts(
    tmp_path: Path, handmade: Handmade, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """discover.accept and discover.results over the same discovery (its cached results and keys): the file
    accept writes leaves nothing new for results, and nothing is written when a wheel could not be read."""
    from rlstack.probes.wheels import WheelCache, WheelError

    new = run(tmp_path, handmade, HOST_NEW)
    cached = (discover.render(new, {}), baseline.excused(new))
    monkeypatch.setattr(discover, "_cached", lambda *a: cached)
    before = discover.results(stack, locked={}, cache=WheelCache())
    assert failing(before) == [] and "no probe baseline" in before[-1].evidence[-1].text
    written = discover.accept(stack, locked={}, cache=WheelCache())
    assert written == baseline.path(stack) and json.loads(written.read_text())["stack"] == "cpu"
    after = discover.results(stack, locked={}, cache=WheelCache())
    assert failing(after) == [] and "0 suppressed key(s) new since it" in after[-1].reason
    written.unlink()
    monkeypatch.setattr(discover, "_cached", lambda *a: (discover.render(new, {"hostlib": "no wheel"}), cached[1]))
    with pytest.raises(WheelError, match="incomplete"):
        discover.accept(stack, locked={}, cache=WheelCache())
    assert not written.exists()


def test_accept_baseline_needs_the_contract_layer() -> None:
    from rlstack.core.options import UsageError
    from rlstack.probes.commands import probe as probe_command

    with pytest.raises(UsageError, match="--accept-baseline"):
        probe_command(stack="cpu", layer="toolchain", accept_baseline=True)
