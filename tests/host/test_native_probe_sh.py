"""bench/native_probe.sh stash: carrying parts to the device machine one call at a time, a machine released in
between (idle past 30 s) starts empty; the stash line names the parts that are missing, so they are carried again
instead of failing the install minutes later."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "native_probe.sh"


def _stash(work: Path, stash: Path) -> str:
    proc = subprocess.run(["bash", str(SCRIPT), "stash", "x"], cwd=work, capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", "STASH": str(stash), "OUT": str(work / "out")})
    return proc.stdout.strip()


def test_stash_names_the_parts_still_missing(tmp_path: Path) -> None:
    stage = tmp_path / ".stage" / "x"
    stage.mkdir(parents=True)
    (stage / "parts.json").write_text(json.dumps({"parts": [{"name": f"part-00{i}", "size": 1} for i in range(3)]}))
    (stage / "part-001").write_bytes(b"1")
    assert _stash(tmp_path, tmp_path / "stash") == "stash x: 1 parts here; missing: part-000 part-002"
    (stage / "part-001").unlink()
    for i in (0, 2):
        (stage / f"part-00{i}").write_bytes(b"1")
    assert _stash(tmp_path, tmp_path / "stash") == "stash x: 3 parts here"
    (stage / "part-002").write_bytes(b"22")  # a stale part of another lock, same name
    assert _stash(tmp_path, tmp_path / "stash") == "stash x: 3 parts here; missing: part-002"


def test_stash_copies_only_the_parts_it_does_not_have(tmp_path: Path) -> None:
    """The device keeps every part carried so far in the tree: copying them all again grew each call."""
    import os

    stage = tmp_path / ".stage" / "x"
    stage.mkdir(parents=True)
    (stage / "parts.json").write_text(json.dumps({"parts": [{"name": f"part-00{i}", "size": 1} for i in range(2)]}))
    (stage / "part-000").write_bytes(b"1")
    stash = tmp_path / "stash"
    _stash(tmp_path, stash)
    os.utime(stash / "x" / "part-000", (1_000_000_000, 1_000_000_000))
    (stage / "part-001").write_bytes(b"1")
    assert _stash(tmp_path, stash) == "stash x: 2 parts here"
    assert (stash / "x" / "part-000").stat().st_mtime == 1_000_000_000  # not copied again
