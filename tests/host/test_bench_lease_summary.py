"""bench/transport/lease_summary.py: a steps-bg folder read back into a few lines, and the plan's rule for a new TUNING
applied to the sweep: > 10 % faster at 64 sequences and no slower at 8 (the same launch, whatever spec the
sweep timed it under)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def _sweep(best64: str, ms64: float, at8: float) -> dict:
    """A sweep's results: the default and one other shape at 8 and 64 sequences (kv 8, 768 slots)."""
    rows = [{"batch": 64, "fill": 466, "spec": "32:8:512:default", "splits": 1, "ms": 2.2, "vs_default": 1.0,
             "ok": True},
            {"batch": 64, "fill": 466, "spec": best64, "splits": 4, "ms": ms64, "vs_default": round(ms64 / 2.2, 3),
             "ok": True},
            {"batch": 8, "fill": 466, "spec": "32:8:512:default", "splits": 8, "ms": 0.6, "vs_default": 1.0,
             "ok": True},
            # at 8, 128-slot blocks give at most 6 splits: 512 and 2048 programs are one launch, timed once under
            # the first spec of the grid's order
            {"batch": 8, "fill": 466, "spec": "128:4:512:2", "splits": 6, "ms": 0.6 * at8, "vs_default": at8,
             "ok": True}]
    return {"default": "block_n=32,num_warps=8,programs=512,num_stages=default,fuse_merge=False",
            "shape": {"kv_heads": 8, "length": 768}, "table": rows,
            "best": {"batch=64,fill=466": {"spec": best64, "ms": ms64, "vs_default": round(ms64 / 2.2, 3)}}}


@pytest.fixture(scope="module")
def summary(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("transport/lease_summary")


def test_a_shape_faster_at_64_and_no_slower_at_8_becomes_the_proposal(summary: ModuleType) -> None:
    lines, spec = summary.sweep_verdict(_sweep("128:4:2048:2", 1.4, 0.95))
    assert spec == "128:4:2048:2"  # found at 8 under 128:4:512:2's row: the same launch there
    assert "Tuning.parse('128:4:2048:2')" in lines[-1]
    assert summary.sweep_verdict(_sweep("128:4:2048:2", 1.4, 1.05))[1] is None  # slower at 8
    assert summary.sweep_verdict(_sweep("128:4:2048:2", 2.1, 0.9))[1] is None  # < 10 % at 64
    lines, spec = summary.sweep_verdict(_sweep("128:2:2048:2", 1.4, 0.9))
    assert spec is None and "not timed (ok) at 8" in lines[-1]  # 2 warps at block_n 128: no row at 8 here


def test_a_steps_folder_reads_back_as_steps_profile_tests_and_sweep(
        tmp_path: Path, run_bench: Callable[..., subprocess.CompletedProcess]) -> None:
    (tmp_path / "steps.json").write_text(json.dumps([
        {"step": 1, "out": "1-fastgen_profile", "rc": 0, "seconds": 400.0},
        {"step": 2, "out": "2-pytest", "rc": 1, "seconds": 80.0},
        {"step": 3, "out": "3-attention_sweep", "rc": None, "note": "not started: past --stop-after 900 s"}]))
    (tmp_path / "1-fastgen_profile").mkdir()
    (tmp_path / "1-fastgen_profile" / "fastgen_profile.json").write_text(json.dumps({"table": [
        {"variant": "", "batch": 64, "wall_ms": 6.8, "prefill_ms": 90.0, "prefilled_rows": 8,
         "pick_parts": {"warp_ms": 0.24, "draw_ms": 0.14, "topk_ms": 0.17, "draw_triton_ms": 0.03,
                        "draw_triton_by_chunks": {"64:8": 0.03, "32:4": 0.021, "128:8": 0.04}}},
        {"variant": "prefill_once=false", "batch": 64, "wall_ms": 7.3, "prefill_ms": 330.0, "prefilled_rows": 64,
         "pick_parts": {"warp_ms": 0.24, "draw_ms": 0.14, "topk_ms": 0.17, "draw_triton_ms": 0.03}}]}))
    (tmp_path / "2-pytest.log").write_text("....F\n1 failed, 17 passed in 80.1s\n")
    proc = run_bench("transport/lease_summary", str(tmp_path), env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "step 3 3-attention_sweep: not started" in out and "step 2 2-pytest: exit 1 in 80.0 s" in out
    assert "[prefill_once=false] batch 64: wall 7.3 ms (+7.4 %); prefill_ms 330.0, prefilled_rows 64" in out
    assert out.count("pick at batch 64: warp_ms 0.24, draw_ms 0.14, draw_triton_ms 0.03; fastest draw launch "
                     "(chunks:warps) 32:4 0.021") == 1  # once a batch
    assert "2-pytest.log: 1 failed, 17 passed" in out and "no attention_sweep.json" in out
    bad = run_bench("transport/lease_summary", str(tmp_path / "nowhere"), env=dict(os.environ))
    assert bad.returncode == 2 and "not a folder" in bad.stderr
