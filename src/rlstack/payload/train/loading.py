"""Model loading by what the stack has: Unsloth's FastLanguageModel where it imports, else transformers + peft
(+ bitsandbytes 4-bit on a GPU when the recipe asks). The FP8 RL path (load_in_fp8 + fast_inference, vLLM
rollouts) is only tried when asked for with --fp8, and fails with a message that points at the probe.

Imports of torch/transformers/peft/unsloth happen inside these functions: `import rlstack.payload.train.loading` is
cheap, and unsloth is imported before transformers/trl when it is used, which it requires for its patches.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlstack.core.errors import RlstackError
from rlstack.payload.recipes import LoraSpec, ModelSpec


class ModelLoadError(RlstackError):
    pass


class Fp8UnavailableError(RlstackError):
    exit_code = 8


@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    base_model: str  # the id recorded in the adapter manifest
    loader: str  # "unsloth", "unsloth-fp8", "transformers", "transformers+bnb4"
    device: str


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def cuda_available() -> bool:
    if not has("torch"):
        return False
    import torch

    return bool(torch.cuda.is_available())


def torch_dtype(name: str) -> Any:
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, name)


def resolve_base(spec: ModelSpec) -> tuple[str, str]:
    """(what to load: hub id or folder, the id recorded as base_model). 'tiny' and 'embedded:<key>' are built
    or fetched into a local folder first; the recorded id names them, not the folder, so evaluation finds the
    same base on another machine."""
    if spec.name == "tiny":
        from rlstack.payload import tiny

        assert spec.tiny is not None
        return str(tiny.ensure(spec.tiny)), tiny.model_id(spec.tiny)
    from rlstack.payload import embedded

    if embedded.is_embedded(spec.name):
        return str(embedded.ensure(spec.name)), embedded.lookup(spec.name).name
    check_model_name(spec.name)
    return spec.name, spec.name


def check_config_readable(path: Path, transformers_version: str | None = None) -> None:
    """Refuse a config.json this stack's transformers would misread: one written by transformers 5 keeps its RoPE
    base only in rope_parameters, and transformers 4 (and vLLM through it) would silently run the model with
    rope_theta 10000 instead (rlstack.payload.model_config)."""
    import json
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        installed = transformers_version or version("transformers")
    except PackageNotFoundError:
        return
    if Version(installed).major >= 5:
        return
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: unreadable ({exc})", "save the model again (config.json is JSON)") from None
    from rlstack.payload import model_config

    missing = model_config.unread_by_v4(config) if isinstance(config, dict) else {}
    if missing:
        raise ModelLoadError(
            f"{path} keeps its RoPE settings only in rope_parameters (transformers 5 wrote it); transformers "
            f"{installed} in this stack reads {', '.join(missing)} from the top level and would run the model "
            "with its defaults (rope_theta 10000), silently",
            f"add {json.dumps(missing)} to {path} (transformers 5 reads the same values), or use a stack with "
            "transformers >= 5")


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def check_model_name(name: str) -> None:
    """A model given as a folder must exist, and anything else must be a hub id ('org/name'), so a typo in a
    path is reported as the missing folder it is, not as the hub's "repo id must be in the form ..." message."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():  # else transformers' own traceback, after the data loaded
            raise ModelLoadError(f"model folder {name!r} holds no config.json: not a model folder",
                                 "pass the folder a model was saved to (config.json beside its weights)")
        check_config_readable(folder / "config.json")
        return
    looks_local = name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/") or "\\" in name
    if looks_local or not HUB_ID.fullmatch(name) or ".." in name or "--" in name:
        path = Path(name).expanduser()
        what = "is a file, not a model folder" if path.is_file() else "does not exist"
        raise ModelLoadError(f"model folder {name!r} {what}",
                             "pass an existing folder holding config.json and the weights, a hub id such as "
                             "Qwen/Qwen3-0.6B, 'tiny' or 'embedded:smollm2-135m'")


def check_fp8() -> None:
    """The FP8 RL path needs unsloth, vllm and a CUDA GPU in one environment; say which part is missing."""
    missing = [m for m in ("unsloth", "vllm") if not has(m)]
    problems = []
    if missing:
        problems.append(f"not installed here: {', '.join(missing)}")
    if not cuda_available():
        problems.append("no CUDA GPU visible")
    if problems:
        raise Fp8UnavailableError(
            "the FP8 RL path (Unsloth load_in_fp8 + fast_inference with vLLM rollouts) is not available: "
            + "; ".join(problems),
            "run 'invoke probe-fp8' to see which wall this stack hits (the report found three on Blackwell); "
            "train without --fp8 for the portable path",
        )


