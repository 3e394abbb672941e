"""bench/transport/native_probe.sh stash: carrying parts to the device machine one call at a time, a machine released in
between (idle past 30 s) starts empty; the stash line names the parts that are missing, so they are carried again
instead of failing the install minutes later."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "transport" / "native_probe.sh"


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


def _sh(work: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "STASH": str(work / "stash"), "OUT": str(work / "out"),
            "SITE": str(work / "site"), "SITE_READY": "1"}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=work, capture_output=True, text=True,
                          env=base | env)


def _lease(tmp: Path, lock: str) -> Path:
    """A fresh device machine's layout: the stack's parts.json stashed (its lock), the site installed."""
    (tmp / "stash" / "x").mkdir(parents=True)
    (tmp / "stash" / "x" / "parts.json").write_text(json.dumps({"lock_hash": lock, "parts": []}))
    (tmp / "site").mkdir()
    return tmp


def _keep(tmp: Path) -> list[Path]:
    """keep-cache on one machine until the last call, each call's $OUT copied to .stage/kernel-cache/x as the host
    does with the files that come back; returns what reached the host."""
    import os
    import shutil

    host = tmp / "host" / ".stage" / "kernel-cache" / "x"
    host.mkdir(parents=True)
    call = 0
    while True:
        out = tmp / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        proc = _sh(tmp, "keep-cache", "x", str(call), KC_CHUNK="2K")
        assert proc.returncode == 0, proc.stderr
        assert len(os.listdir(out)) <= 4  # the manifest and 3 chunks: under the 8 files a call brings back
        for f in out.iterdir():
            shutil.copy(f, host)
        if "that was the last call" in proc.stdout:
            return sorted(host.iterdir())
        assert f"next: keep-cache x {call + 1}" in proc.stdout
        call += 1


def test_compiled_kernels_travel_to_the_next_lease_newer_than_the_wheels_they_came_from(tmp_path: Path) -> None:
    """What one lease compiled (FlashInfer's JIT, torch.compile) comes back in chunks and is unpacked on the next
    machine after its wheels: FlashInfer runs ninja on every load, which rebuilds an output older than an input or
    than its time in .ninja_log, so the files keep their times to the nanosecond and the wheels just installed
    are dated back before them."""
    import os

    first = _lease(tmp_path / "a", "ab" * 32)
    cache = first / "stash" / "kernel-cache-x" / "native" / "flashinfer" / "cached_ops" / "sampling"
    cache.mkdir(parents=True)
    (cache / "sampling.so").write_bytes(os.urandom(7000))  # incompressible: several 2 KiB chunks, two calls
    built_ns = 1_764_000_000_123_456_789
    os.utime(cache / "sampling.so", ns=(built_ns, built_ns))
    carried = _keep(first)
    assert [p.name for p in carried if p.suffix == ".sha256"] == [f"kc-x-{'ab' * 6}.sha256"]
    assert len(carried) > 4  # more than one call's worth

    second = _lease(tmp_path / "b", "ab" * 32)
    header = second / "site" / "flashinfer" / "data" / "include" / "sampling.cuh"
    header.parent.mkdir(parents=True)
    header.write_text("installed in this lease")
    (second / ".stage").symlink_to(first / "host" / ".stage")
    (second / ".stage" / "x").mkdir(exist_ok=True)
    (second / ".stage" / "x" / "parts.json").write_text(json.dumps({"lock_hash": "ab" * 32, "parts": []}))
    stash = _sh(second, "stash", "x")
    assert stash.returncode == 0, stash.stderr
    assert f"kernel cache kc-x-{'ab' * 6}.sha256" in stash.stdout and "missing" not in stash.stdout
    run = _sh(second, "py", "x", "-c", "pass")
    assert run.returncode == 0, run.stderr
    assert "kernel cache restored" in run.stdout
    got = second / "stash" / "kernel-cache-x" / "native" / "flashinfer" / "cached_ops" / "sampling" / "sampling.so"
    assert got.read_bytes() == (cache / "sampling.so").read_bytes()
    assert got.stat().st_mtime_ns == built_ns
    assert header.stat().st_mtime_ns < built_ns
    assert "restored" not in _sh(second, "py", "x", "-c", "pass").stdout  # once a machine


def test_a_kernel_cache_of_another_lock_or_with_a_chunk_missing_is_not_unpacked(tmp_path: Path) -> None:
    import os

    first = _lease(tmp_path / "a", "cd" * 32)
    (first / "stash" / "kernel-cache-x" / "k").mkdir(parents=True)
    (first / "stash" / "kernel-cache-x" / "k" / "m.so").write_bytes(os.urandom(5000))
    carried = _keep(first)

    other = _lease(tmp_path / "b", "ef" * 32)  # the stack was staged again at another lock
    (other / "stash" / "kc-in-x").mkdir()
    for f in carried:
        (other / "stash" / "kc-in-x" / f.name).write_bytes(f.read_bytes())
    run = _sh(other, "py", "x", "-c", "pass")
    assert "not used" in run.stdout and "another lock" in run.stdout
    assert not (other / "stash" / "kernel-cache-x" / "k").exists()

    same = _lease(tmp_path / "c", "cd" * 32)
    (same / "stash" / "kc-in-x").mkdir()
    chunks = [f for f in carried if f.suffix != ".sha256"]
    for f in carried:
        if f != chunks[1]:
            (same / "stash" / "kc-in-x" / f.name).write_bytes(f.read_bytes())
    run = _sh(same, "py", "x", "-c", "pass")
    assert run.returncode == 0
    assert "chunks missing or damaged" in run.stdout and chunks[1].name in run.stdout
    assert not (same / "stash" / "kernel-cache-x" / "k").exists()


def test_keep_cache_refuses_a_call_number_past_the_last(tmp_path: Path) -> None:
    lease = _lease(tmp_path, "12" * 32)
    (lease / "stash" / "kernel-cache-x").mkdir()
    (lease / "stash" / "kernel-cache-x" / "f").write_text("x")
    (lease / "out").mkdir()
    assert _sh(lease, "keep-cache", "x", "0").returncode == 0
    bad = _sh(lease, "keep-cache", "x", "5")
    assert bad.returncode == 2 and "calls 0..0" in bad.stderr
    assert _sh(lease, "keep-cache", "x", "one").returncode == 2
    assert "nothing compiled" in _sh(lease, "keep-cache", "y", "0").stderr
    missing = _sh(lease, "keep-cache", "x", "0", "no-such-folder")  # a typo in a DIR: nothing half-packed
    assert missing.returncode == 1 and "packing failed" in missing.stderr
    assert not (lease / "stash" / "kc-out-x").exists()


def test_the_cache_verb_stashes_and_unpacks_for_a_job_with_wheels_of_its_own(tmp_path: Path) -> None:
    """fastgen_fidelity_device.sh installs its own few wheels (no parts, no lock): `cache` alone brings the
    carried chunks in and unpacks them, once."""
    import os

    first = _lease(tmp_path / "a", "nolock")
    (first / "stash" / "kernel-cache-x" / "inductor").mkdir(parents=True)
    (first / "stash" / "kernel-cache-x" / "inductor" / "step.py").write_bytes(os.urandom(3000))
    (first / "stash" / "x" / "parts.json").unlink()  # as for the fidelity job: no stack parts at all
    _keep(first)
    second = tmp_path / "b"
    (second / "site").mkdir(parents=True)
    (second / ".stage").symlink_to(first / "host" / ".stage")
    got = _sh(second, "cache", "x")
    assert got.returncode == 0, got.stderr
    assert "kernel cache kc-x-nolock.sha256" in got.stdout and "restored" in got.stdout
    assert (second / "stash" / "kernel-cache-x" / "inductor" / "step.py").read_bytes() == \
        (first / "stash" / "kernel-cache-x" / "inductor" / "step.py").read_bytes()
    assert "restored" not in _sh(second, "cache", "x").stdout
