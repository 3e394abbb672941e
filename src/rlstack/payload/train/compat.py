"""Compatibility shims for the locked library versions: the one place that documents each of them.

Every shim is narrow (harmless on versions without the bug), is called from the payload right where the
broken import or call happens, and can go once the pinned versions move past the bug. For each: the versions it
works around, the symptom as printed, and the upstream reference. A new shim is documented here, nowhere else.

patch_trl_availability_flags() -- trl 0.24.0 + transformers 5.x.
    trl.import_utils stores `_is_package_available(name)` as a bool, but in transformers 5 that function always
    returns a (bool, version) tuple, so every optional package (mergekit, deepspeed, llm_blender, ...) looks
    installed. Symptom, importing GRPOTrainer: `ModuleNotFoundError: No module named 'mergekit'`. We reduce the
    tuples to their bool before trl's trainers import; harmless where nothing is a tuple. Upstream: trl 0.24.0
    was written against transformers 4.x, whose function returns a bool unless asked for the version; remove
    when trl is bumped to a release that supports transformers 5.

alias_guided_decoding_params() -- trl <= 0.25 + vLLM >= 0.12 (seen with trl 0.24.0 and vLLM 0.21.0).
    trl/trainer/grpo_trainer.py:85 (0.24.0) runs `from vllm.sampling_params import GuidedDecodingParams`
    whenever vllm is installed. vLLM 0.11 renamed the class StructuredOutputsParams (vllm PR #22772) and 0.12
    removed the old name (vllm PR #29326). Symptom, importing GRPOTrainer: `ImportError: cannot import name
    'GuidedDecodingParams' from 'vllm.sampling_params'` (signature trl-vllm-guided-decoding-params). Unsloth
    2026.7.5 sets the same alias in unsloth/import_fixes.py when it is imported first, but the transformers
    loader path (model.loader=transformers) never imports unsloth. Upstream: huggingface/trl#4617, fixed by
    trl PR #4797 (later trl releases import StructuredOutputsParams); remove when trl is bumped past it.

ensure_warnings_issued() -- trl 0.24.0 + transformers 5.x.
    GRPOTrainer.__init__ writes `model.warnings_issued["estimate_tokens"]` (grpo_trainer.py:406 in 0.24.0);
    transformers 5 no longer defines `warnings_issued` on PreTrainedModel. Symptom, building the trainer:
    `AttributeError: 'Qwen3ForCausalLM' object has no attribute 'warnings_issued'`. We give the underlying
    model an empty dict when it has none. Upstream: transformers 5 removed the attribute; trl 0.24.0 assumes it.

export_mixed_precision() -- unsloth / unsloth_zoo (2026.6.x) + transformers 5.x.
    transformers 4.x's TrainingArguments exported ACCELERATE_MIXED_PRECISION (training_args.py:1878 in 4.57.6);
    5.x only reads it. unsloth_zoo's GRPO loss takes its autocast dtype from it and assumes fp16 when unset.
    Symptom with bf16=True on a GPU: `self and mat2 must have the same dtype, but got Half and BFloat16`
    (signature unsloth-mixed-precision-env). We export it from the trainer's bf16/fp16 flags.
    Upstream: unsloth_zoo/rl_replacements.py:799 (unsloth-zoo 2026.6.1).

load_lora_outside_inference_mode() -- unsloth_zoo 2026.7.6 to 2026.10.6 + torchao Float8Tensor base weights (the fp8
stack: load_in_fp8=True on vLLM 0.21.0, torchao 0.18.0, torch 2.11).
    vLLM 0.21 has no online `fp8_per_channel` quantization, so for load_in_fp8=True (row-wise) zoo 2026.10.6 has vLLM
    quantize through torchao (vllm_utils.py:2781-2811 and 4379-4392), and the training model shares vLLM's torchao
    Float8Tensor weights, built under torch.inference_mode (convert_vllm_to_huggingface, vllm_utils.py:1928). Every
    GRPO rollout asks zoo's load_lora (vllm_utils.py:6189, `@torch.inference_mode`) for the LoRARequest, and it
    reads the adapter from `model.state_dict()` (vllm_utils.py:6225), which detaches every parameter; detaching a
    Float8Tensor inside inference mode fails. Symptom, at the first rollout: `RuntimeError: Cannot set version_counter
    for inference tensor` from torch/nn/modules/module.py _save_to_state_dict (with zoo 2026.7.6:
    bench/results/archive/sm90/fp8-3345fbfe2076-train-4b-cast-forced.log; 2026.10.6 has the same code). We rebind
    model.load_lora to zoo's undecorated function (its `__wrapped__`) run under torch.no_grad(), the mode zoo already
    uses for torchao weights in get_vllm_state_dict (vllm_utils.py:1108-1115). Acts only on a model that has torchao
    weights and whose load_lora is zoo's decorated partial. Upstream: pytorch/pytorch#170419 (view ops on tensor
    subclasses in inference mode); remove when zoo's load_lora stops running under inference mode.
    Why the weights are no longer inference tensors by then: the Trainer's `model.to(device)` (transformers 4.57.6
    trainer.py:609-612) goes through Module._apply, which swaps wrapper subclasses for fresh ones made outside
    inference mode. Reproduced on CPU (torch 2.10, torchao 0.18, Float8Tensor PerRow): state_dict() under inference
    mode passes on the Parameter convert_vllm_to_huggingface builds, fails after `.to(device)`, and passes under
    no_grad in both states (docs/archive/notes.md, pre-flight reading for fp8 at 2026.10.6).

mark_torchao_fp8_for_no_grad() -- unsloth 2026.10.6 with load_in_fp8=True on a local folder (symptom predicted, not
yet seen).
    Unsloth runs the GRPO old-logprob forwards under torch.no_grad() for a model tagged `torchao_config` and under
    inference mode otherwise (models/_utils.py:7869-7889; rl_replacements.py:2562, 2683, 2748, 2918), because
    aten-level views of torchao tensors fail in inference mode. from_pretrained means to tag a load_in_fp8 model
    (models/loader.py:1860-1861), but for a local folder the fp8 mode it passes is None (it is only computed in a
    branch get_model_name never takes, loader.py:1290-1325 and loader_utils.py:1662-1663), so the tag raises inside
    and a bare except swallows it (loader_utils.py:1763-1773). The forward as read uses only torchao ops that stay
    clear of aten views (W.contiguous(), W.t(), torch.matmul, dequantize), so this is a guard: should any aten view
    of a Float8Tensor run there, the symptom would be 'Cannot set version_counter for inference tensor' inside
    _get_per_token_logps_and_entropies. We tag the model the way Unsloth meant to, with its own
    _tag_model_with_fp8_torchao_config(model, "row") (row: what load_in_fp8=True asks for). Remove when Unsloth
    tags local-folder FP8 loads itself.

keep_recipe_loss_options() -- unsloth's generated GRPOConfig, loss_type "dapo" (unsloth 2026.6.1 and 2026.10.6).
    Unsloth replaces trl.GRPOConfig with UnslothGRPOConfig (unsloth/models/rl.py, _patch_trl_rl_trainers_impl), whose
    __init__ sets DAPO's mask_truncated_completions=True and epsilon_high=0.28 for an explicit loss_type "dapo": at
    2026.6.1 whatever the caller passed (rl.py:1478-1486), at 2026.10.6 only where the caller left them unset (None;
    rl.py:3281-3287). Left unset, the same recipe trains with masking under Unsloth and without under
    transformers; and where the loss honours the mask (truncation_mask_applies below), a step whose completions were
    all cut has an empty loss (grad norm 0 though rewards differ: fp8's grpo-step probe, signature
    unsloth-dapo-masks-truncated). We pass the recipe's values and set them back after the config is built (TRL reads
    both when the trainer is built: grpo_trainer.py:363, 393 in 0.24.0), saying so. Remove when no locked unsloth
    overwrites an explicit value (2026.10.6 no longer does; 2026.6.1 in portable still does).

truncation_mask_applies() -- unsloth_zoo 2026.6.1's GRPO loss + TRL's mask_truncated_completions.
    Not a patch: whether the loss really drops truncated completions. TRL zeroes their rows of completion_mask
    (grpo_trainer.py:1391-1395 in 0.24.0); zoo 2026.6.1's grpo_accumulated_loss rebuilds completion_mask from the
    token ids (rl_replacements.py:857), which undoes that, so masking is a no-op on portable's Unsloth path; zoo
    2026.10.6 keeps TRL's rows and reapplies them (rl_replacements.py:1590-1601, 2278-2279). rlstack train says
    when a recipe's masking has no effect, and only claims a masked-out step where the loss honours the mask.
    Releases between the two were not read: they are taken as not honouring it (no claim rather than a wrong one).

rlstack.payload.serve (alias_get_open_port, the SamplingParams keywords, and the GuidedDecodingParams alias in
the server's own processes) -- trl 0.24.0's `vllm-serve` script + vLLM 0.21.0. Symptoms: `cannot import name
'get_open_port' from 'vllm.utils'` and `Unexpected keyword argument 'truncate_prompt_tokens'` on every
/generate/ (signatures trl-vllm-serve-get-open-port, trl-vllm-serve-sampling-kwargs). They live in serve.py
because they must run in the server's process and its spawned vLLM workers, before trl's script imports;
serve.py's docstring has the line-by-line reading. Remove with a trl whose vllm-serve supports the locked vLLM.

(Not a library shim, but the same kind of fix: rlstack.payload.evaluate.gsm8k.generate_inputs passes generate()
only the encoding keys the model takes, for transformers 4.57.6 tokenizers that return token_type_ids:
"ValueError: The following `model_kwargs` are not used by the model: ['token_type_ids']", signature
hf-generate-unused-token-type-ids.)
"""

