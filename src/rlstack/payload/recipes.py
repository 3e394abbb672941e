"""Recipes: what to train and evaluate, as TOML parsed into a strict pydantic model.

Every field has one home here; the TOML files in recipes/ only set values. `--set a.b=value` overrides any field
(the value is read as TOML, so numbers, booleans and lists work; anything else is a string). Unknown fields, in a
file or an override, at any depth, are errors that name them and suggest the closest valid name ("did you mean
grpo.learning_rate?"), or list the section's fields when nothing is close, so a typo never silently falls back to
a default. Messages name files as the user has them (rlstack.core.paths.shown: inside a container, the host file a
/mnt/inputs mount came from) and point to things the user has: recipes/gsm8k-grpo.toml and `rlstack train --help`,
never into this source.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from rlstack.core.errors import RlstackError
from rlstack.core.names import MAX_LENGTH, InvalidNameError, check_name
from rlstack.core.paths import recipes_dir, shown
from rlstack.payload import MAX_STEPS
from rlstack.payload.fastgen.options import FastgenOptions

RewardName = Literal["correctness", "format", "repetition"]
DEFAULT_REWARDS: tuple[RewardName, ...] = ("correctness", "format")
# the report's rewards plus the one that separates an untrained model's completions (payload.rewards says why)
WITH_REPETITION: tuple[RewardName, ...] = (*DEFAULT_REWARDS, "repetition")


def rewards_override(names: Iterable[str]) -> str:
    """The `--set` item that makes a recipe use these rewards (a TOML inline array: JSON's is one)."""
    return "rewards=" + json.dumps(list(names))
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# Hints name what a user has: a shipped recipe (in the checkout, and in every image under /opt/rlstack) and the CLI.
EXAMPLE_RECIPE = "recipes/gsm8k-grpo.toml"
FIX_HINT = (f"for a working example see {EXAMPLE_RECIPE} (in the images: /opt/rlstack/{EXAMPLE_RECIPE}); "
            "`rlstack train --help` lists the flags, and --set section.field=value changes one field")


class RecipeError(RlstackError):
    pass


class _Strict(BaseModel):
    # inf and nan are no learning rate, temperature or weight: a float field refuses them before training starts
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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
    name: str = Field(min_length=1, description="hub id, local path, 'tiny' (built from [model.tiny]) or "
                      "'embedded:<key>' (a small pretrained model from a pinned PyPI wheel: payload/embedded.py)")
    load_in_4bit: bool = False
    load_in_fp8: bool = False
    fp8_scheme: Literal["block", "row"] = Field(
        default="block", description="how Unsloth's load_in_fp8 quantizes the base for vLLM and training: 'block' "
        "(vLLM's online fp8_per_block, vLLM >= 0.20; training rebuilds FP8Linear, which has a backward) or 'row' "
        "(fp8_per_channel, vLLM >= 0.24; below that unsloth_zoo falls back to torchao, which it says can generate "
        "but cannot backprop: zoo 2026.10.6 vllm_utils.py:2776-2810)")
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
    top_layers: int | None = Field(
        default=None, gt=0, description="adapt only the last N transformer layers (default: all). Backpropagation "
        "stops at the lowest adapted layer, so the backward pass costs about N/num_layers of the full one: on a CPU "
        "that is most of a GRPO step's training time")


VllmMode = Literal["off", "server", "colocate"]


class GrpoSpec(_Strict):
    """The TRL GRPOConfig fields rlstack sets. Rollouts come from the policy's own generate unless vllm_mode
    says otherwise ('--fp8' runs vLLM inside Unsloth instead, and is not a vllm_mode)."""

    learning_rate: float = Field(default=5e-6, gt=0)
    max_steps: int = Field(default=150, gt=0, le=MAX_STEPS)
    num_generations: int = Field(default=8, ge=2)
    per_device_train_batch_size: int = Field(default=8, gt=0)
    gradient_accumulation_steps: int = Field(default=1, gt=0)
    max_prompt_length: int = Field(default=512, gt=0)
    max_completion_length: int = Field(default=512, gt=0)
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    beta: float = Field(default=0.0, ge=0, description="KL coefficient (TRL's default is 0.0)")
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    # Unsloth's GRPOConfig sets these two for loss_type 'dapo' (mask on, epsilon_high 0.28: unsloth 2026.6.1 whatever
    # the caller passed, 2026.10.6 where left unset), so one recipe trained differently under Unsloth than under
    # transformers. rlstack sets them back to the recipe's after the config is built (train/compat.py), on every loader.
    mask_truncated_completions: bool = Field(
        default=False, description="drop completions cut at max_completion_length from the loss (DAPO's overlong "
        "filtering; TRL's default is off). With it on, a step whose completions all hit the limit has no loss "
        "and learns nothing (rlstack train says so on that step)")
    epsilon_high: float | None = Field(
        default=None, gt=0, description="upper bound of the clipped ratio (DAPO's clip-higher uses 0.28); "
        "unset: the lower bound's 0.2, TRL's default")
    scale_rewards: Literal["group", "batch", "none"] = "group"
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)
    lr_scheduler_type: str = "constant"
    max_grad_norm: float = Field(default=1.0, gt=0)
    optim: str = "adamw_torch"
    unsloth_logit_chunk_multiplier: Annotated[StrictInt, Field(gt=0)] | Literal["auto"] = Field(
        default=1,
        description="Unsloth loaders only (portable, --fp8): the pieces Unsloth's GRPO log-softmax cuts each "
        "sequence's logits into (its GRPOConfig field of the same name). Its compiled function unrolls rows x this "
        "many chunks into one graph. 1, rlstack's default: one chunk per sequence, so the chunk count is the row "
        "count at every padded width and torch.compile builds that graph once per run, a quarter the size of the "
        "one at 4. 'auto' is Unsloth's own max(4, width // 4096), under which unsloth_zoo 2026.6.1 compiles it "
        "again, for minutes, whenever the padded width (longest completion plus the batch's prompt-length spread) "
        "moves to a new remainder mod 4 (torch.chunk's piece count changes). The cost of 1: a chunk holds one "
        "sequence's logits, width x vocabulary in float32 (about 0.6 GB at 1,024 tokens and a 152k vocabulary); "
        "for completions of many thousand tokens with a large vocabulary, set a larger number")
    gradient_checkpointing: bool = False
    save_steps: int = Field(default=50, gt=0, description="checkpoint every N steps (for --resume)")
    save_total_limit: int = Field(default=2, gt=0)
    seed: int = 0
    fast_generation: bool = Field(
        default=True,
        description="on CUDA with the unsloth or transformers loader: rollouts through rlstack.payload.fastgen "
        "(static KV cache, compiled decode step in a CUDA graph); off: TRL's (or Unsloth's) own generate; "
        "not used with vLLM rollouts",
    )
    fastgen_options: FastgenOptions = Field(
        default=FastgenOptions(),  # frozen: one default object serves every recipe
        description="fastgen engine options (rlstack.payload.fastgen.FastgenOptions, docs/fastgen-options.md); "
        "unset ones keep the engine's defaults, e.g. --set grpo.fastgen_options.decode_attention=matmul",
    )
    # TRL's vLLM integration (GRPOConfig use_vllm + vllm_mode). Both modes need vllm in the trainer's own stack:
    # trl 0.24's GRPOTrainer imports it and syncs weights through vLLM's NCCL communicator.
    vllm_mode: VllmMode = Field(
        default="off",
        description="off: no vLLM; server: rollouts from a `trl vllm-serve` process on other GPUs (invoke train "
        "--vllm-server STACK starts one); colocate: vLLM inside each training process, sharing its GPU")
    vllm_server_host: str = Field(default="localhost", min_length=1,
                                  description="server mode: host of the trl vllm-serve process")
    vllm_server_port: int = Field(default=8000, gt=0, lt=65536, description="server mode: its HTTP port")
    vllm_server_timeout: float = Field(
        default=240.0, gt=0, description="server mode: seconds the trainer waits for the server's /health/")
    vllm_gpu_memory_utilization: float = Field(
        default=0.3, gt=0, lt=1, description="colocate mode: the share of the GPU vLLM takes; training gets the rest")

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
    train: str = Field(default="gsm8k", description="'gsm8k', 'generated:N', 'generated-easy:N' or a JSONL path")
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
    vllm_gpu_memory_utilization: float | None = Field(
        default=None, gt=0, lt=1,
        description="vllm backend: the share of the GPU the evaluation's vLLM engine takes (it refuses to start "
        "when less is free); unset: vLLM's own default. Lower it where other processes share the GPU")
    vllm_enforce_eager: bool = Field(
        default=False,
        description="vllm backend: no torch.compile and no CUDA-graph capture at engine start, which cost most of a "
        "short evaluation's start-up; decoding is then slower per token")


