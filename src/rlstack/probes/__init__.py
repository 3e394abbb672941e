"""Probes: questions about a stack answered before (static layers) or inside (runtime layer) a build.

Layers: `resolve` (do the pins resolve together), `contract` (do the packages' sources, read from the
locked wheels without importing them, still fit each other), `toolchain` (GPU arch x CUDA toolkit x
kernel-library rules, each with the file and line it comes from) and `runtime` (CUDA, bitsandbytes, FP8,
vLLM + LoRA, one GRPO step on a real GPU). Cases and rules are data (YAML beside this file); the code is
the general mechanism. Importing this package is cheap: no torch, no network.
"""

from rlstack.probes.model import Evidence, ProbeReport, ProbeResult, Status

__all__ = ["Evidence", "ProbeReport", "ProbeResult", "Status"]
