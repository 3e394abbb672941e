"""Fast portable rollouts for GRPO (no vLLM): static KV cache, compiled CUDA-graph decoding, merged LoRA shadow.

Use from a trainer::

    from rlstack.payload import fastgen
    fastgen.install(trainer.model)      # after GRPOTrainer(...) is built; TRL's model.generate now runs fastgen

or call ``fastgen.generate(model, input_ids, attention_mask, max_new_tokens, generation_config=...)`` directly.
The hook falls back to the model's own generate, once and for the rest of the run, on any failure of the fast
path (the reason is printed); a direct ``fastgen.generate`` call raises instead.
Importing this package does not import torch.
"""

from __future__ import annotations

from rlstack.payload.fastgen.agreement import Divergence, divergences
from rlstack.payload.fastgen.engine import (
    FastGenerator,
    FastgenError,
    FastgenMemoryError,
    MemoryPlan,
    Sampling,
    check_memory,
    error_text,
    generate,
    get_engine,
    plan_memory,
    release,
    resolve_generation_config,
    sampling_from_generation_config,
    sampling_from_resolved,
)
from rlstack.payload.fastgen.hook import failure, install, install_on_trainer, installed, uninstall

__all__ = [
    "Divergence",
    "FastGenerator",
    "FastgenError",
    "FastgenMemoryError",
    "MemoryPlan",
    "Sampling",
    "check_memory",
    "divergences",
    "error_text",
    "failure",
    "generate",
    "get_engine",
    "install",
    "install_on_trainer",
    "installed",
    "plan_memory",
    "release",
    "resolve_generation_config",
    "sampling_from_generation_config",
    "sampling_from_resolved",
    "uninstall",
]
