"""bench/transport/plan_calls.py: every part travels once, no call is over the budget, small files share calls with
big parts, the extra paths go first, only the last export's manifest and spec travel, and a part that can never
fit is refused with what to do."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def _export(folder: Path, parts: dict[str, int], last: bool = True) -> Path:
    folder.mkdir(parents=True)
    for name, n in parts.items():
        (folder / name).write_bytes(b"x" * n)
    (folder / "parts.json").write_text(json.dumps({"parts": list(parts)}))
    (folder / "rootfs-manifest.json.gz").write_bytes(b"m" * 30)
    (folder / "rootfs-spec.json").write_text("{}")
    return folder


def test_parts_are_packed_first_fit_under_the_budget_extras_first(
        load_bench: Callable[[str], ModuleType], tmp_path: Path) -> None:
    plan_calls = load_bench("transport/plan_calls")
    a = _export(tmp_path / "a", {"part-000": 90, "part-001": 60, "part-002": 15})
    b = _export(tmp_path / "b", {"part-000": 35})
    extra = tmp_path / "models"
    extra.mkdir()
    (extra / "half").write_bytes(b"w" * 70)
    calls = plan_calls.plan([a, b], [extra], budget=100)
    carried = [Path(p) for c in calls for p in c["carry"]]
    assert calls[0]["carry"][0] == str(extra) and str(extra) in calls[0]["stash"]
    assert all(sum(plan_calls.size(Path(p)) for p in c["carry"]) <= 100 for c in calls)
    assert sorted(carried) == sorted({*carried})  # each once
    parts = {p for p in carried if p.name.startswith("part-")}
    assert parts == {a / "part-000", a / "part-001", a / "part-002", b / "part-000"}
    assert (b / "rootfs-manifest.json.gz") in carried and (a / "rootfs-manifest.json.gz") not in carried
    assert {a / "parts.json", b / "parts.json"} <= set(carried)
    # 70 + 90 + 60 + 15 + 35 + small files: first-fit fills the extra's call and the 60-part's instead of opening more
    assert len(calls) == 4
    for c in calls:  # every export a call carries something of is stashed in that call
        held = {str(Path(p).parent) for p in c["carry"] if Path(p).parent in (a, b)}
        assert held <= set(c["stash"])


def test_a_part_over_the_budget_is_refused(load_bench: Callable[[str], ModuleType], tmp_path: Path) -> None:
    plan_calls = load_bench("transport/plan_calls")
    a = _export(tmp_path / "a", {"part-000": 120})
    with pytest.raises(SystemExit, match="export again with smaller parts"):
        plan_calls.plan([a], [], budget=100)
    with pytest.raises(SystemExit, match="no parts.json"):
        plan_calls.plan([tmp_path], [], budget=100)


def test_a_call_carries_at_most_the_tools_path_count(load_bench: Callable[[str], ModuleType], tmp_path: Path) -> None:
    """Many small files (one parts.json an export) fit one call's bytes, not its path count: they spill over."""
    plan_calls = load_bench("transport/plan_calls")
    exports = [_export(tmp_path / f"e{i}", {"part-000": 1}) for i in range(6)]
    calls = plan_calls.plan(exports, [], budget=10_000)
    assert all(len(c["carry"]) <= plan_calls.MAX_PATHS for c in calls)
    assert sum(len(c["carry"]) for c in calls) == 6 * 2 + 2 and len(calls) == 2


def test_the_tree_is_what_git_carries_at_its_size_on_disk(
        load_bench: Callable[[str], ModuleType], tmp_path: Path) -> None:
    """Tracked and untracked-not-ignored files count, in whole blocks; ignored ones and a tracked file deleted from
    the tree do not."""
    import subprocess

    plan_calls = load_bench("transport/plan_calls")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / ".gitignore").write_text("/.stage/\n")
    (tmp_path / "tracked").write_bytes(b"t" * 10_000)
    (tmp_path / "gone").write_bytes(b"g" * 50_000)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    (tmp_path / "gone").unlink()
    (tmp_path / "new").write_bytes(b"n" * 3_000)
    (tmp_path / ".stage").mkdir()
    (tmp_path / ".stage" / "part-000").write_bytes(b"p" * 500_000)
    got = plan_calls.tree_bytes(tmp_path)
    files = [tmp_path / n for n in (".gitignore", "tracked", "new")]
    assert got == sum(max(f.stat().st_size, f.stat().st_blocks * 512) for f in files)
    assert sum(f.stat().st_size for f in files) <= got < 50_000
