"""The CLI flags the images call (`rlstack train/eval` in the container) map onto recipes and eval configs,
parsed by the `rlstack` command itself (rlstack.cli, typer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack.cli import main
from rlstack.payload import adapters, commands, recipes
from rlstack.payload.train import grpo, loading


def _call(monkeypatch: pytest.MonkeyPatch, *argv: str) -> dict[str, object]:
    """Parse argv with the rlstack CLI and run it with grpo.run replaced: what the trainer would be given."""
    seen: dict[str, object] = {}

    def fake_run(recipe: recipes.Recipe, **kw: object) -> object:
        seen.update(recipe=recipe, **kw)
        raise SystemExit(0)

    monkeypatch.setattr(grpo, "run", fake_run)
    with pytest.raises(SystemExit):
        main(list(argv))
    return seen


def test_train_flags_become_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _call(monkeypatch, "train", "--recipe", "smoke-cpu", "--set", "grpo.learning_rate=0.1", "--data",
                 "generated:9", "--max-steps", "3", "--model", "tiny")
    r = seen["recipe"]
    assert isinstance(r, recipes.Recipe)
    assert (r.grpo.learning_rate, r.grpo.max_steps, r.data.train, r.model.name) == (0.1, 3, "generated:9", "tiny")


def test_train_flags_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _call(monkeypatch, "train", "--resume", "--fp8", "--adapter-name", "a", "--output", "o", "--overwrite")
    assert seen["resume"] and seen["fp8"] and seen["overwrite"] and seen["adapter_name"] == "a"
    assert seen["run_dir"] == Path("o") and isinstance(seen["recipe"], recipes.Recipe)
    assert seen["recipe"].name == "gsm8k-grpo"


def test_eval_config_from_adapter_recipe_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path))
    recipe = recipes.load("smoke-cpu").model_dump(mode="json")
    adapters.write_adapter(tmp_path, "a", lambda d: (d / "w").write_text("x"), base_model="b", recipe=recipe,
                           stack="cpu", lock_hash=None)
    cfg = commands.eval_config(adapter="a", n=5, backend="vllm")
    assert cfg.n == 5 and cfg.backend == "vllm"
    assert cfg.data == recipe["eval"]["data"] and cfg.max_new_tokens == recipe["eval"]["max_new_tokens"]
    plain = commands.eval_config(model="m")
    assert (plain.n, plain.data, plain.split, plain.backend) == (300, "gsm8k", "test", "hf")
    assert plain.vllm_gpu_memory_utilization is None
    gpu = commands.eval_config(recipe="smollm2-gpu")
    assert gpu.vllm_gpu_memory_utilization == recipes.load("smollm2-gpu").eval.vllm_gpu_memory_utilization
    assert gpu.vllm_enforce_eager is recipes.load("smollm2-gpu").eval.vllm_enforce_eager is True
    assert plain.vllm_enforce_eager is False


def test_every_eval_option_of_a_recipe_reaches_the_evaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """recipes.EvalSpec declares the [eval] options once: each one set in a recipe arrives in rlstack eval's
    config without a list to keep in step; an older adapter's recipe naming an option this rlstack no longer has
    is read without it."""
    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path))
    chosen = {"data": "generated-easy:64", "split": "train", "n": 7, "seed": 3, "batch_size": 5, "max_new_tokens": 9,
              "backend": "vllm", "vllm_gpu_memory_utilization": 0.2, "vllm_enforce_eager": True}
    assert set(chosen) == set(recipes.EvalSpec.model_fields)  # a new option: give it a value here
    recipe = recipes.load("smoke-cpu").model_dump(mode="json")
    recipe["eval"] = {**chosen, "retired_option": 1}
    adapters.write_adapter(tmp_path, "a", lambda d: (d / "w").write_text("x"), base_model="b", recipe=recipe,
                           stack="cpu", lock_hash=None)
    cfg = commands.eval_config(adapter="a")
    assert {k: getattr(cfg, k) for k in chosen} == chosen
    assert commands.eval_config(adapter="a", n=2, seed=None).n == 2  # a flag given wins; one left out does not


def test_eval_unquantized_overrides_the_adapter_recipe_quantization(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter trained on a 4-bit (or FP8) base is evaluated on that base by default; --unquantized loads it
    as stored, the base vLLM's LoRARequest path runs, so a hand-off compares engines on one base."""
    from rlstack.core.errors import RlstackError

    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path))
    recipe = recipes.load("smoke-cpu").model_dump(mode="json")
    recipe["model"].update(load_in_4bit=True, load_in_fp8=True)
    adapters.write_adapter(tmp_path, "q", lambda d: (d / "w").write_text("x"), base_model="b", recipe=recipe,
                           stack="cpu", lock_hash=None)
    default = commands.eval_config(adapter="q")
    assert (default.load_in_4bit, default.load_in_fp8) == (True, True)
    plain = commands.eval_config(adapter="q", unquantized=True)
    assert (plain.load_in_4bit, plain.load_in_fp8) == (False, False)
    with pytest.raises(RlstackError, match="contradict"):
        commands.eval_config(adapter="q", unquantized=True, load_in_4bit=True)
    from rlstack.payload.evaluate import gsm8k

    def fake_eval(cfg: object) -> dict[str, object]:
        raise SystemExit(cfg)

    monkeypatch.setattr(gsm8k, "run", fake_eval)
    with pytest.raises(SystemExit) as stop:
        main(["eval", "--adapter", "q", "--unquantized"])
    cfg = stop.value.code
    assert (cfg.load_in_4bit, cfg.load_in_fp8) == (False, False)  # type: ignore[union-attr]


def test_fp8_unavailable_points_to_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "has", lambda m: m == "torch")
    monkeypatch.setattr(loading, "cuda_available", lambda: False)
    with pytest.raises(loading.Fp8UnavailableError) as exc:
        loading.check_fp8()
    assert "unsloth, vllm" in str(exc.value) and "invoke probe-fp8" in str(exc.value)
