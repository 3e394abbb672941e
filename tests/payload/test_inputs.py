"""Inputs refused where they enter, under their own name: recipe numbers, counts given as flags, model folders,
binary files where text is expected, and the one library warning rlstack silences."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlstack.cli import main
from rlstack.payload import recipes
from rlstack.payload.train.loading import ModelLoadError, check_model_name


@pytest.mark.parametrize(("item", "field", "why"), [
    ("grpo.learning_rate=inf", "grpo.learning_rate", "finite"), ("grpo.learning_rate=nan", "grpo.learning_rate",
                                                                 "finite"),
    ("grpo.learning_rate=0", "grpo.learning_rate", "greater than 0"), ("grpo.temperature=inf", "grpo.temperature",
                                                                       "finite"),
    ("grpo.weight_decay=-0.1", "grpo.weight_decay", "greater than or equal to 0"),
    ("reward_weights=[1.0, inf]", "reward_weights.1", "finite"), ("grpo.max_steps=0", "grpo.max_steps", "greater"),
    ("grpo.max_steps=99999999999999999999", "grpo.max_steps", "less than or equal"),
])
def test_numbers_that_cannot_train_are_refused_by_field(item: str, field: str, why: str) -> None:
    with pytest.raises(recipes.RecipeError) as exc:
        recipes.load("smoke-cpu", [item])
    line = next(ln for ln in exc.value.message.splitlines() if ln.strip().startswith(field + ":"))
    assert why in line and f"(from --set {item})" in line


@pytest.mark.parametrize(("argv", "flag"), [
    (["eval", "--model", "tiny", "--batch-size", "0"], "--batch-size"),
    (["eval", "--model", "tiny", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["eval", "--model", "tiny", "-n", "0"], "-n"),
    (["compare", "a.json", "b.json", "--iters", "0"], "--iters"),
    (["train", "--max-steps", "99999999999999999999"], "--max-steps"),  # it trained until killed
])
def test_counts_below_one_name_their_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert f"'{flag}'" in capsys.readouterr().err


def test_a_binary_recipe_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "r.toml"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(recipes.RecipeError, match="cannot read the recipe|not valid TOML"):
        recipes.load(p)


def test_a_deeply_nested_recipe_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "r.toml"
    p.write_text("a = " + "[" * 50_000)
    with pytest.raises(recipes.RecipeError, match="not valid TOML"):
        recipes.load(p)


@pytest.mark.parametrize("name", ["./models/nope", "/no/such/model", "~/nope/", "a/b/c", "../x", "org/na me"])
def test_a_missing_model_folder_says_so(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # relative names resolve where none of them exists (from a checkout named x, '../x' is the checkout itself)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(ModelLoadError, match="does not exist") as exc:
        check_model_name(name)
    assert "hub id" in str(exc.value.hint)


def test_a_model_file_or_folder_or_hub_id(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    check_model_name(str(tmp_path))  # an existing model folder
    check_model_name("Qwen/Qwen3-0.6B")  # a hub id: the hub decides
    check_model_name("gpt2")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ModelLoadError, match="is a file"):
        check_model_name(str(tmp_path / "f"))


def test_only_the_kernels_hub_warning_of_bitsandbytes_is_dropped() -> None:
    import rlstack.payload  # noqa: F401  (installs the filter)

    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")

    def kept(msg: str) -> bool:
        record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, msg, (), None)
        return all(f.filter(record) for f in logger.filters)

    assert not kept("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure ...")
    assert kept("some other bitsandbytes warning")


def test_a_folder_without_config_json_is_no_model_folder(tmp_path: Path) -> None:
    """An empty folder as --model reached transformers and ended in its traceback."""
    with pytest.raises(ModelLoadError, match="holds no config.json"):
        check_model_name(str(tmp_path))


@pytest.mark.parametrize("flag", ["--output", "--adapters-root"])
def test_train_refuses_a_file_where_a_folder_belongs_before_any_work(
        tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--output on a file was a FileExistsError traceback after the model loaded; --adapters-root on a file
    trained the whole run first."""
    from rlstack.payload import data

    monkeypatch.setattr(data, "load_problems", lambda *a, **k: pytest.fail("work started"))
    (tmp_path / "f").write_text("x")
    folders = {"--output": str(tmp_path / "run"), "--adapters-root": str(tmp_path / "ad"), flag: str(tmp_path / "f")}
    argv = ["train", "--recipe", "smoke-cpu", "--adapter-name", "n", *[x for kv in folders.items() for x in kv]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} " in err and "is not a folder" in err and "Traceback" not in err


def test_eval_refuses_an_output_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("x")
    argv = ["eval", "--model", "tiny", "--recipe", "smoke-cpu", "--data", "generated:2", "-n", "2", "--output",
            str(tmp_path / "f")]
    assert main(argv) == 2
    assert "--output" in capsys.readouterr().err


def test_adapters_refuses_a_store_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file as --root was listed as an empty store, exit 0."""
    (tmp_path / "f").write_text("x")
    assert main(["adapters", "--root", str(tmp_path / "f")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_legacy_rope_keys_repeat_rope_parameters_at_the_top_level() -> None:
    """What transformers 5 keeps in rope_parameters, transformers 4 reads from rope_theta and rope_scaling; a
    config that says them already, or has no rope_parameters, is left as it is."""
    from rlstack.payload import model_config

    yarn = {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0}
    assert model_config.legacy_rope_keys({"rope_parameters": yarn}) == {
        "rope_parameters": yarn, "rope_theta": 5e5, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    plain = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}
    assert model_config.legacy_rope_keys(plain) == {**plain, "rope_theta": 1e5}
    assert model_config.unread_by_v4(plain) == {"rope_theta": 1e5}
    assert model_config.legacy_rope_keys({**plain, "rope_theta": 7.0})["rope_theta"] == 7.0
    assert model_config.unread_by_v4({**plain, "rope_theta": 1e5}) == {}
    assert model_config.legacy_rope_keys({"rope_theta": 1e4}) == {"rope_theta": 1e4}


def test_a_folder_transformers_4_would_misread_is_refused_with_the_keys_to_add(tmp_path: Path) -> None:
    """A config.json written by transformers 5 (RoPE base only in rope_parameters): refused under transformers 4,
    where it would run with rope_theta 10000, with the exact keys to add; fine under 5, and once the keys are
    there."""
    from rlstack.payload.train.loading import check_config_readable

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}))
    check_config_readable(config, "5.5.0")
    with pytest.raises(ModelLoadError, match="transformers 4.57.6 in this stack reads rope_theta") as exc:
        check_config_readable(config, "4.57.6")
    assert exc.value.hint and '{"rope_theta": 100000.0}' in exc.value.hint
    config.write_text(json.dumps({"rope_theta": 100000.0, "rope_parameters": {"rope_theta": 100000.0}}))
    check_config_readable(config, "4.57.6")
    config.write_text("{")
    with pytest.raises(ModelLoadError, match="unreadable"):
        check_config_readable(config, "4.57.6")
