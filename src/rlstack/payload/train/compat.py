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


def export_mixed_precision(bf16: bool, fp16: bool) -> str:
    """Set ACCELERATE_MIXED_PRECISION from the trainer's precision flags, as transformers 4.x's
    TrainingArguments did (training_args.py:1878 in 4.57.6) and 5.x no longer does (it only reads it).

    unsloth_zoo's GRPO loss and unsloth's generated trainers pick their autocast dtype from this variable,
    falling back to fp16 when it is unset; unsloth exports it itself only when bf16 and fp16 are both False.
    So with transformers 5.5 (the portable stack) and bf16=True, the loss autocasts to fp16 over bf16 LoRA
    weights and dies in `addmm_`: 'self and mat2 must have the same dtype, but got Half and BFloat16' (seen on
    an H200 by the runtime grpo-step probe, signature unsloth-mixed-precision-env). Returns the value set."""
    import os

    value = "bf16" if bf16 else "fp16" if fp16 else "no"
    os.environ["ACCELERATE_MIXED_PRECISION"] = value
    return value
