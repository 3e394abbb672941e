"""The --suggest search on a small made-up index: metadata closure (moves forced by Requires-Dist, held
packages, dependents that must follow), the gallop-then-bisect for the first passing release, the choice
of the smallest move, the toolkit chosen for torch's CUDA, and the JSON a user gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from rlstack.probes import suggest
from rlstack.probes.model import ProbeResult
from rlstack.stacks.model import load_stack

RELEASES = {
    "vllm": ["0.19.1", "0.20.0", "0.21.0"],
    "unsloth": ["2026.3.11", "2026.3.12", "2026.4.1", "2026.5.1", "2026.6.1", "2026.7.5", "2026.8.1"],
    "unsloth-zoo": ["2026.6.1", "2026.6.6", "2026.7.6", "2026.8.1"],
    "torch": ["2.10.0", "2.11.0"],
    "torchvision": ["0.25.0", "0.26.0"],
    "trl": ["0.24.0", "0.25.0", "1.15.0"],
    "nvidia-cuda-nvcc-cu12": ["12.8.61", "12.9.41", "12.9.86"],
    "nvidia-cuda-nvcc": ["13.0.48", "13.0.88", "13.1.80"],
}

# Requires-Dist of each release, as the index's metadata would say (only what matters here)
META: dict[tuple[str, str], list[str]] = {
    ("unsloth", "2026.7.5"): ["unsloth_zoo>=2026.7.6", "torch<2.12", "trl<=0.24.0"],
    ("unsloth", "2026.8.1"): ["unsloth_zoo>=2026.8.1", "torch<2.12", "trl>=0.25"],
    ("vllm", "0.20.0"): ["torch==2.10.0", "torchvision==0.25.0"],
    ("vllm", "0.19.1"): ["torch==2.10.0", "torchvision==0.25.0"],
    ("vllm", "0.21.0"): ["torch==2.11.0", "torchvision==0.26.0"],
    ("torchvision", "0.26.0"): ["torch==2.11.0"],
    ("torchvision", "0.25.0"): ["torch==2.10.0"],
}
for _v in ("2026.3.12", "2026.4.1", "2026.5.1", "2026.6.1"):
    META[("unsloth", _v)] = ["torch<2.11.0", "unsloth_zoo>=2026.3.1"]


class FakeCache:
    def platform_needed(self, name: str, version: str, python: str, platform: str) -> str | None:
        return "x86_64-manylinux_2_31" if (name, version) == ("vllm", "0.19.1") else None


@pytest.fixture
def searcher(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> suggest.Searcher:
    s = suggest.Searcher(load_stack("fp8-report"), "sm_120", FakeCache(), progress=False)  # type: ignore[arg-type]
    s.base = {"vllm": "0.21.0", "unsloth": "2026.3.11", "unsloth-zoo": "2026.6.1", "torch": "2.11.0",
              "torchvision": "0.26.0", "trl": "0.24.0", "nvidia-cuda-nvrtc": "13.0.88"}
    s.deps = {"torch": {"vllm", "unsloth", "torchvision"}, "unsloth-zoo": {"unsloth"}, "trl": {"unsloth"},
              "torchvision": {"vllm"}}
    monkeypatch.setattr(s, "releases", lambda name: RELEASES[name])
    monkeypatch.setattr(s, "requires", lambda name, version, problems=None: [
        Requirement(x) for x in META.get((name, version), [])])
    return s


def test_dependents_come_from_the_locks_via_annotations() -> None:
    lock = ("torch==2.11.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via\n    #   -r requirements.in\n"
            "    #   vllm\n    #   Unsloth_Zoo\nvllm==0.21.0 \\\n    --hash=sha256:" + "b" * 64 +
            "\n    # via -r requirements.in\naiohttp==3 \\\n    --hash=sha256:" + "c" * 64 + "\n    # via vllm\n")
    assert suggest.dependents(lock) == {"torch": {"vllm", "unsloth-zoo"}, "aiohttp": {"vllm"}}


def test_requires_dist_keeps_what_applies_to_the_stacks_target(stack_tree: Path) -> None:
    meta = ("Metadata-Version: 2.1\nName: x\nRequires-Dist: torch<2.11; platform_system == 'Linux'\n"
            "Requires-Dist: pywin32; sys_platform == 'win32'\nRequires-Dist: pytest; extra == 'test'\n"
            "Requires-Dist: tomli; python_version < '3.11'\n")
    got = suggest.requires_dist(meta, suggest.marker_env(load_stack("fp8-report")))
    assert [str(r) for r in got] == ['torch<2.11; platform_system == "Linux"']


def test_closure_rejects_what_breaks_a_held_package(searcher: suggest.Searcher) -> None:
    """unsloth 2026.3.12..2026.6.1 declare torch<2.11.0: with vLLM (and so torch 2.11) held they are not
    candidates, and no source needs reading to know it."""
    why = searcher.closure({"unsloth": "2026.4.1"}, {"vllm", "torch"})
    assert isinstance(why, str) and "torch<2.11.0" in why and "held" in why


def test_closure_moves_what_a_release_requires_to_its_closest_fitting_release(searcher: suggest.Searcher) -> None:
    combo = searcher.closure({"unsloth": "2026.7.5"}, {"vllm", "torch"})
    assert not isinstance(combo, str)
    assert combo.versions["unsloth-zoo"] == "2026.7.6"  # the lowest that fits, not the newest
    assert combo.versions["trl"] == "0.24.0" and combo.changed == {"unsloth", "unsloth-zoo"}


def test_closure_moves_dependents_that_pin_a_moved_package(searcher: suggest.Searcher) -> None:
    """vLLM 0.20.0 needs torch 2.10: torch moves down, and torchvision 0.26 (torch==2.11.0) moves with it."""
    combo = searcher.closure({"vllm": "0.20.0"}, set())
    assert not isinstance(combo, str)
    assert combo.versions["torch"] == "2.10.0" and combo.versions["torchvision"] == "0.25.0"
    assert combo.platform is None
    combo = searcher.closure({"vllm": "0.19.1"}, set())
    assert not isinstance(combo, str) and combo.platform == "x86_64-manylinux_2_31"


def _passes_from(searcher: suggest.Searcher, monkeypatch: pytest.MonkeyPatch, package: str, first: str
                 ) -> list[str]:
    """Stand-in probe: passes once `package` is at `first` or later; returns the versions it was asked about."""
    asked: list[str] = []

    def probe(combo: suggest.Combo, only: set[str] | None = None) -> list[ProbeResult]:
        v = combo.versions[package]
        asked.append(v)
        ok = RELEASES[package].index(v) >= RELEASES[package].index(first)
        return [ProbeResult(id=pid, layer="contract", status="pass" if ok else "fail", reason="r")
                for pid in (only or {"contract:x"})]

    monkeypatch.setattr(searcher, "probe", probe)
    return asked


def test_first_passing_gallops_then_bisects_to_the_first_release(searcher: suggest.Searcher,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    RELEASES["many"] = [f"1.{i}" for i in range(100)]
    searcher.base["many"] = "1.0"
    asked = _passes_from(searcher, monkeypatch, "many", "1.37")
    found = searcher.first_passing({}, "many", "contract:x", set(), +1)
    assert found is not None and found[0] == "1.37"
    assert len(asked) <= 14  # 1, 2, 4 ... 64 releases out, then bisect: not 37 probes
    assert searcher.first_passing({}, "many", "contract:x", set(), -1) is None  # nothing older passes


def test_first_passing_skips_releases_the_metadata_rules_out(searcher: suggest.Searcher,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _passes_from(searcher, monkeypatch, "unsloth", "2026.3.12")
    found = searcher.first_passing({}, "unsloth", "contract:x", {"vllm", "torch"}, +1)
    assert found is not None and found[0] == "2026.7.5" and found[1].versions["unsloth-zoo"] == "2026.7.6"
    assert "2026.4.1" not in asked  # rejected by torch<2.11.0 before any probe
    assert any("not a candidate" in t.outcome for t in searcher.trials)


def test_toolkit_follows_torchs_cuda_major_and_release(searcher: suggest.Searcher,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(searcher, "min_toolkit", lambda combo: "12.9")
    combo = suggest.Combo(versions=dict(searcher.base), changed=set(), torch_cuda="13.0")
    # fp8-report pins nvcc 12.8.61 (cu12) beside a cu130 torch: torch's major, at its own CUDA release (nvrtc)
    assert searcher.toolkit_for(combo) == ("nvidia-cuda-nvcc", "13.0.88")
    combo.versions.pop("nvidia-cuda-nvrtc")
    assert searcher.toolkit_for(combo) == ("nvidia-cuda-nvcc", "13.0.48")  # torch's minor, lowest
    combo.torch_cuda = "12.8"
    assert searcher.toolkit_for(combo) == ("nvidia-cuda-nvcc-cu12", "12.9.41")


def test_greedy_takes_the_smallest_move_per_failing_probe(searcher: suggest.Searcher,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe a needs unsloth-zoo >= 2026.6.6; probe b needs unsloth >= 2026.7.5 (which drags zoo to 2026.7.6):
    two moves, trl untouched, each named with the release that decided it."""
    monkeypatch.setattr(suggest, "probe_packages", lambda pid: {"a": {"vllm", "unsloth-zoo"},
                                                                "b": {"unsloth", "unsloth-zoo", "trl"}}[pid[9:]])

    def probe(combo: suggest.Combo, only: set[str] | None = None) -> list[ProbeResult]:
        v = combo.versions
        a = suggest.vkey(v["unsloth-zoo"]) >= suggest.vkey("2026.6.6")
        b = suggest.vkey(v["unsloth"]) >= suggest.vkey("2026.7.5")
        res = [ProbeResult(id="contract:a", layer="contract", status="pass" if a else "fail", reason="r"),
               ProbeResult(id="contract:b", layer="contract", status="pass" if b else "fail", reason="r")]
        return [r for r in res if only is None or r.id in only]

    monkeypatch.setattr(searcher, "probe", probe)
    monkeypatch.setattr(searcher, "toolkit_for", lambda combo: None)
    log: list[str] = []
    combo, _pins = searcher.greedy({}, {"vllm", "torch"}, {"contract:a", "contract:b"}, log)
    assert combo is not None
    assert {n: combo.versions[n] for n in combo.changed} == {"unsloth": "2026.7.5", "unsloth-zoo": "2026.7.6"}
    assert log[0].startswith("contract:a first passes at unsloth-zoo 2026.6.6")
    assert log[1].startswith("contract:b first passes at unsloth 2026.7.5")
    assert "unsloth-zoo 2026.6.6 -> 2026.7.6" not in log[1]  # the pinned floor moved, not a new package


