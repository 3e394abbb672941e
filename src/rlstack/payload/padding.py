"""Widen a Llama-family checkpoint to block-aligned widths without changing what it computes.

Why: Unsloth's FP8 RL path quantizes the base in 128 x 128 blocks and slices vLLM's fused q/k/v projection per
block; a model whose q, k or v width is not a multiple of the block (SmolLM2-135M: 576, 192, 192) is refused, so
the fp8 stack could not train the one real model that travels offline. Zero-padding the widths keeps the function
exactly (up to float rounding):

- hidden size: new residual channels start at zero and stay zero (every write into them, o_proj's and down_proj's
  new rows, is zero; embeddings get zero columns); RMSNorm's mean then runs over more channels, which scales its
  output by sqrt(new/old): the real channels' norm weights are scaled back and eps by old/new, so the norm is
  the same function; the new channels' norm weights are zero (they stay inert whatever a LoRA writes there);
- attention heads: whole key/value heads are appended, each with `group` query heads (the query-to-kv mapping of
  grouped-query attention stays the same for the old heads); their weights are zero, so they attend uniformly
  to zero values and o_proj's matching (zero) columns drop what they return.

The padded model is a different checkpoint (more parameters, other widths), so a run on it says so by its name;
the check that it computes what the original does is `max_logit_difference`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlstack.core.errors import RlstackError

WEIGHTS = "model.safetensors"
ARCHITECTURES = ("LlamaForCausalLM",)  # the layout below (names, no biases, tied or untied head) is Llama's


class PaddingError(RlstackError):
    pass


@dataclass(frozen=True)
class Widths:
    """The widths a padding changes: hidden size, query heads, key/value heads (head_dim stays)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def _multiple(n: int, block: int) -> int:
    return -(-n // block) * block


def target_widths(config: dict[str, Any], block: int) -> Widths:
    """The smallest widths >= the config's where hidden size and the q, k and v widths are multiples of `block`,
    with the query-per-kv group unchanged. The hidden size is at least heads x head_dim, and the config says
    head_dim outright (transformers and vLLM derive it from the hidden size when a config leaves it out)."""
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    heads, kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    if heads % kv:
        raise PaddingError(
            f"{heads} query heads over {kv} key/value heads is not grouped attention",
            "only Llama-family checkpoints with heads divisible by key/value heads can be padded",
        )
    group = heads // kv
    new_kv = kv
    while (
        (new_kv * head_dim) % block
        or (new_kv * group * head_dim) % block
        or new_kv * group * head_dim < int(config["hidden_size"])
    ):
        new_kv += 1
    hidden = max(_multiple(int(config["hidden_size"]), block), new_kv * group * head_dim)
    return Widths(hidden=hidden, heads=new_kv * group, kv_heads=new_kv, head_dim=head_dim)


def pad_state(state: dict[str, Any], config: dict[str, Any], block: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(padded state dict, padded config) of a Llama checkpoint; every width a multiple of `block`."""
    import torch

    if config.get("architectures") and not set(config["architectures"]) <= set(ARCHITECTURES):
        raise PaddingError(f"cannot pad {config['architectures']}", f"padding knows {', '.join(ARCHITECTURES)}")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise PaddingError("cannot pad a checkpoint with projection biases", "pad a bias-free Llama checkpoint")
    old = Widths(
        int(config["hidden_size"]),
        int(config["num_attention_heads"]),
        int(config["num_key_value_heads"]),
        int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]),
    )
    new = target_widths(config, block)
    if int(config["intermediate_size"]) % block:
        raise PaddingError(
            f"intermediate size {config['intermediate_size']} is not a multiple of {block}",
            "padding the MLP width is not implemented; this checkpoint needs it",
        )
    norm_scale = math.sqrt(old.hidden / new.hidden)

    def grow(t: Any, rows: int | None = None, cols: int | None = None) -> Any:
        out = torch.zeros((rows or t.shape[0], *([cols] if cols else t.shape[1:])), dtype=t.dtype)
        out[tuple(slice(0, s) for s in t.shape)] = t
        return out

    padded: dict[str, Any] = {}
    for key, t in state.items():
        leaf = key.rsplit(".", 2)[-2] if key.endswith(".weight") else key
        if leaf in ("embed_tokens", "lm_head"):
            padded[key] = grow(t, cols=new.hidden)
        elif leaf in ("input_layernorm", "post_attention_layernorm", "norm"):
            padded[key] = grow(t * norm_scale, rows=new.hidden)
        elif leaf == "q_proj":
            padded[key] = grow(t, rows=new.heads * new.head_dim, cols=new.hidden)
        elif leaf in ("k_proj", "v_proj"):
            padded[key] = grow(t, rows=new.kv_heads * new.head_dim, cols=new.hidden)
        elif leaf == "o_proj":
            padded[key] = grow(t, rows=new.hidden, cols=new.heads * new.head_dim)
        elif leaf in ("gate_proj", "up_proj"):
            padded[key] = grow(t, cols=new.hidden)
        elif leaf == "down_proj":
            padded[key] = grow(t, rows=new.hidden)
        else:
            raise PaddingError(
                f"cannot pad tensor {key!r} {tuple(t.shape)}: not part of the Llama layout",
                "pad a plain Llama checkpoint (no extra modules)",
            )
    cfg = dict(
        config,
        hidden_size=new.hidden,
        num_attention_heads=new.heads,
        num_key_value_heads=new.kv_heads,
        head_dim=new.head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)) * old.hidden / new.hidden,
    )
    return padded, cfg


def pad_folder(src: Path, dst: Path, block: int) -> Widths:
    """Write `dst`: src's Hugging Face folder with the weights and config padded (other files copied)."""
    import shutil

    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    state, cfg = pad_state(load_file(str(src / WEIGHTS)), config, block)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in (WEIGHTS, "config.json"):
            shutil.copy2(f, dst / f.name)
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # tied: saved once, as the embedding
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / WEIGHTS), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return Widths(cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"])


def max_logit_difference(a: Path, b: Path, text: str = "Question: 12 + 30 = ?\nAnswer:") -> float:
    """The largest absolute difference between two folders' float32 logits on one prompt: the check that a
    padded copy computes what its source does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(a))(text, return_tensors="pt").input_ids
    with torch.no_grad():
        la, lb = (AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32)(ids).logits for p in (a, b))
    return float((la - lb).abs().max())
