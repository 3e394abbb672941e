"""A model folder's config.json as both transformers majors read it.

transformers 5 keeps a model's RoPE settings only inside `rope_parameters`; transformers 4 (the fp8 stack's
4.57, and vLLM 0.21 reading configs through it) reads `rope_theta` and `rope_scaling` from the top level and,
where they are missing, falls back to its defaults (rope_theta 10000) without a word. The same weights then run
with another positional encoding. Standard library only: the conversion of the embedded models and the check
of a user's folder both use it."""

from __future__ import annotations

from typing import Any


def legacy_rope_keys(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with the RoPE base (and any scaling) also at the top level, where transformers 4 reads them;
    transformers 5 reads those keys as the same values, so one folder serves both. A config that says them
    already, or has no rope_parameters, comes back as it is."""
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict):
        return config
    out = dict(config)
    if "rope_theta" in rope:
        out.setdefault("rope_theta", rope["rope_theta"])
    if rope.get("rope_type", "default") != "default":
        out.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    return out


def unread_by_v4(config: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys (with their values) that transformers 4 would need and `config` lacks: {} when it
    reads the model as transformers 5 does."""
    return {k: v for k, v in legacy_rope_keys(config).items() if k not in config}
