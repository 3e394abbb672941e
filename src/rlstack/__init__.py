"""rlstack: hash-locked container stacks for GRPO fine-tuning, and the probes that map where they run."""

__version__ = "0.1.0"
