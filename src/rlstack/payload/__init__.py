"""The payload: what runs inside a stack (recipes, data, prompt, rewards, train, evaluate, fastgen)."""

import logging

# A bound on GRPO steps, for --max-steps and the recipe's grpo.max_steps alike: a typo such as
# 99999999999999999999 would otherwise start a run that never ends, its step counter past TRL's int64 state.
MAX_STEPS = 10_000_000


class _NoKernelsHubWarning(logging.Filter):
    """bitsandbytes' CPU backend tries the optional `kernels` package for a faster 4-bit CPU matmul at import, and
    logs a warning when it is missing. peft imports bitsandbytes whenever it is installed, so every CPU command
    printed it, though rlstack never runs 4-bit on the CPU (it loads the model unquantized there). Only that one
    message is dropped; every other bitsandbytes warning still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_NoKernelsHubWarning())
