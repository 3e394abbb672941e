"""Recipe parsing: strict fields, overrides, the shipped recipes."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack.payload import recipes
from rlstack.payload.recipes import RecipeError

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_gsm8k_recipe_matches_the_report() -> None:
    r = recipes.load(ROOT / "recipes" / "gsm8k-grpo.toml")
    assert r.model.name == "unsloth/Qwen3-4B" and r.model.load_in_4bit
    assert r.lora.r == 32
    assert set(r.lora.target_modules) == set(recipes.ALL_LINEAR)
    assert r.grpo.num_generations == 8 and r.grpo.max_steps == 150
    assert r.rewards == ["correctness", "format"]
    assert r.eval.n == 300 and r.eval.split == "test"


def test_smoke_recipe_is_tiny_and_offline() -> None:
    r = recipes.load("smoke-cpu")
    assert r.model.name == "tiny" and r.model.tiny is not None
    assert r.data.train.startswith("generated") and r.eval.data.startswith("generated")


def test_overrides_nested_and_typed() -> None:
    r = recipes.load("gsm8k-grpo", ["grpo.max_steps=10", "grpo.learning_rate=1e-4", "model.load_in_4bit=false",
                                    "lora.target_modules=['q_proj']", "model.name=some/other", "data.train=x y"])
    assert r.grpo.max_steps == 10 and r.grpo.learning_rate == 1e-4
    assert r.model.load_in_4bit is False and r.lora.target_modules == ["q_proj"]
    assert r.model.name == "some/other" and r.data.train == "x y"


def test_unknown_override_is_named() -> None:
    with pytest.raises(RecipeError, match=r"unknown field 'grpo\.max_stepz'"):
        recipes.load("gsm8k-grpo", ["grpo.max_stepz=3"])


def test_unknown_field_in_file_is_named(tmp_path: Path) -> None:
    p = tmp_path / "r.toml"
    p.write_text('name = "x"\nlearning_rate = 1\n[model]\nname = "m"\nflash = true\n')
    with pytest.raises(RecipeError) as exc:
        recipes.load(p)
    assert "unknown field 'learning_rate'" in str(exc.value)
    assert "unknown field 'model.flash'" in str(exc.value)


def test_bad_values_are_explained() -> None:
    with pytest.raises(RecipeError, match=r"grpo\.max_steps"):
        recipes.load("gsm8k-grpo", ["grpo.max_steps=0"])
    with pytest.raises(RecipeError, match="multiple of num_generations"):
        recipes.load("gsm8k-grpo", ["grpo.per_device_train_batch_size=6"])
    with pytest.raises(RecipeError, match="reward_weights"):
        recipes.load("gsm8k-grpo", ["reward_weights=[1.0]"])


def test_override_syntax_errors() -> None:
    with pytest.raises(RecipeError, match="key=value"):
        recipes.load("gsm8k-grpo", ["grpo.max_steps"])
    with pytest.raises(RecipeError, match="is a value, not a table"):
        recipes.load("gsm8k-grpo", ["name.x=1"])


def test_missing_recipe_lists_known() -> None:
    with pytest.raises(RecipeError, match="gsm8k-grpo"):
        recipes.load("nope")


def test_invalid_toml(tmp_path: Path) -> None:
    p = tmp_path / "r.toml"
    p.write_text("name = \n")
    with pytest.raises(RecipeError, match="not valid TOML"):
        recipes.load(p)


def test_fingerprint_changes_with_content() -> None:
    a = recipes.load("gsm8k-grpo")
    b = recipes.load("gsm8k-grpo", ["grpo.max_steps=149"])
    assert a.fingerprint() == recipes.load("gsm8k-grpo").fingerprint() != b.fingerprint()


def test_prompt_kwargs_override() -> None:
    r = recipes.load("gsm8k-grpo", ["prompt.chat_template_kwargs.enable_thinking=false"])
    assert r.prompt.chat_template_kwargs == {"enable_thinking": False}


def test_model_loader_and_tiny_untied() -> None:
    from rlstack.payload import recipes, tiny

    r = recipes.load("smoke-cpu", ["model.loader=unsloth", "model.tiny.tie_word_embeddings=false"])
    assert r.model.loader == "unsloth" and r.model.tiny is not None and not r.model.tiny.tie_word_embeddings
    with pytest.raises(recipes.RecipeError, match="model.loader"):
        recipes.load("smoke-cpu", ["model.loader=vllm"])
    # the default keeps the name tiny models had before the field existed (adapters name their base by it)
    assert tiny.model_id(recipes.load("smoke-cpu").model.tiny) == "tiny-5ad79719fd6e"  # type: ignore[arg-type]
    assert tiny.model_id(r.model.tiny) != "tiny-5ad79719fd6e"