from __future__ import annotations

import contextlib
from typing import Any


def patch_trl_availability_flags() -> list[str]:
    """Fix trl's `_*_available` flags in place; return the names that were fixed."""
    import trl.import_utils as iu

    fixed = []
    for name in dir(iu):
        value = getattr(iu, name)
        if name.startswith("_") and name.endswith("_available") and isinstance(value, tuple):
            setattr(iu, name, bool(value[0]))
            fixed.append(name)
    return fixed


def alias_guided_decoding_params() -> bool:
    """Give `vllm.sampling_params` the `GuidedDecodingParams` name trl 0.24 imports (see the module docstring).

    Acts only when vllm is installed and its sampling_params has StructuredOutputsParams but not the old name,
    so it is a no-op without vllm, with an older vLLM, or after unsloth has set the same alias. Returns whether it
    set the alias. Call before `from trl import GRPOTrainer`. trl 0.24 only builds the class for
    guided_decoding_regex, as GuidedDecodingParams(regex=...), which StructuredOutputsParams accepts too.
    """
    import importlib
    import importlib.util
    import sys

    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is None:
        return False
    try:
        sp = importlib.import_module("vllm.sampling_params")
    except ImportError:  # a vllm that does not import: leave the error to trl's own import, which names it
        return False
    if hasattr(sp, "GuidedDecodingParams") or not hasattr(sp, "StructuredOutputsParams"):
        return False
    sp.GuidedDecodingParams = sp.StructuredOutputsParams  # type: ignore[attr-defined]
    return True


