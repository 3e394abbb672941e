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