def load_for_training(spec: ModelSpec, lora: LoraSpec, *, fp8: bool = False, seed: int = 0,
                      gradient_checkpointing: bool = False) -> Loaded:
    target, base_id = resolve_base(spec)
    if fp8 or spec.load_in_fp8:
        check_fp8()
        return _load_unsloth(target, base_id, spec, lora, fp8=True, seed=seed, gc=gradient_checkpointing)
    if spec.loader == "unsloth" or (spec.loader == "auto" and has("unsloth") and cuda_available()
                                    and spec.name != "tiny"):
        return _load_unsloth(target, base_id, spec, lora, fp8=False, seed=seed, gc=gradient_checkpointing)
    return _load_transformers(target, base_id, spec, lora, gc=gradient_checkpointing)


def _load_unsloth(target: str, base_id: str, spec: ModelSpec, lora: LoraSpec, *, fp8: bool, seed: int,
                  gc: bool) -> Loaded:
    if not has("unsloth"):
        raise RlstackError("model.loader = 'unsloth', but unsloth is not installed in this Python",
                           "use a stack that has it (portable, fp8), or model.loader = 'auto'")
    import unsloth  # noqa: F401  (must come before transformers/trl for its patches)
    from unsloth import FastLanguageModel

    from rlstack.payload import kernelcache

    # importing unsloth pops TORCHINDUCTOR_CACHE_DIR (unsloth_zoo patching_utils.py, patch_torch_compile), and torch
    # may have written its /tmp default back since: put the kernel-cache folder back (only where RLSTACK_KERNEL_CACHE
    # is set; kernelcache.reclaim_inductor says why both)
    kernelcache.apply()
    kernelcache.reclaim_inductor()

    kwargs: dict[str, Any] = dict(model_name=target, max_seq_length=spec.max_seq_length, dtype=None)
    if fp8:
        # Unsloth takes True for row-wise FP8 and "block" for block-wise (recipes.ModelSpec.fp8_scheme says why)
        kwargs.update(load_in_fp8=True if spec.fp8_scheme == "row" else "block", fast_inference=True,
                      max_lora_rank=lora.r, load_in_4bit=False)
    else:
        kwargs.update(load_in_4bit=spec.load_in_4bit)
        _say_if_requantized(target, spec.load_in_4bit)
    try:
        model, tokenizer = FastLanguageModel.from_pretrained(**kwargs)
    except Exception as exc:
        if "valid pad token" in str(exc):  # unsloth_zoo >= 2026.10 refuses where older zoo failed later (below)
            raise pad_token_error(target, str(exc)[:300]) from exc
        if fp8:
            raise Fp8UnavailableError(
                f"Unsloth could not load {target} with load_in_fp8={kwargs['load_in_fp8']!r}: "
                f"{type(exc).__name__}: {str(exc)[:500]}",
                "run 'invoke probe-fp8' to classify the wall; try the other scheme (--set model.fp8_scheme=row or "
                "block); train without --fp8 for the portable path",
            ) from exc
        raise
    check_pad_token(tokenizer, model, target)
    layers = top_layers(model, lora)
    model = FastLanguageModel.get_peft_model(
        model,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        use_gradient_checkpointing="unsloth" if gc else False,
        random_state=seed,
        **({"layers_to_transform": layers} if layers is not None else {}),
    )
    if fp8:
        from rlstack.payload.train.compat import load_lora_outside_inference_mode, mark_torchao_fp8_for_no_grad

        # zoo's load_lora detaches the torchao FP8 weights under inference mode at every rollout, and Unsloth leaves a
        # local-folder FP8 model untagged, so its logprob forwards run under inference mode too (compat.py)
        shimmed = [name for name, shim in (("load_lora under no_grad", load_lora_outside_inference_mode),
                                           ("torchao_config tag", mark_torchao_fp8_for_no_grad)) if shim(model)]
        if shimmed:
            print(f"rlstack: torchao FP8 weights: {', '.join(shimmed)} (rlstack.payload.train.compat)",
                  file=sys.stderr)
    return Loaded(model, tokenizer, base_id, "unsloth-fp8" if fp8 else "unsloth", "cuda")


def pad_token_error(target: str, detail: str) -> ModelLoadError:
    return ModelLoadError(
        f"{target}: no usable pad token for Unsloth: {detail}. Unsloth takes a pad token equal to the eos token (or "
        "none) as missing and adds a new one; past the model's embedding rows, the first padded GRPO batch indexes "
        "out of range (a CUDA device-side assert)",
        "give the tokenizer a pad token of its own that is in the vocabulary (an unused reserved token, or the unk "
        "token: tokenizer.pad_token = ...; save it with the model), or resize the model's embeddings to the "
        "tokenizer; rlstack's tiny model has one since tokenizer revision 2",
    )


