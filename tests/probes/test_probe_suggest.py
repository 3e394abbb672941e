"""The --suggest search's pure parts: nearby versions, candidate order, pruning, toolkit fix-up and what
counts as passing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack.host.stacks import load_stack
from rlstack.probes import suggest
from rlstack.probes.model import ProbeResult

VERSIONS = {
    "vllm": ["0.19.0", "0.20.0", "0.21.0", "0.22.0", "0.23.0"],
    "unsloth-zoo": ["2026.5.1", "2026.6.1", "2026.7.1"],
    "unsloth": ["2026.3.10", "2026.3.11", "2026.6.1"],
    "nvidia-cuda-nvcc-cu12": ["12.8.61", "12.8.93", "12.9.41", "12.9.86"],
    "nvidia-cuda-nvcc": ["13.0.48", "13.0.88"],
}


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(suggest, "index_versions", lambda name, max_age_s=0: VERSIONS[name])


def test_nearby_alternates_newer_and_older() -> None:
    assert suggest.nearby(VERSIONS["vllm"], "0.21.0", newer=2, older=1) == ["0.21.0", "0.22.0", "0.20.0", "0.23.0"]
    assert suggest.nearby(VERSIONS["vllm"], "9.9", newer=2, older=1) == ["9.9"]


def test_candidates_start_at_the_lock_and_grow_in_distance(stack_tree: Path, index: None) -> None:
    cands = suggest.candidates(load_stack("fp8-report"))
    assert cands[0].distance == 0 and cands[0].pins == {"vllm": "0.21.0", "unsloth-zoo": "2026.6.1",
                                                        "unsloth": "2026.3.11"}
    assert [c.distance for c in cands] == sorted(c.distance for c in cands)
    # at equal distance the resolver's pick comes first
    d1 = [c for c in cands if c.distance == 1]
    assert None in d1[0].pins.values()


def test_requirements_bound_the_resolvers_pick_below_by_the_lock(stack_tree: Path) -> None:
    stack = load_stack("fp8-report")
    cand = suggest.Candidate(pins={"vllm": None, "unsloth-zoo": "2026.7.1", "unsloth": "2026.3.11"}, distance=2)
    reqs = suggest._requirements(stack, cand, "nvidia-cuda-nvcc==13.0.48")
    assert "vllm>=0.21.0" in reqs and "unsloth-zoo==2026.7.1" in reqs and "nvidia-cuda-nvcc==13.0.48" in reqs
    assert not any(r.startswith("unsloth<=") for r in reqs)


def test_pruning_keeps_only_candidates_that_touch_every_failing_contract() -> None:
    base = suggest.Candidate(pins={"vllm": "0.21.0", "unsloth-zoo": "2026.6.1", "unsloth": "2026.3.11"}, distance=0)
    failing = [{"vllm", "unsloth-zoo"}, {"unsloth", "unsloth-zoo", "trl"}]
    only_vllm = suggest.Candidate(pins={**base.pins, "vllm": "0.22.0"}, distance=1)
    zoo = suggest.Candidate(pins={**base.pins, "unsloth-zoo": "2026.7.1"}, distance=1)
    both = suggest.Candidate(pins={**base.pins, "vllm": "0.22.0", "unsloth": None}, distance=2)
    assert not suggest.can_fix(only_vllm, base, failing)
    assert suggest.can_fix(zoo, base, failing) and suggest.can_fix(both, base, failing)


def test_toolkit_fix_up(index: None) -> None:
    assert suggest.pick_toolkit("12.8", "12.9", "12.8.61", "nvidia-cuda-nvcc-cu12") == ("12.9.41",
                                                                                         "nvidia-cuda-nvcc-cu12")
    assert suggest.pick_toolkit("13.0", "12.9", "12.8.61", "nvidia-cuda-nvcc-cu12") == ("13.0.48", "nvidia-cuda-nvcc")
    assert suggest.pick_toolkit("13.0", "12.9", "12.9.86", "nvidia-cuda-nvcc-cu12") == ("12.9.86",
                                                                                         "nvidia-cuda-nvcc-cu12")


def _r(pid: str, status: str) -> ProbeResult:
    return ProbeResult(id=pid, layer=pid.split(":")[0], status=status, reason="r")  # type: ignore[arg-type]


def test_a_skipped_wall_is_not_a_passed_wall() -> None:
    c = suggest.Candidate(pins={}, distance=1, must_pass={"contract:a"})
    c.results = [_r("resolve:candidate", "pass"), _r("contract:a", "skip")]
    assert not c.passed
    c.results = [_r("resolve:candidate", "pass"), _r("contract:a", "pass"), _r("toolchain:b", "skip")]
    assert c.passed
    c.results = [_r("contract:a", "pass"), _r("toolchain:b", "fail")]
    assert not c.passed


def test_vkey_orders_post_releases_as_pep440_does() -> None:
    """Comparing the numbers alone put 1.0.post1 level with 1.0.1 (both (1, 0, 1))."""
    assert sorted(["1.0.1", "1.0.post1", "1.0"], key=suggest.vkey) == ["1.0", "1.0.post1", "1.0.1"]
    assert suggest.vkey("1.0.post1") < suggest.vkey("1.0.1")
    assert suggest.vkey("2026.3.11") > suggest.vkey("2026.3.10") and suggest.vkey("1.10") > suggest.vkey("1.9")


def test_pinned_top_level_uses_requirement_names(stack_tree: Path) -> None:
    """Names come from packaging's parse (extras, markers, '_' vs '-'), not a split on operator characters."""
    req = stack_tree / "images" / "fp8-report" / "requirements.in"
    line = "Unsloth_Zoo[extra] == 2026.6.1 ; python_version >= '3'"
    req.write_text(req.read_text().replace("unsloth_zoo==2026.6.1", line))
    assert suggest._pinned_top_level(load_stack("fp8-report"))["unsloth-zoo"] == "2026.6.1"
