"""Fast portable rollouts for GRPO (no vLLM): static KV cache, compiled CUDA-graph decoding, merged LoRA shadow.

Use from a trainer::

    from rlstack.payload import fastgen
    fastgen.install(trainer.model)      # after GRPOTrainer(...) is built; TRL's model.generate now runs fastgen

or call ``fastgen.generate(model, input_ids, attention_mask, max_new_tokens, generation_config=...)`` directly.
Engine options are a ``FastgenOptions`` (``fastgen.options``; docs/fastgen-options.md lists them).
The hook falls back to the model's own generate, once and for the rest of the run, on any failure of the fast
path (the reason is printed); a direct ``fastgen.generate`` call raises instead.
Importing this package does not import torch.
"""

from __future__ import annotations

from rlstack.payload.fastgen.agreement import Divergence, divergences
from rlstack.payload.fastgen.api import generate, get_engine, release
from rlstack.payload.fastgen.engine import FastGenerator
from rlstack.payload.fastgen.errors import FastgenError, error_text
from rlstack.payload.fastgen.hook import failure, install, install_on_trainer, installed, uninstall
from rlstack.payload.fastgen.memory import FastgenMemoryError, MemoryPlan, check_memory, plan_memory
from rlstack.payload.fastgen.options import FastgenOptions, options_table
from rlstack.payload.fastgen.sampling import (
    Sampling,
    resolve_generation_config,
    sampling_from_generation_config,
    sampling_from_resolved,
)

__all__ = [
    "Divergence",
    "FastGenerator",
    "FastgenError",
    "FastgenMemoryError",
    "FastgenOptions",
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
    "options_table",
    "plan_memory",
    "release",
    "resolve_generation_config",
    "sampling_from_generation_config",
    "sampling_from_resolved",
    "uninstall",
]
