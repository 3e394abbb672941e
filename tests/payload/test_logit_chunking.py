"""grpo.unsloth_logit_chunk_multiplier: one compiled graph for Unsloth's GRPO log-softmax at every batch width.

Unsloth's loss unrolls rows x multiplier chunks of the logits into one torch.compile graph; at Unsloth's default (4)
unsloth_zoo 2026.6.1 compiles that graph again whenever the padded width changes its remainder mod 4
(rlstack.payload.train.grpo.set_logit_chunking has the reading). rlstack sets 1 on Unsloth's GRPOConfig before the
trainer is built, and says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from rlstack.payload import recipes


def test_the_default_is_one_chunk_per_sequence_and_auto_gives_unsloth_its_own_choice() -> None:
    assert recipes.load("smollm2-gpu").grpo.unsloth_logit_chunk_multiplier == 1
    assert recipes.load("smoke-cpu").grpo.unsloth_logit_chunk_multiplier == 1
    auto = recipes.load("smollm2-gpu", ["grpo.unsloth_logit_chunk_multiplier=auto"])
    assert auto.grpo.unsloth_logit_chunk_multiplier == "auto"
    assert (
        recipes.load("smollm2-gpu", ["grpo.unsloth_logit_chunk_multiplier=4"]).grpo.unsloth_logit_chunk_multiplier == 4
    )


@pytest.mark.parametrize("bad", ["0", "-2", "true", "1.5", '"4"', "many"])
def test_anything_but_a_positive_whole_number_or_auto_is_refused(bad: str) -> None:
    with pytest.raises(recipes.RecipeError) as err:
        recipes.load("smollm2-gpu", [f"grpo.unsloth_logit_chunk_multiplier={bad}"])
    assert "grpo.unsloth_logit_chunk_multiplier" in err.value.message


def _unsloth_like_config(trl: Any) -> type:
    """A GRPOConfig with the field Unsloth's generated UnslothGRPOConfig adds (default None: Unsloth's choice)."""

    @dataclasses.dataclass
    class UnslothLikeConfig(trl.GRPOConfig):
        unsloth_logit_chunk_multiplier: int | None = None

    return UnslothLikeConfig


def _trainer_config(overrides: list[str], loader: str, tmp_path: Path) -> Any:
    torch = pytest.importorskip("torch")
    from rlstack.payload.train.grpo import trainer_config
    from rlstack.payload.train.loading import Loaded

    loaded = Loaded(model=torch.nn.Linear(2, 2), tokenizer=None, base_model="b", loader=loader, device="cpu")
    return trainer_config(recipes.load("smoke-cpu", overrides), loaded, tmp_path / "checkpoints")


@pytest.mark.parametrize("loader", ["unsloth", "unsloth-fp8"])
def test_unsloths_config_gets_the_recipes_multiplier_before_the_trainer_and_the_run_says_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], loader: str
) -> None:
    trl = pytest.importorskip("trl")
    monkeypatch.setattr(trl, "GRPOConfig", _unsloth_like_config(trl))
    config = _trainer_config([], loader, tmp_path)
    assert config.unsloth_logit_chunk_multiplier == 1
    said = capsys.readouterr().err
    assert "rlstack train: unsloth_logit_chunk_multiplier = 1 (grpo.unsloth_logit_chunk_multiplier)" in said
    del config.unsloth_logit_chunk_multiplier  # what unsloth_zoo 2026.6.1's loss does at each accumulation boundary
    assert config.unsloth_logit_chunk_multiplier == 1
    config = _trainer_config(["grpo.unsloth_logit_chunk_multiplier=8"], loader, tmp_path)
    assert (
        config.unsloth_logit_chunk_multiplier == 8 and "unsloth_logit_chunk_multiplier = 8" in capsys.readouterr().err
    )
    config = _trainer_config(["grpo.unsloth_logit_chunk_multiplier=auto"], loader, tmp_path)
    assert config.unsloth_logit_chunk_multiplier is None  # Unsloth's max(4, width // 4096)
    assert "Unsloth's own choice" in capsys.readouterr().err


def test_an_unsloth_config_without_the_field_is_left_alone_and_the_run_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("trl")
    config = _trainer_config([], "unsloth", tmp_path)  # TRL's own GRPOConfig, as an Unsloth without the field
    assert not hasattr(config, "unsloth_logit_chunk_multiplier")
    assert "grpo.unsloth_logit_chunk_multiplier = 1 could not be set" in capsys.readouterr().err


def test_the_transformers_loader_ignores_it_and_speaks_only_when_the_recipe_changed_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trl = pytest.importorskip("trl")
    monkeypatch.setattr(trl, "GRPOConfig", _unsloth_like_config(trl))
    config = _trainer_config([], "transformers", tmp_path)
    assert config.unsloth_logit_chunk_multiplier is None  # never set: this loader runs TRL's loss
    assert "unsloth_logit_chunk_multiplier" not in capsys.readouterr().err
    _trainer_config(["grpo.unsloth_logit_chunk_multiplier=4"], "transformers", tmp_path)
    assert (
        "grpo.unsloth_logit_chunk_multiplier = 4 has no effect with the transformers loader" in capsys.readouterr().err
    )
