"""Fast portable rollouts for GRPO (no vLLM): static KV cache, compiled CUDA-graph decoding, merged LoRA shadow.

Use from a trainer::

    from rlstack.payload import fastgen
    fastgen.install(trainer.model)      # after GRPOTrainer(...) is built; TRL's model.generate now runs fastgen

or call ``fastgen.generate(model, input_ids, attention_mask, max_new_tokens, generation_config=...)`` directly.
Importing this package does not import torch.
"""

from __future__ import annotations

from rlstack.payload.fastgen.engine import (
    FastGenerator,
    FastgenError,
    Sampling,
    generate,
    get_engine,
    sample_next,
    sampling_from_generation_config,
)
from rlstack.payload.fastgen.hook import install, install_on_trainer, installed, uninstall

__all__ = [
    "FastGenerator",
    "FastgenError",
    "Sampling",
    "generate",
    "get_engine",
    "install",
    "install_on_trainer",
    "installed",
    "sample_next",
    "sampling_from_generation_config",
    "uninstall",
]