def check_pad_token(tokenizer: Any, model: Any, target: str) -> None:
    """Refuse before training when the tokenizer's pad id has no embedding row. Unsloth (zoo 2026.6.1) replaces a
    pad token equal to eos with a token it appends to the tokenizer without resizing the model, so the loss's
    gather reads past the embeddings: on CUDA, 'index out of bounds' device-side asserts in
    grpo_accumulated_loss, after the whole rollout, instead of this message at load time."""
    inner = getattr(tokenizer, "tokenizer", None) or tokenizer  # a processor wraps its tokenizer
    pad = getattr(inner, "pad_token_id", None)
    try:
        rows = int(model.get_input_embeddings().weight.shape[0])
    except (AttributeError, TypeError, IndexError):
        return  # no embedding matrix to check against: nothing to refuse
    if isinstance(pad, int) and pad >= rows:
        raise pad_token_error(target, f"its pad token {getattr(inner, 'pad_token', None)!r} has id {pad}, past the "
                                      f"model's {rows} embedding rows")


def _say_if_requantized(target: str, four_bit: bool) -> None:
    from rlstack.payload import embedded

    notice = embedded.requantize_notice(target) if four_bit else None
    if notice:
        print(notice, file=sys.stderr, flush=True)


def nf4_config(compute_dtype: Any) -> Any:
    """QLoRA's base as rlstack asks bitsandbytes for it (NF4, double quantization, computing in COMPUTE_DTYPE): one
    definition for the transformers loader and the benches that load the same base."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype)


def load_base_transformers(target: str, spec: ModelSpec) -> tuple[Any, Any, str, str]:
    """(model, tokenizer, loader name, device): plain transformers, 4-bit NF4 when asked for on a GPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    on_gpu = torch.cuda.is_available()
    kwargs: dict[str, Any] = {"dtype": torch_dtype(spec.dtype)}
    loader = "transformers"
    if spec.load_in_4bit and on_gpu:
        if not has("bitsandbytes"):
            raise ModelLoadError("load_in_4bit needs bitsandbytes, which is not installed in this stack",
                                 "use a stack with bitsandbytes, or --set model.load_in_4bit=false")
        kwargs["quantization_config"] = nf4_config(kwargs["dtype"])
        loader = "transformers+bnb4"
        _say_if_requantized(target, True)
    elif spec.load_in_4bit:
        print("rlstack: no CUDA GPU: loading the model unquantized (4-bit needs bitsandbytes on a GPU)",
              file=sys.stderr)
    if on_gpu:
        kwargs["device_map"] = {"": 0}
    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
        model = AutoModelForCausalLM.from_pretrained(target, **kwargs)
    except (OSError, ValueError) as exc:  # ValueError: huggingface_hub's HFValidationError of a malformed id
        raise ModelLoadError(f"could not load model {target!r}: {str(exc)[:400]}",
                             "offline? set HF_HUB_OFFLINE=1 with a filled HF cache, or use a local folder; to try "
                             "rlstack without a download: --recipe smoke-cpu (a tiny model built locally)") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, loader, "cuda" if on_gpu else "cpu"


def top_layers(model: Any, lora: LoraSpec) -> list[int] | None:
    """The indices of the last lora.top_layers decoder layers (None: every layer)."""
    if lora.top_layers is None:
        return None
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    total = int(config.num_hidden_layers)
    if lora.top_layers > total:
        raise ModelLoadError(f"lora.top_layers = {lora.top_layers}, but the model has {total} layers",
                             f"set lora.top_layers to at most {total}, or remove it to adapt every layer")
    return list(range(total - lora.top_layers, total))


def _load_transformers(target: str, base_id: str, spec: ModelSpec, lora: LoraSpec, *, gc: bool) -> Loaded:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    model, tokenizer, loader, device = load_base_transformers(target, spec)
    if loader == "transformers+bnb4":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gc)
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in lora.target_modules if t in present]
    if not targets:
        raise ModelLoadError(f"none of the LoRA target modules {lora.target_modules} exist in {target}",
                             f"set lora.target_modules to some of: {', '.join(sorted(present)[:30])}")
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                        task_type="CAUSAL_LM", bias="none", layers_to_transform=top_layers(model, lora))
    if gc and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    model = get_peft_model(model, config)
    return Loaded(model, tokenizer, base_id, loader, device)
