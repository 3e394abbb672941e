"""Recipes: what to train and evaluate, as TOML parsed into a strict pydantic model.

Every field has one home here; the TOML files in recipes/ only set values. `--set a.b=value` overrides any field
(the value is read as TOML, so numbers, booleans and lists work; anything else is a string). Unknown fields, in a
file or an override, are errors that name them, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlstack.core.errors import RlstackError
from rlstack.core.paths import recipes_dir

RewardName = Literal["correctness", "format"]
DEFAULT_REWARDS: tuple[RewardName, ...] = ("correctness", "format")
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class RecipeError(RlstackError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TinySpec(_Strict):
    """A model built locally from a config with random weights, and a tokenizer trained on generated text."""

    architecture: Literal["qwen3", "llama"] = "qwen3"
    hidden_size: int = Field(default=64, gt=0)
    intermediate_size: int = Field(default=128, gt=0)
    num_hidden_layers: int = Field(default=2, gt=0)
    num_attention_heads: int = Field(default=4, gt=0)
    num_key_value_heads: int = Field(default=2, gt=0)
    vocab_size: int = Field(default=384, ge=64, description="target BPE vocabulary size")
    tokenizer_corpus: int = Field(default=2000, gt=0, description="generated problems to train the tokenizer on")
    tie_word_embeddings: bool = Field(default=True, description="share the input embedding with the LM head")
    seed: int = 0


class ModelSpec(_Strict):
    name: str = Field(min_length=1, description="hub id, local path, or 'tiny' (built from [model.tiny])")
    load_in_4bit: bool = False
    load_in_fp8: bool = False
    max_seq_length: int = Field(default=1024, gt=0)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    loader: Literal["auto", "unsloth", "transformers"] = Field(
        default="auto", description="auto: Unsloth on CUDA when installed (not for 'tiny'), else transformers+peft; "
        "'unsloth' forces the stack's Unsloth path, as the runtime grpo-step probe does")
    tiny: TinySpec | None = None

    @model_validator(mode="after")
    def _tiny(self) -> ModelSpec:
        if self.name == "tiny" and self.tiny is None:
            self.tiny = TinySpec()
        return self


class LoraSpec(_Strict):
    r: int = Field(default=32, gt=0)
    alpha: int = Field(default=32, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(ALL_LINEAR))


class GrpoSpec(_Strict):
    """The TRL GRPOConfig fields rlstack sets; use_vllm is always False on the portable path."""

    learning_rate: float = Field(default=5e-6, gt=0)
    max_steps: int = Field(default=150, gt=0)
    num_generations: int = Field(default=8, ge=2)
    per_device_train_batch_size: int = Field(default=8, gt=0)
    gradient_accumulation_steps: int = Field(default=1, gt=0)
    max_prompt_length: int = Field(default=512, gt=0)
    max_completion_length: int = Field(default=512, gt=0)
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    beta: float = Field(default=0.0, ge=0, description="KL coefficient (TRL's default is 0.0)")
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    weight_decay: float = 0.0
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)
    lr_scheduler_type: str = "constant"
    max_grad_norm: float = Field(default=1.0, gt=0)
    optim: str = "adamw_torch"
    gradient_checkpointing: bool = False
    save_steps: int = Field(default=50, gt=0, description="checkpoint every N steps (for --resume)")
    save_total_limit: int = Field(default=2, gt=0)
    seed: int = 0
    fast_generation: bool = Field(
        default=True,
        description="on CUDA with the transformers loader: rollouts through rlstack.payload.fastgen (static KV cache, "
        "compiled decode step in a CUDA graph); off: TRL's own generate",
    )

    @model_validator(mode="after")
    def _batch(self) -> GrpoSpec:
        gen_batch = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if gen_batch % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size x gradient_accumulation_steps ({gen_batch}) must be a multiple of "
                f"num_generations ({self.num_generations})"
            )
        return self


class DataSpec(_Strict):
    train: str = Field(default="gsm8k", description="'gsm8k', 'generated:N' or a JSONL path")
    split: str = "train"
    n: int | None = Field(default=None, gt=0, description="use only the first n training problems (after shuffling)")
    seed: int = 0


class EvalSpec(_Strict):
    data: str = "gsm8k"
    split: str = "test"
    n: int = Field(default=300, gt=0)
    seed: int = 0
    batch_size: int = Field(default=16, gt=0)
    max_new_tokens: int = Field(default=512, gt=0)
    backend: Literal["hf", "vllm"] = "hf"


class PromptSpec(_Strict):
    """Options of the one prompt template (rlstack.payload.prompt); the wording itself is not configurable."""

    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="passed to tokenizer.apply_chat_template, e.g. enable_thinking = false")


class Recipe(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    model: ModelSpec
    lora: LoraSpec = Field(default_factory=LoraSpec)
    prompt: PromptSpec = Field(default_factory=PromptSpec)
    grpo: GrpoSpec = Field(default_factory=GrpoSpec)
    rewards: list[RewardName] = Field(default_factory=lambda: list(DEFAULT_REWARDS))
    reward_weights: list[float] | None = None
    data: DataSpec = Field(default_factory=DataSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    adapter_name: str | None = Field(default=None, description="default: <recipe name>-<time>")

    @model_validator(mode="after")
    def _weights(self) -> Recipe:
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} rewards")
        if not self.rewards:
            raise ValueError("at least one reward is needed")
        return self

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:12]


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of `data` with each 'a.b.c=value' set (missing tables are created; validation names
    unknown keys afterwards)."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise RecipeError(f"override {item!r} is not key=value", "example: --set grpo.max_steps=10")
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise RecipeError(f"override {item!r}: '{part}' is a value, not a table")
            node = nxt
        node[parts[-1]] = _parse_value(raw.strip())
    return out


def _explain(source: str, exc: ValidationError) -> RecipeError:
    lines = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<recipe>"
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown field '{loc}'")
        else:
            lines.append(f"{loc}: {e['msg']}")
    return RecipeError(f"{source}: invalid recipe:\n  " + "\n  ".join(lines),
                       "see the fields in src/rlstack/recipes.py, or recipes/gsm8k-grpo.toml for an example")


def resolve_path(spec: str | Path) -> Path:
    """A recipe path, or a bare name looked up in recipes/ ('smoke-cpu' -> recipes/smoke-cpu.toml)."""
    p = Path(spec)
    if p.is_file():
        return p
    for candidate in (recipes_dir() / p.name, recipes_dir() / f"{p.name}.toml"):
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(x.stem for x in recipes_dir().glob("*.toml")))
    raise RecipeError(f"recipe {spec} not found", f"recipes here: {known}")


def load(spec: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    path = resolve_path(spec)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML: {exc}") from None
    return from_dict(data, overrides, source=str(path))


def from_dict(data: dict[str, Any], overrides: Iterable[str] = (), source: str = "<recipe>") -> Recipe:
    try:
        return Recipe.model_validate(apply_overrides(data, overrides))
    except ValidationError as exc:
        raise _explain(source, exc) from None
