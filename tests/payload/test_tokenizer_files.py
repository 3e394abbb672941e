"""Model folders every stack can read: a tokenizer saved under transformers 5 names a class transformers 4 has,
the tiny model's tokenizer has a pad token of its own, and a pad id past the embeddings is refused at load time
(Unsloth's appended pad token, measured as device-side asserts on an H200) with what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.payload import tiny, tokenizer_files
from rlstack.payload.recipes import TinySpec
from rlstack.payload.train.loading import ModelLoadError, check_pad_token

SMALL = TinySpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=300, tokenizer_corpus=64)


@pytest.fixture(scope="module")
def built() -> tuple[object, object]:
    return tiny.build(SMALL)


def test_saved_tokenizer_names_a_class_both_majors_have(built: tuple[object, object], tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    _, tok = built
    tokenizer_files.save(tok, tmp_path)
    data = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert data["tokenizer_class"] not in tokenizer_files.V5_ONLY_CLASSES
    again = AutoTokenizer.from_pretrained(tmp_path)  # and this transformers still reads it, the same tokens
    text = "Dan has 12 apples. #### 7"
    assert again(text).input_ids == tok(text).input_ids  # type: ignore[operator]
    assert (again.pad_token, again.eos_token) == (tok.pad_token, tok.eos_token)  # type: ignore[attr-defined]


def test_rewrite_only_touches_the_v5_class(tmp_path: Path) -> None:
    cfg = tmp_path / "tokenizer_config.json"
    assert tokenizer_files.make_readable_by_all(tmp_path) is False  # no file: nothing to do, nothing written
    assert not cfg.exists()
    cfg.write_text(json.dumps({"tokenizer_class": "TokenizersBackend", "eos_token": "<|e|>", "x": "\u2581"}))
    assert tokenizer_files.make_readable_by_all(tmp_path) is True
    data = json.loads(cfg.read_text())
    assert data == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|e|>", "x": "\u2581"}
    assert tokenizer_files.make_readable_by_all(tmp_path) is False  # idempotent
    cfg.write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    assert tokenizer_files.make_readable_by_all(tmp_path) is False
    assert json.loads(cfg.read_text()) == {"tokenizer_class": "Qwen2Tokenizer"}
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer_config.json"]  # no temporary file left behind


def test_tiny_tokenizer_pads_with_its_own_token_inside_the_vocab(built: tuple[object, object]) -> None:
    model, tok = built
    assert tok.pad_token == tiny.PAD and tok.pad_token != tok.eos_token  # type: ignore[attr-defined]
    assert tok.pad_token_id != tok.eos_token_id  # type: ignore[attr-defined]
    rows = model.get_input_embeddings().weight.shape[0]  # type: ignore[attr-defined]
    assert tok.pad_token_id < rows  # type: ignore[attr-defined]
    assert model.config.pad_token_id == tok.pad_token_id  # type: ignore[attr-defined]
    check_pad_token(tok, model, "tiny")  # nothing to refuse


def test_pad_token_past_the_embeddings_is_refused_with_the_fix(built: tuple[object, object]) -> None:
    import copy

    model, tok = built
    tok = copy.deepcopy(tok)
    tok.add_special_tokens({"pad_token": "<|PAD_TOKEN|>"})  # type: ignore[attr-defined]  # what Unsloth appends
    rows = model.get_input_embeddings().weight.shape[0]  # type: ignore[attr-defined]
    assert tok.pad_token_id == rows  # type: ignore[attr-defined]
    with pytest.raises(ModelLoadError, match=f"has id {rows}, past the model's {rows} embedding rows") as exc:
        check_pad_token(tok, model, "runs/tiny/x")
    assert "pad token of its own" in (exc.value.hint or "")
    from rlstack.probes import signatures

    assert [h.signature.id for h in signatures.diagnose(str(exc.value))] == ["unsloth-pad-token-out-of-range"]
