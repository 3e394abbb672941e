"""The payload end to end on CPU: the tiny model trained through TRL's real GRPOTrainer, its adapter verified
and evaluated through the real eval path, and an interrupted run resumed with one metrics row per step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.cli import main
from rlstack.payload import adapters
from rlstack.payload.train import runs

pytestmark = pytest.mark.slow

FAST = ["--set", "grpo.per_device_train_batch_size=8", "--set", "grpo.num_generations=4",
        "--set", "grpo.max_completion_length=8", "--set", "data.train=generated:200"]


@pytest.fixture
def env(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLSTACK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path / "adapters"))
    # One tiny base for the whole session: it is deterministic, so sharing it changes nothing but time.
    monkeypatch.setenv("RLSTACK_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))
    monkeypatch.setenv("RLSTACK_LOCK_HASH", "test-lock")
    monkeypatch.setenv("RLSTACK_STACK", "cpu")
    return tmp_path


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_train_then_eval(env: Path) -> None:
    assert main(["train", "--recipe", "smoke-cpu", "--max-steps", "3", "--adapter-name", "t", *FAST]) == 0
    adapter = env / "adapters" / "t"
    m = adapters.verify(adapter)
    assert m.base_model.startswith("tiny-") and m.stack == "cpu" and m.lock_hash == "test-lock"
    assert "adapter_model.safetensors" in m.files and m.metrics["steps"] == 3
    run = env / "runs" / "train" / "t"
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert {"reward", "format_mean", "format_std", "correctness_mean", "loss", "step_time_s", "generate_s",
                "score_s", "train_s"} <= set(r)
        assert r["generate_s"] > 0 and r["generate_s"] + r["score_s"] <= r["step_time_s"]  # a rollout every step
    assert (run / "reward_curve.png").stat().st_size > 1000
    assert (run / runs.SCRATCH).is_dir()  # the loop ran from the run's own scratch folder (runs.in_scratch)

    out = env / "eval"
    assert main(["eval", "--adapter", "t", "-n", "6", "--max-new-tokens", "8", "--output", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["n"] == 6 and res["config"]["adapter_name"] == "t" and res["config"]["backend"] == "hf"
    assert len(_rows(out / "generations.jsonl")) == 6
    assert res["versions"]["trl"] == "0.24.0"

    # A tampered adapter is refused before anything loads.
    (adapter / "adapter_config.json").write_text("{}")
    rc = main(["eval", "--adapter", "t", "-n", "2", "--output", str(env / "eval2")])
    assert rc == adapters.IntegrityError.exit_code


def test_resume_continues_history(env: Path) -> None:
    args = ["train", "--recipe", "smoke-cpu", "--adapter-name", "r", "--set", "grpo.save_steps=2", *FAST]
    assert main([*args, "--max-steps", "2"]) == 0
    metrics = env / "runs" / "train" / "r" / "metrics.jsonl"
    assert [r["step"] for r in _rows(metrics)] == [1, 2]
    # Simulate a crash after step 3 was logged but before its checkpoint: that row must not survive twice.
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 3, "reward": -1.0}) + "\n")
    assert main([*args, "--max-steps", "4", "--resume"]) == 0
    rows = _rows(metrics)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["reward"] != -1.0
    m = adapters.verify(env / "adapters" / "r")
    assert m.metrics["steps"] == 4


def test_tiny_build_is_deterministic(tmp_path: Path) -> None:
    from rlstack.payload import tiny
    from rlstack.payload.recipes import TinySpec

    spec = TinySpec(vocab_size=200, tokenizer_corpus=300)
    a, b = tiny.ensure(spec, tmp_path / "a"), tiny.ensure(spec, tmp_path / "b")
    for name in ("model.safetensors", "tokenizer.json"):
        assert adapters.sha256_file(a / name) == adapters.sha256_file(b / name)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a)
    ids = tok("so 5 + 3 = 8\n#### 8", add_special_tokens=False).input_ids
    assert tok.convert_tokens_to_ids(tiny.MARKER_TOKEN) in ids  # the marker is one token
    assert tok.decode(ids) == "so 5 + 3 = 8\n#### 8"


def test_resume_of_a_finished_run_and_after_a_kill_in_the_adapter_write(env: Path) -> None:
    """A finished run: --resume changes nothing. Its adapter lost (a kill during the adapter write): --resume
    writes the adapter from the final checkpoint, with no step trained again."""
    args = ["train", "--recipe", "smoke-cpu", "--adapter-name", "f", "--set", "grpo.save_steps=2", *FAST,
            "--max-steps", "2"]
    assert main(args) == 0
    run = env / "runs" / "train" / "f"
    adapter = env / "adapters" / "f"
    before = {p: p.read_bytes() for p in sorted([*run.rglob("*"), *adapter.rglob("*")]) if p.is_file()}
    assert main([*args, "--resume"]) == 0
    after = {p: p.read_bytes() for p in sorted([*run.rglob("*"), *adapter.rglob("*")]) if p.is_file()}
    assert after.keys() == before.keys() and all(after[p] == before[p] for p in before if p.name != ".rlstack-lock")

    from safetensors.torch import load_file

    weights = load_file(adapter / "adapter_model.safetensors")
    import shutil

    shutil.rmtree(adapter)
    (run / "DONE").unlink()
    assert main([*args, "--resume"]) == 0
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2]
    assert adapters.verify(adapter).metrics["steps"] == 2
    again = load_file(adapter / "adapter_model.safetensors")
    assert again.keys() == weights.keys() and all((again[k] == weights[k]).all() for k in weights)
    assert main([*args[:-1], "1", "--resume"]) == 2  # fewer steps than trained: refused, nothing changed
    assert adapters.verify(adapter).metrics["steps"] == 2
