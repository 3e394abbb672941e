"""The pure stack model, below both the host and the probes: stack files (`model`), what a lock is (`locks`),
writing locks with uv (`resolver`) and this machine's settings (`settings`). Nothing here drives Docker.

The stack model's names are this package's face, so `from rlstack import stacks; stacks.load_stack(...)` reads as
it always did."""

from rlstack.stacks.model import (
    Stack,
    ToolkitSpec,
    TorchSpec,
    load_all,
    load_stack,
    load_stack_file,
    read_requirement_lines,
    resolve_names,
    stack_names,
)

__all__ = ["Stack", "ToolkitSpec", "TorchSpec", "load_all", "load_stack", "load_stack_file",
           "read_requirement_lines", "resolve_names", "stack_names"]
