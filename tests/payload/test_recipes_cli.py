"""The CLI flags the images call (`rlstack train/eval` in the container) map onto recipes and eval configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack.cli import build_parser
from rlstack.commands import payload_cmds
from rlstack.payload import adapters, recipes
from rlstack.payload.train import loading


def _parse(*argv: str) -> object:
    return build_parser().parse_args(list(argv))


def test_train_flags_become_overrides() -> None:
    args = _parse("train", "--recipe", "smoke-cpu", "--set", "grpo.learning_rate=0.1", "--data", "generated:9",
                  "--max-steps", "3", "--model", "tiny")
    r = recipes.load(args.recipe, payload_cmds._recipe_overrides(args))  # type: ignore[attr-defined]
    assert (r.grpo.learning_rate, r.grpo.max_steps, r.data.train, r.model.name) == (0.1, 3, "generated:9", "tiny")


def test_train_flags_exist() -> None:
    args = _parse("train", "--resume", "--fp8", "--adapter-name", "a", "--output", "o", "--overwrite")
    assert args.resume and args.fp8 and args.adapter_name == "a" and args.output == Path("o")  # type: ignore[attr-defined]
    assert args.recipe == "gsm8k-grpo"  # type: ignore[attr-defined]


def test_eval_config_from_adapter_recipe_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path))
    recipe = recipes.load("smoke-cpu").model_dump(mode="json")
    adapters.write_adapter(tmp_path, "a", lambda d: (d / "w").write_text("x"), base_model="b", recipe=recipe,
                           stack="cpu", lock_hash=None)
    cfg = payload_cmds.eval_config(_parse("eval", "--adapter", "a", "-n", "5", "--backend", "vllm"))
    assert cfg.n == 5 and cfg.backend == "vllm"
    assert cfg.data == recipe["eval"]["data"] and cfg.max_new_tokens == recipe["eval"]["max_new_tokens"]
    plain = payload_cmds.eval_config(_parse("eval", "--model", "m"))
    assert (plain.n, plain.data, plain.split, plain.backend) == (300, "gsm8k", "test", "hf")


def test_fp8_unavailable_points_to_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "has", lambda m: m == "torch")
    monkeypatch.setattr(loading, "cuda_available", lambda: False)
    with pytest.raises(loading.Fp8UnavailableError) as exc:
        loading.check_fp8()
    assert "unsloth, vllm" in str(exc.value) and "invoke probe-fp8" in str(exc.value)
