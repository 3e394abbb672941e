"""bench/attention_sweep.py: its grid options refuse what is not a grid, its float32 reference is the attention
the kernel must compute, and its CPU smoke run (Triton's interpreter) writes a row per launch shape and a best
one that computed the right answer."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def sweep(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("torch")
    return load_bench("attention_sweep")


def test_grid_options_take_counts_and_triton_s_default_stages(sweep: ModuleType) -> None:
    assert sweep.ints("8, 64") == [8, 64]
    assert sweep.stage_list("default,2") == [None, 2]
    for bad in ("eight", "0,8", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="e.g. 8,64"):
            sweep.ints(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        sweep.stage_list("fast")


def test_the_reference_attends_over_the_filled_slots_only_each_kv_head_serving_its_group(sweep: ModuleType) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, generator=g)
    k = torch.randn(2, 2, 10, 8, generator=g)
    v = torch.randn(2, 2, 10, 8, generator=g)
    got = sweep.reference(q, k, v, 6)
    k[:, :, 6:], v[:, :, 6:] = float("nan"), float("nan")  # past the fill: never read
    assert torch.equal(sweep.reference(q, k, v, 6), got)
    b, h = 1, 3  # query head 3 belongs to KV head 1 (two query heads a KV head)
    scores = (k[b, 1, :6] @ q[b, h]) / math.sqrt(8)
    torch.testing.assert_close(got[b, h], scores.softmax(0) @ v[b, 1, :6])


@pytest.mark.slow
def test_cpu_smoke_run_writes_a_row_per_shape_and_the_best_right_one(
        tmp_path: Path, run_bench: Callable[..., subprocess.CompletedProcess]) -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "RLSTACK_BENCH_SMOKE": "1", "OUT": str(tmp_path)}
    proc = run_bench("attention_sweep", "--block-n", "32,64", "--warps", "4", "--programs", "512,2048",
                     "--stages", "default", "--reps", "2", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(Path("/tmp/rlstack-bench-smoke/attention_sweep.json").read_text())
    (matmul,) = [r for r in data["rows"] if r["tuning"] == "matmul (every slot)"]  # the baseline, one a batch
    assert matmul["ms"] > 0 and matmul["fill"] == matmul["length"] and "ok" not in matmul
    rows = [r for r in data["rows"] if r is not matmul]
    assert rows[0]["tuning"] == data["extra"]["default"] and rows[0]["vs_default"] == 1  # the engine's shape first
    assert {r["tuning"].split(",")[0] for r in rows} == {"block_n=32", "block_n=64"}  # fused ones too
    # the tiny cache has at most two blocks, so 512 and 2048 programs give the same splits: timed once
    assert not [r for r in rows if "programs=2048" in r["tuning"]] and "not timed again" in proc.stdout
    # after the grid, its fastest shapes (here both, the default among them) again with the kernel merging
    fused = [r for r in rows if r["tuning"].endswith("fuse_merge=True")]
    assert {r["tuning"].replace("fuse_merge=True", "fuse_merge=False") for r in fused} == {
        r["tuning"] for r in rows if r not in fused}
    assert all(r["ok"] and r["max_err"] < 2e-2 and r["ms"] > 0 and r["kernel_ms"] > 0 for r in rows)
    assert set(data["extra"]["best"]) == {"batch=2,fill=40"} and data["extra"]["best"]["batch=2,fill=40"]["tuning"] in {
        r["tuning"] for r in rows}
