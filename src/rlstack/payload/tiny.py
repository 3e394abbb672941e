"""A tiny causal LM built locally: random weights from a transformers config and a BPE tokenizer trained with
`tokenizers` on generated problems. No download anywhere, so CPU smoke runs and tests work offline.

The build is deterministic (seeded), cached under runs/tiny/<hash>/, and named `tiny-<hash>`: that name is the
adapter's base_model, so evaluation can rebuild or find exactly the base an adapter was trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import swap_in, tree_difference, tree_hashes
from rlstack.payload import tokenizer_files
from rlstack.payload.recipes import TinySpec

# '####' is one token so the format the reward asks for is reachable in a single sampling decision.
MARKER_TOKEN = "####"
EOS = "<|endoftext|>"
# A pad token of its own, inside the vocabulary. With pad = eos, Unsloth (zoo 2026.6.1 and 2026.10.6 alike) finds
# no valid pad and adds a new token past the model's embedding rows: zoo 2026.10.6 refuses to load, 2026.6.1 loads and
# the first padded GRPO loss indexes out of range (a device-side assert on CUDA).
PAD = "<|pad|>"
# Part of the tiny model's name, so a model cached with an older tokenizer is never reused. 2: the pad token above.
TOKENIZER_REVISION = 2


def spec_hash(spec: TinySpec) -> str:
    data = spec.model_dump(mode="json")
    if data.get("tie_word_embeddings") is True:
        del data["tie_word_embeddings"]  # the default, added later: existing tiny models keep their names
    data["tokenizer_revision"] = TOKENIZER_REVISION
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def model_id(spec: TinySpec) -> str:
    return f"tiny-{spec_hash(spec)}"


def cache_dir() -> Path:
    return Path(os.environ.get("RLSTACK_TINY_CACHE", "runs/tiny"))


def build_tokenizer(spec: TinySpec) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rlstack.payload import prompt
    from rlstack.payload.data.generator import generate

    problems = generate(spec.tokenizer_corpus, seed=spec.seed + 7)
    corpus = [prompt.plain(p.question) + " " + (p.solution or p.answer) for p in problems]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    fast.add_tokens([MARKER_TOKEN])
    fast.padding_side = "left"
    return fast


def build(spec: TinySpec) -> tuple[Any, Any]:
    """(model, tokenizer), freshly built from the spec."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    tokenizer = build_tokenizer(spec)
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=spec.tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    config: Any
    if spec.architecture == "qwen3":
        common["head_dim"] = spec.hidden_size // spec.num_attention_heads
        config = Qwen3Config(**common)
    else:
        config = LlamaConfig(**common)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


STAMP = "rlstack-tiny.json"


class TinyModelError(RlstackError):
    pass


def check_cached(spec: TinySpec, folder: Path) -> bool:
    """Whether `folder` holds the tiny model as it was built: True when every file matches the sha256 recorded
    in its stamp; False for a folder built before stamps recorded hashes (rebuilt, as the build is
    deterministic). A folder whose files differ from its record is refused, as the embedded model's cache is:
    a base that changed under an adapter would make its evaluation meaningless."""
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        stamp = None
    recorded = stamp.get("files") if isinstance(stamp, dict) else None
    if not isinstance(recorded, dict):
        return False
    problem = tree_difference(folder, recorded, skip=STAMP)
    if problem or stamp.get("spec") != spec.model_dump(mode="json"):
        raise TinyModelError(f"{folder}: the cached tiny model is not the one built here: "
                             f"{problem or 'its stamp records another spec'}",
                             f"delete {folder}; the next run builds it again (the build is deterministic)")
    return True


def ensure(spec: TinySpec, root: Path | None = None) -> Path:
    """The folder holding the tiny base model and tokenizer, built once, then reused while its files match the
    sha256 recorded when it was built."""
    folder = (root or cache_dir()) / model_id(spec)
    if folder.is_dir() and check_cached(spec, folder):
        return folder
    model, tokenizer = build(spec)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model.save_pretrained(tmp)
        tokenizer_files.save(tokenizer, tmp)
        stamp = {"spec": spec.model_dump(mode="json"), "files": tree_hashes(tmp, skip=STAMP)}
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        if folder.is_dir() and check_cached(spec, folder):  # another process finished first: keep theirs
            return folder
        swap_in(tmp, folder)  # replaces a folder built before stamps recorded hashes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
