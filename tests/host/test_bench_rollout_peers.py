"""bench/rollout_peers.py's merge: the targets come from the rows of one run id, an engine timed at one batch does
not read as measured at another, and the merged header is the measuring machine's, not the host's."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from rlstack.core import results


@pytest.fixture(scope="module")
def peers(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("rollout_peers")


def _row(engine: str, batch: int, tps: float, loader: str = "vllm", **extra: object) -> dict:
    return {"engine": engine, "batch": batch, "tokens_per_s": tps, "loader": loader, "quant": "bf16",
            "run_id": "r1", **extra}


def test_targets_compare_the_unsloth_loaded_fastgen_with_vllm_bf16(peers: ModuleType) -> None:
    rows = [_row("vllm-bf16", 8, 2000.0), _row("vllm-bf16", 64, 12000.0),
            _row("fastgen", 8, 1600.0, loader="unsloth", fraction_of_floor=0.4),
            _row("fastgen", 64, 11000.0, loader="transformers")]  # not the default loader: not the target's row
    got = {g["target"].split(">=")[1].strip(): g for g in peers.targets(rows)}
    at8 = got["1.0x vLLM bf16 at 8"]
    assert at8["value"] == pytest.approx(0.8) and at8["met"] is False
    assert got["0.9x vLLM bf16 at 64"]["met"] is None  # no unsloth-loaded fastgen row at 64
    assert got["60 % of the floor at 8"]["value"] == pytest.approx(0.4)


def test_batches_measured_names_what_each_engine_was_timed_at(peers: ModuleType) -> None:
    rows = [_row("trl-default", 8, 66.0, loader="transformers"), _row("vllm-bf16", 8, 2000.0),
            _row("vllm-bf16", 64, 12000.0), _row("trl-paged", 64, 0.0, loader="transformers", error="killed")]
    said = peers.batches_measured(rows)
    assert "trl-default (transformers, bf16) 8" in said and "vllm-bf16 (vllm, bf16) 8/64" in said
    assert "trl-paged" not in said  # a row without a measurement is not a measurement


def _engine_file(path: Path, gpu: dict, rows: list[dict]) -> None:
    path.write_text(json.dumps({"date": "2026-12-04T15:00:00Z", "gpu": gpu, "versions": {"torch": "2.11"},
                                "engine_versions": {}, "host": "device", "rows": rows}))


Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def merge(run_bench: Run) -> Run:
    env = {**os.environ, "RLSTACK_BENCH_SMOKE": "1"}  # results go to /tmp only
    return lambda *args: run_bench("rollout_peers", "merge", *args, env=env, timeout=120)


def test_merge_takes_the_measuring_machine_and_blanks_vllms_unseen_peak(tmp_path: Path, merge: Run) -> None:
    _engine_file(tmp_path / "fp8-vllm-bf16.json", {"cuda": True, "name": "NVIDIA H200"},
                 [_row("vllm-bf16", 8, 2000.0, peak_gib=0.0)])
    _engine_file(tmp_path / "portable-fastgen.json", {"cuda": True, "name": "NVIDIA H200"},
                 [_row("fastgen", 8, 1600.0, loader="unsloth", peak_gib=10.7)])
    proc = merge(str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = results.read(Path("/tmp/rlstack-bench-smoke/rollout_peers.json"))
    assert out.where.gpu == "NVIDIA H200" and out.date == "2026-12-04T15:00:00Z"
    assert "versions" not in out.extra  # the host's versions say nothing about the engines; each file keeps its own
    peaks = {r["engine"]: r["peak_gib"] for r in out.rows}
    assert peaks == {"vllm-bf16": None, "fastgen": 10.7}


def test_merge_refuses_rows_of_two_leases_without_a_run_id(tmp_path: Path, merge: Run) -> None:
    _engine_file(tmp_path / "a.json", {"cuda": True}, [_row("vllm-bf16", 8, 2000.0)])
    _engine_file(tmp_path / "b.json", {"cuda": True}, [{**_row("fastgen", 8, 1600.0), "run_id": "r2"}])
    proc = merge(str(tmp_path))
    assert proc.returncode != 0 and "pick one with --run-id" in proc.stderr
    assert merge(str(tmp_path), "--run-id", "r2").returncode == 0
    data = results.read(Path("/tmp/rlstack-bench-smoke/rollout_peers.json")).extra
    assert [m["file"] for m in data["engine_files"]] == ["b.json"]  # the other lease's file lends nothing


def test_merge_under_another_name_leaves_the_full_table(tmp_path: Path, merge: Run) -> None:
    """A lease that measured only the targets' pair writes its own table: the full one (every engine in one run
    id, issue 14's done-when) is not replaced by two engines."""
    full = Path("/tmp/rlstack-bench-smoke/rollout_peers.json")
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text('{"kept": true}')
    _engine_file(tmp_path / "fp8-vllm-bf16.json", {"cuda": True}, [_row("vllm-bf16", 8, 2000.0)])
    _engine_file(tmp_path / "portable-fastgen.json", {"cuda": True},
                 [_row("fastgen", 8, 1900.0, loader="unsloth", fraction_of_floor=0.47)])
    proc = merge(str(tmp_path), "--name", "rollout_peers_pair")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(full.read_text()) == {"kept": True}
    pair = results.read(Path("/tmp/rlstack-bench-smoke/rollout_peers_pair.json")).extra
    at8 = next(g for g in pair["targets"] if g["target"].endswith("vLLM bf16 at 8"))
    assert at8["value"] == pytest.approx(0.95) and at8["met"] is False


