"""bench/fastgen_profile.py: its GEMM part times every weight the bandwidth floor counts (so "gemm" and "floor"
speak of the same bytes), and its CPU smoke run produces every part that applies without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def profile(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("transformers")
    return load_bench("fastgen_profile")


def test_the_gemms_cover_every_weight_of_the_floor_but_the_norms(profile: ModuleType) -> None:
    import common

    cfg = common.qwen3_4b_config(**common.QWEN3_4B)
    proj = sum(n * k * count for n, k, count in profile.projection_shapes(cfg).values())
    floor = common.decode_floor(cfg, 8, 150, 512, 4e12)["params"]
    norms = cfg.num_hidden_layers * (2 * cfg.hidden_size + 2 * cfg.head_dim) + cfg.hidden_size
    assert floor - proj == norms
    assert profile.projection_shapes(cfg)["lm_head"] == (151936, 2560, 1)  # tied: read once, as the lm_head


def test_the_fused_shapes_hold_exactly_the_weights_they_replace(profile: ModuleType) -> None:
    """fusion_saving compares q+k+v and gate+up with one GEMM each: the same bytes, or the saving is not one."""
    import common

    cfg = common.qwen3_4b_config(**common.QWEN3_4B)
    sep, fused = profile.projection_shapes(cfg), profile.fused_shapes(cfg)

    def size(shapes: dict, names: tuple) -> int:
        return sum(shapes[n][0] * shapes[n][1] * shapes[n][2] for n in names)

    assert size(fused, ("qkv_fused",)) == size(sep, ("q_proj", "k_proj", "v_proj"))
    assert size(fused, ("gate_up_fused",)) == size(sep, ("gate_proj", "up_proj"))
    assert all(fused[n][1] == sep["q_proj"][1] for n in fused)  # both read the hidden state


def test_a_variant_whose_compiled_step_failed_is_not_timed_eager(profile: ModuleType,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """fastgen falls back to eager decoding when its compiled step fails to build; the profile then stops the
    variant after the one generation that found out, instead of timing eager decoding (2026-12-04: flex
    attention's fallback ran at ~300 ms a token and took most of a lease)."""
    from types import SimpleNamespace

    from rlstack.payload import fastgen

    calls: list[tuple] = []

    class Fallen:
        compile_error = "InductorError: CompilationError at 74:20 ... the reason at the end"

        def generate(self, *args: object) -> None:
            calls.append(args)

    monkeypatch.setattr(fastgen, "get_engine", lambda pm, **options: Fallen())
    monkeypatch.setattr(fastgen, "sampling_from_generation_config", lambda gc, pm: (None, None))
    monkeypatch.setattr(profile.rg, "tokenize", lambda tok, prompts, n: {"input_ids": [0] * 8, "attention_mask": []})
    pm = SimpleNamespace(get_base_model=lambda: SimpleNamespace(config=None))
    with pytest.raises(profile.CompiledPathFailed, match="the reason at the end"):
        profile.profile_batch(pm, None, None, 8, 16, {}, 3, {})
    assert len(calls) == 1


def test_shape_timings_are_measured_once_a_process_and_handed_out_as_copies(profile: ModuleType) -> None:
    """Variants share the GEMM, pick and attention timings of a shape (they do not depend on the engine), and a
    row that edits its copy (gemm_columns adds fields, fp8 swaps a time) leaves the next row's alone."""
    calls: list[int] = []

    def measure() -> dict:
        calls.append(1)
        return {"o_proj": {"ms": 0.4}}

    first = profile.once(("test-gemms", 8), measure)
    first["o_proj"]["ms"] = 0.25
    again = profile.once(("test-gemms", 8), measure)
    assert calls == [1] and again == {"o_proj": {"ms": 0.4}}
    profile.once(("test-gemms", 64), measure)
    assert calls == [1, 1]


@pytest.mark.slow
def test_cpu_smoke_run_writes_the_parts_that_apply(tmp_path: Path,
                                                   run_bench: Callable[..., subprocess.CompletedProcess]) -> None:
    env = {**os.environ, "RLSTACK_BENCH_SMOKE": "1", "OUT": str(tmp_path)}
    proc = run_bench("fastgen_profile", "--batches", "2", "--attention-lengths", "32,64",
                     "--variant", "fuse_projections=false", "--variant", "", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(Path("/tmp/rlstack-bench-smoke/fastgen_profile.json").read_text())
    row, fused = data["rows"]
    assert (row["variant"], fused["variant"]) == ("fuse_projections=false", "")
    # a fresh engine per variant; the default fuses, and the GEMM sum follows it
    assert row["fused_gemms_saved"] == 0 and fused["fused_gemms_saved"] > 0
    assert fused["gemm_fused"] and not row["gemm_fused"]
    assert row["batch"] == 2 and row["wall_ms"] > 0 and row["sampling_ms"] > 0 and row["gemm_ms"] > 0
    assert row["prefill_share_ms"] > 0 and row["prefill_ms"] > 0  # one-token generates, spread over the run
    assert 0 < row["refresh_ms"] < row["prefill_ms"]  # the merge alone, part of every generate's fixed cost
    assert {"warp_ms", "draw_ms", "topk_ms", "topk_two_stage_ms"} <= set(row["pick_parts"]) and all(
        v > 0 for v in row["pick_parts"].values())  # the smoke recipe's top-k 50 is below its vocabulary
    assert "draw_triton_ms" not in row["pick_parts"]  # draw="triton"'s kernels are timed on CUDA only
    assert row["attention_ms"] > 0 and row["cache_len"] >= row["prompt_len"] + 16
    assert set(row["attention_by_length"]) == {"32", "64"} and all(v > 0 for v in row["attention_by_length"].values())
    assert isinstance(row["fusion_saving_ms"], float) and "qkv_fused" in row["gemm_parts"]
    assert row["gemm_forms"] == {}  # the other GEMM forms are CUDA calls: nothing to time on a CPU
    assert "replay_ms" not in row and "no captured graph" in row["replay_note"]  # no CUDA graph on a CPU
    assert not (tmp_path / "fastgen_profile.json").exists()  # smoke numbers never travel as results


def test_rewind_sets_back_what_a_replay_advances(profile: ModuleType) -> None:
    """A replay advances the static cache's write position (transformers 5 keeps it per layer) and the decode
    loop's state (token index, position, slot): after a generate they stand past the prompt, and the rewinder sets
    them back to the first decode step, so the profile's replays stay inside the cache and the token buffer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rlstack.payload import fastgen

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg).eval()
    eng = fastgen.FastGenerator(model)
    ids = torch.randint(1, 64, (2, 5))
    eng.generate(ids, torch.ones_like(ids), 6, fastgen.Sampling(do_sample=False))
    (key,) = eng._caches
    lengths = eng._lengths(eng._caches[key][0])
    loop = eng._loops[key]
    assert int(loop.k) == 6 and int(loop.slot) == 5 + 5  # the loop's state ran along: six picks after the prompt
    rewind = profile.rewinder(eng, *key, 5)
    rewind()
    assert int(loop.k) == 1 and int(loop.slot) == 5 and torch.equal(loop.pos, torch.full((2, 1), 5))
    if lengths:  # transformers 5: the write position lives in each layer (4.x writes at the loop's slot)
        assert len(lengths) == cfg.num_hidden_layers and all(int(t) == 5 for t in lengths)


def test_replays_of_a_step_that_reads_the_filled_slots_start_at_the_generations_mean_fill(
        profile: ModuleType) -> None:
    assert profile.replay_start(210, 512, 768, reads_filled=False) == 210  # the matmuls read every slot anyway
    start = profile.replay_start(210, 512, 768, reads_filled=True)
    assert start + 32 // 2 == 210 + 512 // 2  # a 32-replay chunk from there averages the mean fill, 466
    assert profile.replay_start(700, 512, 768, reads_filled=True) == 768 - 33  # a chunk stays inside the cache
    assert profile.replay_start(150, 16, 768, reads_filled=True) == 150  # never before the prompt's end


def test_the_two_stage_top_k_gives_the_one_stage_threshold(profile: ModuleType) -> None:
    """Exact, ties and a vocabulary that the chunks do not divide included: only then is its timing a choice."""
    import torch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1001, generator=g).round(decimals=1)  # rounded: many equal values
    logits[1, :] = 0.25  # a row of one value
    logits[2, 900:] = float("-inf")
    for k in (1, 7, 50):
        expect = torch.topk(logits, k, dim=-1).values[..., -1:]
        for chunks in (1, 3, 64):
            assert torch.equal(profile.two_stage_kth(logits, k, chunks), expect), (k, chunks)


def test_top_kernels_sums_each_name_per_replay(profile: ModuleType) -> None:
    from types import SimpleNamespace as K

    events = [K(name="gemm_a", device_time_total=10.0), K(name="gemm_a", device_time_total=12.0),
              K(name="rms_norm", device_time_total=3.0), K(name="gemm_a", device_time_total=10.0),
              K(name="gemm_a", device_time_total=12.0), K(name="rms_norm", device_time_total=3.0)]
    top = profile.top_kernels(events, reps=2, n=1)
    assert top == [{"name": "gemm_a", "count": 2.0, "us": 22.0}]
    assert [r["name"] for r in profile.top_kernels(events, reps=2)] == ["gemm_a", "rms_norm"]


def test_a_fused_engines_gemm_sum_takes_the_fused_shapes(profile: ModuleType) -> None:
    """The step's GEMM sum follows the engine: a fused engine's q/k/v and gate/up are the fused shapes' times, so
    its `rest` is not short by the saving (the 2026-12-04 A/B first read -0.02 ms, then 0.47 after the fix)."""
    def part(n: int, ms: float) -> dict[str, float]:
        return {"n": n, "k": 4, "per_step": 2, "ms": ms}

    parts = {"q_proj": part(8, 1.0), "k_proj": part(2, 0.5), "v_proj": part(2, 0.5), "o_proj": part(4, 0.7),
             "gate_proj": part(16, 2.0), "up_proj": part(16, 2.0), "down_proj": part(4, 1.5),
             "lm_head": part(32, 0.3), "qkv_fused": part(12, 1.2), "gate_up_fused": part(32, 3.0)}
    apart = profile.gemm_columns({k: dict(v) for k, v in parts.items()}, 8, 1e6, fused=False)
    fused = profile.gemm_columns({k: dict(v) for k, v in parts.items()}, 8, 1e6, fused=True)
    assert apart["gemm_ms"] == 8.5 and fused["gemm_ms"] == 1.2 + 0.7 + 3.0 + 1.5 + 0.3
    assert apart["fusion_saving_ms"] == fused["fusion_saving_ms"] == round(8.5 - 6.7, 4)
    # the same weight bytes either way: the fused step reads them faster
    assert fused["gemm_bandwidth_fraction"] > apart["gemm_bandwidth_fraction"]
    row = {"replay_ms": 10.0, "attention_ms": 1.0, **fused}
    profile.derive_rest(row)
    assert row["rest_ms"] == round(10.0 - 6.7 - 1.0, 4)


def test_rederive_recomputes_the_sums_and_keeps_the_timings(profile: ModuleType, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import common

    parts = {name: {"n": 4, "k": 4, "per_step": 1, "ms": 1.0} for name in
             ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")}
    parts |= {"qkv_fused": {"n": 12, "k": 4, "per_step": 1, "ms": 2.0},
              "gate_up_fused": {"n": 8, "k": 4, "per_step": 1, "ms": 1.5}}
    run = {"date": "2026-12-04T18:37:07Z", "gpu": {"name": "H200"}, "ceilings": {"copy_bandwidth_Bps": 1e9},
           "table": [{"variant": "fuse_projections=true", "batch": 8, "replay_ms": 9.0, "attention_ms": 0.5,
                      "gemm_ms": 8.0, "rest_ms": 0.5, "fused_gemms_saved": 108, "gemm_parts": parts},
                     {"variant": "", "batch": 8, "replay_ms": 9.5, "attention_ms": 0.5, "gemm_ms": 8.0,
                      "rest_ms": 1.0, "fused_gemms_saved": 0, "gemm_parts": parts}]}
    src = tmp_path / "run.json"
    src.write_text(json.dumps(run))
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(common, "SMOKE", False)
    monkeypatch.delenv("OUT", raising=False)
    assert profile.main(["--rederive", str(src), "--name", "profile_x"]) == 0
    from rlstack.core import results

    out = results.read(tmp_path / "results" / "profile_x.json")  # the results schema, through its one reader
    fused, apart = out.rows
    assert fused["gemm_ms"] == 2.0 + 1.0 + 1.5 + 1.0 + 1.0 and fused["rest_ms"] == round(9.0 - 6.5 - 0.5, 4)
    assert apart["gemm_ms"] == 8.0 and apart["rest_ms"] == 1.0
    assert fused["replay_ms"] == 9.0 and out.date == run["date"] and out.extra["rederived"]["from"] == str(src)
    assert out.question == "engine-profile" and out.where.gpu == "H200"
    # a stored run in the schema rederives too (the pre-schema layout above is what archive/ holds)
    assert profile.main(["--rederive", str(tmp_path / "results" / "profile_x.json"), "--name", "profile_y"]) == 0
    assert results.read(tmp_path / "results" / "profile_y.json").rows[0]["gemm_ms"] == fused["gemm_ms"]


def test_replay_mean_weights_each_read_length_by_the_steps_it_serves(profile: ModuleType) -> None:
    """attend_bucket's loop replays a graph per read length: 9 prompt slots, 40 new tokens, buckets of 16 ->
    steps 1..39 fill 10..48 slots: 7 steps read 16, 16 read 32, 16 read 48."""
    def read_length(filled: int, length: int) -> int:
        return min(length, -(-filled // 16) * 16)

    mean = profile.replay_mean({16: 1.0, 32: 2.0, 48: 3.0}, read_length, 9, 40, 128)
    assert mean == pytest.approx((7 * 1.0 + 16 * 2.0 + 16 * 3.0) / 39)