def ensure_warnings_issued(model: Any) -> None:
    """trl 0.24.0's GRPOTrainer writes `model.warnings_issued[...]`, an attribute transformers 5 no longer
    defines on PreTrainedModel; give the underlying model an empty dict so the trainer can start."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    for m in (inner, getattr(inner, "model", None)):
        if m is not None and not hasattr(m, "warnings_issued"):
            with contextlib.suppress(AttributeError):
                m.warnings_issued = {}


def has_torchao_weights(model: Any) -> bool:
    """Whether any parameter of the model is a torchao tensor subclass (Float8Tensor and kin)."""
    return any(type(p).__module__.startswith("torchao") for p in model.parameters())


def load_lora_outside_inference_mode(model: Any) -> bool:
    """Make `model.load_lora` (zoo's `functools.partial(load_lora, model)`, set by Unsloth's get_peft_model) run
    without inference mode, under torch.no_grad(); see the module docstring. Returns whether it rebound it: only when
    the model has torchao weights and load_lora is a partial over a function decorated with torch.inference_mode
    (which leaves the original as `__wrapped__`). Call after get_peft_model and before building the trainer, which
    looks the attribute up (rl.py:4060 and rl_replacements.py:4021 in unsloth 2026.10.6)."""
    import functools

    bound = getattr(model, "load_lora", None)
    if not isinstance(bound, functools.partial):
        return False
    raw = getattr(bound.func, "__wrapped__", None)
    if raw is None or not callable(raw) or not has_torchao_weights(model):
        return False
    head, fixed = bound.args, dict(bound.keywords)

    @functools.wraps(raw)
    def load_lora(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.inference_mode(False), torch.no_grad():
            return raw(*head, *args, **{**fixed, **kwargs})

    load_lora.rlstack_shim = "load_lora_outside_inference_mode"  # type: ignore[attr-defined]
    model.load_lora = load_lora
    return True


def mark_torchao_fp8_for_no_grad(model: Any) -> bool:
    """Tag a torchao-FP8 model with Unsloth's `torchao_config` when from_pretrained did not (see the module
    docstring), so Unsloth's GRPO forwards outside training run under no_grad instead of inference mode. Returns
    whether it tagged it: only when the model has torchao weights, no tag yet, and unsloth provides the tagger."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(inner, "torchao_config", None) is not None or not has_torchao_weights(model):
        return False
    try:
        from unsloth.models.loader_utils import _tag_model_with_fp8_torchao_config
    except ImportError:
        return False
    _tag_model_with_fp8_torchao_config(inner, "row")  # swallows its own errors, hence the check below
    return getattr(inner, "torchao_config", None) is not None