def test_targets_count_only_the_default_paths_rows(peers: ModuleType) -> None:
    """A fastgen row measured with engine options (`options`, e.g. attend_bucket=256) is not the default path:
    the targets skip it, so an option under test cannot meet (or miss) a target in the default's name."""
    rows = [_row("vllm-bf16", 8, 2000.0),
            _row("fastgen", 8, 2100.0, loader="unsloth", options="attend_bucket=256", fraction_of_floor=0.7),
            _row("fastgen", 8, 1900.0, loader="unsloth", fraction_of_floor=0.45)]
    at8 = next(g for g in peers.targets(rows) if g["target"].endswith("vLLM bf16 at 8"))
    assert at8["value"] == pytest.approx(0.95) and at8["met"] is False
    floor = next(g for g in peers.targets(rows) if "floor" in g["target"])
    assert floor["value"] == pytest.approx(0.45)


def test_engine_options_go_to_their_own_file_and_only_to_fastgen(peers: ModuleType, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import common

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(common, "header", lambda: {"date": "2026-12-04T19:00:00Z"})
    monkeypatch.setattr(peers, "engine_versions", lambda: {})
    res = peers.Result("fastgen", "portable", "r1", {"attend_bucket": 256})
    res.add({"batch": 8, "tokens_per_s": 1.0})
    default = peers.Result("fastgen", "portable", "r1")
    assert res.path.name == "portable-fastgen-attend_bucket-256.json" and default.path.name == "portable-fastgen.json"
    assert json.loads(res.path.read_text())["rows"][0]["options"] == "attend_bucket=256"
    # a name the device tool brings back (it leaves out "=" and ":"); the row keeps the options as given
    shape = peers.Result("fastgen", "portable", "r1", {"attention_tuning": "32:2:512:default", "fp8": "row"})
    assert shape.path.name == "portable-fastgen-attention_tuning-32_2_512_default_fp8-row.json"
    assert shape.options == "attention_tuning=32:2:512:default,fp8=row"
    with pytest.raises(SystemExit, match="apply to the fastgen engine"):
        peers.main(["one", "vllm-bf16", "--stack", "fp8", "--engine-option", "attend_bucket=256"])


def test_fastgen_variants_share_one_loaded_model_and_each_get_a_fresh_engine(
        peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`one fastgen --variant '' --variant fp8=row`: the model is loaded once (the first variant's run loads it,
    the next reuses it), the last variant's engine is dropped before the next is built, and each variant's rows
    go to their own file (the default path's to the plain one)."""
    from types import SimpleNamespace

    import common
    from rlstack.payload import fastgen

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(common, "header", lambda: {"date": "2026-12-04T23:00:00Z"})
    monkeypatch.setattr(peers, "engine_versions", lambda: {})
    monkeypatch.setattr(peers, "_prepared", lambda: ("r1", {}))
    loaded = SimpleNamespace(model=object())
    calls: list[tuple] = []
    dropped: list[str] = []

    def run_hf(res, a, batches, ceilings, given=None):
        calls.append((res.options, given))
        res.add({"batch": batches[0], "tokens_per_s": 1.0})
        return given if given is not None else loaded

    monkeypatch.setattr(peers, "run_hf", run_hf)
    monkeypatch.setattr(fastgen, "uninstall", lambda model: dropped.append("uninstall"))
    monkeypatch.setattr(fastgen, "release", lambda model: dropped.append("release"))
    assert peers.main(["one", "fastgen", "--stack", "portable", "--batches", "8", "--variant", "",
                       "--variant", "fp8=row"]) == 0
    assert calls == [(None, None), ("fp8=row", loaded)] and dropped == ["uninstall", "release"]
    out = tmp_path / "rollout_peers"
    assert (out / "portable-fastgen.json").exists() and (out / "portable-fastgen-fp8-row.json").exists()