def test_a_skipped_must_pass_probe_is_not_a_pass(searcher: suggest.Searcher) -> None:
    res = [ProbeResult(id="contract:a", layer="contract", status="skip", reason="r"),
           ProbeResult(id="toolchain:b", layer="toolchain", status="skip", reason="r")]
    assert [r.id for r in searcher.failing(res, {"contract:a"})] == ["contract:a"]


def test_distance_counts_packages_then_releases(searcher: suggest.Searcher) -> None:
    combo = suggest.Combo(versions={**searcher.base, "unsloth": "2026.7.5", "unsloth-zoo": "2026.7.6"},
                          changed={"unsloth", "unsloth-zoo"}, toolkit=("nvidia-cuda-nvcc", "13.0.88"))
    assert searcher.distance(combo) == (3, 5 + 2)  # unsloth, zoo and the toolkit slot
    combo.platform = "x86_64-manylinux_2_31"
    assert searcher.distance(combo)[0] == 4


def test_report_json_has_the_issues_schema() -> None:
    s = suggest.Suggestion(rank=1, passes=True, kind="keep vllm", changes={"unsloth": ["2026.3.11", "2026.7.5"]},
                           unchanged={"trl": "0.24.0"}, lock_lines_changed=6, distance={"packages": 1, "releases": 5})
    rep = suggest.SuggestReport(stack="fp8-report", gpu_arch="sm_120", anchor="vllm", must_pass=["contract:a"],
                                suggestions=[s], trials=3, duration_s=1.0)
    data: dict[str, Any] = rep.model_dump(mode="json")
    first = data["suggestions"][0]
    assert {"rank": 1, "passes": True, "changes": {"unsloth": ["2026.3.11", "2026.7.5"]},
            "lock_lines_changed": 6}.items() <= first.items()
    text = suggest.render(rep)
    assert "unsloth" in text and "2026.3.11 -> 2026.7.5" in text and "trl" in text and "(unchanged)" in text


def test_vkey_orders_post_releases_as_pep440_does() -> None:
    """Comparing the numbers alone put 1.0.post1 level with 1.0.1 (both (1, 0, 1))."""
    assert sorted(["1.0.1", "1.0.post1", "1.0"], key=suggest.vkey) == ["1.0", "1.0.post1", "1.0.1"]
    assert suggest.release_distance("x", "1.0", "1.0.1", ["1.0", "1.0.post1", "1.0.1"]) == 2
    assert suggest.release_distance("x", None, "1.0", []) == 1