def export_mixed_precision(bf16: bool, fp16: bool) -> str:
    """Set ACCELERATE_MIXED_PRECISION from the trainer's precision flags, as transformers 4.x's
    TrainingArguments did (training_args.py:1878 in 4.57.6) and 5.x no longer does (it only reads it).

    unsloth_zoo's GRPO loss and unsloth's generated trainers pick their autocast dtype from this variable,
    falling back to fp16 when it is unset; unsloth exports it itself only when bf16 and fp16 are both False.
    So with transformers 5.5 (the portable stack) and bf16=True, the loss autocasts to fp16 over bf16 LoRA
    weights and dies in `addmm_`: 'self and mat2 must have the same dtype, but got Half and BFloat16' (the
    runtime grpo-step probe's signature unsloth-mixed-precision-env). Returns the value set."""
    import os

    value = "bf16" if bf16 else "fp16" if fp16 else "no"
    os.environ["ACCELERATE_MIXED_PRECISION"] = value
    return value


def keep_recipe_loss_options(config: Any, mask_truncated: bool, epsilon_high: float | None) -> list[str]:
    """Set back what a patched GRPOConfig changed of the recipe's loss options, saying so once (module docstring:
    Unsloth's config sets DAPO's values for loss_type "dapo"). Returns what was set back."""
    import sys

    changed = []
    for field, want in (("mask_truncated_completions", mask_truncated), ("epsilon_high", epsilon_high)):
        got = getattr(config, field, want)
        if got != want:
            setattr(config, field, want)
            changed.append(f"{field} {got!r} -> {want!r}")
    if changed:
        print(f"rlstack train: the recipe's loss options kept over the trainer config's ({'; '.join(changed)}; "
              "set grpo.mask_truncated_completions / grpo.epsilon_high in the recipe to change them)",
              file=sys.stderr)
    return changed


# The first unsloth_zoo release read whose GRPO loss keeps TRL's truncated-row mask (module docstring).
ZOO_HONOURS_TRUNCATION_MASK = "2026.10.6"


def truncation_mask_applies(mask_truncated: bool, loader: str, zoo_version: str | None) -> bool:
    """Whether the loss drops truncated completions: the recipe asks for it and the loss that runs honours it
    (TRL's own does; under an Unsloth loader, unsloth_zoo's from ZOO_HONOURS_TRUNCATION_MASK). `zoo_version`:
    the installed or recorded unsloth_zoo version (None: not known, so no claim)."""
    if not mask_truncated:
        return False
    if not loader.startswith("unsloth"):
        return True
    from packaging.version import InvalidVersion, Version

    try:
        return zoo_version is not None and Version(zoo_version) >= Version(ZOO_HONOURS_TRUNCATION_MASK)
    except InvalidVersion:
        return False
