"""Shims for the locked library versions (rlstack.payload.train.compat)."""

from __future__ import annotations

import pytest


def test_mixed_precision_is_exported_for_unsloth(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5 no longer exports ACCELERATE_MIXED_PRECISION; unsloth's loss reads it (default fp16)."""
    from rlstack.payload.train.compat import export_mixed_precision

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    assert export_mixed_precision(True, False) == "bf16"
    import os

    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert export_mixed_precision(False, True) == "fp16"
    assert export_mixed_precision(False, False) == "no"