class PromptSpec(_Strict):
    """Options of the one prompt template (rlstack.payload.prompt); the wording itself is not configurable."""

    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="passed to tokenizer.apply_chat_template, e.g. enable_thinking = false")


def _name(value: str) -> str:
    """The one name check (core.names), as the ValueError pydantic reports under the field's own location."""
    try:
        return check_name(value, "name")
    except InvalidNameError as exc:
        raise ValueError(f"{exc.message}; {exc.hint}") from None


# A run's default name is '<recipe name>-<YYYYmmdd-HHMMSS>': the recipe name leaves room for that suffix.
RecipeName = Annotated[str, AfterValidator(_name), Field(max_length=MAX_LENGTH - 16)]
RunName = Annotated[str, AfterValidator(_name)]


class Recipe(_Strict):
    name: RecipeName
    description: str = ""
    model: ModelSpec
    lora: LoraSpec = Field(default_factory=LoraSpec)
    prompt: PromptSpec = Field(default_factory=PromptSpec)
    grpo: GrpoSpec = Field(default_factory=GrpoSpec)
    rewards: list[RewardName] = Field(default_factory=lambda: list(DEFAULT_REWARDS))
    reward_weights: list[float] | None = None
    data: DataSpec = Field(default_factory=DataSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    adapter_name: RunName | None = Field(default=None, description="default: <recipe name>-<time>")

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
    except (tomllib.TOMLDecodeError, RecursionError):
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
                raise RecipeError(f"override {item!r}: '{part}' is a value, not a table", FIX_HINT)
            node = nxt
        node[parts[-1]] = _parse_value(raw.strip())
    return out


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The model class a field holds (TinySpec for `TinySpec | None`), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else None


def _section(loc: tuple[str, ...]) -> type[BaseModel] | None:
    """The model at a dotted location: () -> Recipe, ('model', 'tiny') -> TinySpec; None where it is no model."""
    model: type[BaseModel] | None = Recipe
    for part in loc:
        field = model.model_fields.get(part) if model else None
        model = _submodel(field.annotation) if field else None
    return model


def _all_fields(model: type[BaseModel] = Recipe, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every valid location in the recipe, sections and their fields, depth first."""
    out: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        out.append((*prefix, name))
        sub = _submodel(field.annotation)
        if sub is not None:
            out += _all_fields(sub, (*prefix, name))
    return out


def _unknown_field(loc: tuple[str, ...], below: tuple[str, ...] = ()) -> str:
    """What to say about an unknown key: the closest valid names, else the fields the section does have.
    `below` is the rest of a --set key under an unknown section (grpoo.max_steps -> did you mean grpo.max_steps?)."""
    *parent, name = loc
    section = _section(tuple(parent))
    valid = list(section.model_fields) if section else []
    known = set(_all_fields())
    close = []
    for match in difflib.get_close_matches(name, valid, n=3, cutoff=0.6):
        fuller = (*parent, match, *below)
        close.append(".".join(fuller if fuller in known else (*parent, match)))
    if not close:
        # the right name in the wrong section (learning_rate at the top level -> grpo.learning_rate)
        elsewhere = [p for p in _all_fields() if tuple(p[:-1]) != tuple(parent)]
        leaves = sorted({p[-1] for p in elsewhere})
        near = difflib.get_close_matches(name, leaves, n=2, cutoff=0.8)
        close = [".".join(p) for p in elsewhere if p[-1] in near][:4]
    if close:
        return "did you mean " + " or ".join(close) + "?"
    where = f"[{'.'.join(parent)}]" if parent else "the top level of a recipe"
    return f"valid fields of {where}: {', '.join(valid)}" if valid else "this section takes no fields"


def _has(data: Any, loc: tuple[str, ...]) -> bool:
    for part in loc:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _explain(source: str, exc: ValidationError, data: dict[str, Any] | None = None,
             overrides: Iterable[str] = ()) -> RecipeError:
    """One line per problem; an unknown key says which --set brought it in (when the file does not have it)."""
    set_keys = [(item, tuple(item.partition("=")[0].strip().split("."))) for item in overrides]
    lines = []
    for e in exc.errors():
        loc = tuple(str(x) for x in e["loc"])
        dotted = ".".join(loc) or "<recipe>"
        if e["type"] == "extra_forbidden" and loc:
            origin = next(((item, key) for item, key in set_keys if key[:len(loc)] == loc), None)
            if origin is not None and not _has(data, loc):
                lines.append(f"unknown field '{dotted}' (from --set {origin[0]}): "
                             f"{_unknown_field(loc, origin[1][len(loc):])}")
            else:
                lines.append(f"unknown field '{dotted}': {_unknown_field(loc)}")
        else:
            given = next((item for item, key in set_keys if loc[:len(key)] == key), None)
            lines.append(f"{dotted}: {e['msg']}" + (f" (from --set {given})" if given is not None else ""))
    return RecipeError(f"{source}: invalid recipe:\n  " + "\n  ".join(lines), FIX_HINT)


def available() -> list[str]:
    """The recipe names in recipes/ (what `--recipe NAME` accepts)."""
    return sorted(x.stem for x in recipes_dir().glob("*.toml"))


def resolve_path(spec: str | Path) -> Path:
    """A recipe path, or a bare name looked up in recipes/ ('smoke-cpu' -> recipes/smoke-cpu.toml)."""
    p = Path(spec)
    if p.is_file():
        return p
    for candidate in (recipes_dir() / p.name, recipes_dir() / f"{p.name}.toml"):
        if candidate.is_file():
            return candidate
    known = available()
    close = difflib.get_close_matches(p.name.removesuffix(".toml"), known, n=2, cutoff=0.5)
    guess = f"; did you mean {' or '.join(close)}?" if close else ""
    listing = (f"recipes: {', '.join(known)}" if known else f"no recipes in {shown(recipes_dir())}")
    hint = f"{listing}; or pass the path of a .toml file (see {EXAMPLE_RECIPE})"
    raise RecipeError(f"recipe '{shown(spec)}' not found: not a file, nor a name in recipes/{guess}", hint)


def load(spec: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    path = resolve_path(spec)
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise RecipeError(f"{shown(path)}: not valid TOML: {str(exc)[:300] or type(exc).__name__}", FIX_HINT) \
            from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc  # OSError's str repeats the path
        raise RecipeError(f"{shown(path)}: cannot read the recipe: {why}") from None
    return from_dict(data, overrides, source=str(path))


def from_dict(data: dict[str, Any], overrides: Iterable[str] = (), source: str = "<recipe>") -> Recipe:
    """Validate `data` with `overrides` applied; `source` (a path, shown as the user has it) heads the errors."""
    overrides = list(overrides)
    try:
        return Recipe.model_validate(apply_overrides(data, overrides))
    except ValidationError as exc:
        raise _explain(shown(source), exc, data, overrides) from None
