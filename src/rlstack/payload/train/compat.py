"""Compatibility shims for the locked library versions, each with the reason it exists.

trl 0.24.0 + transformers 5.x: trl.import_utils stores `_is_package_available(name)` as a bool, but in
transformers 5 that function always returns a (bool, version) tuple, so every optional package (mergekit,
deepspeed, llm_blender, ...) looks installed and importing GRPOTrainer fails with
`ModuleNotFoundError: No module named 'mergekit'`. We reduce those tuples to their bool before trl's trainers
import. Harmless on versions without the bug (nothing is a tuple there). Remove when trl is bumped.
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
