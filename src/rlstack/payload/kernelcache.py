"""One folder for every compiled-kernel cache of a stack, so that a second run does not compile again.

Why: a vLLM start of the fp8 stack compiles FlashInfer's sampling module and its FP8 block-scale GEMM with nvcc,
then torch.compile and Triton's training kernels on top, for minutes: every run, because each library keeps its
cache where the run cannot keep it. Unsloth points FlashInfer at `unsloth_compiled_cache` in the working folder
(unsloth_zoo vllm_utils.py, `_maybe_set_flashinfer_workspace_base`), which a container's read-only root turns into
/tmp (tmpfs, gone at exit); vLLM's and Triton's caches follow XDG_CACHE_HOME and the home folder, both tmpfs in
rlstack's containers. docs/archive/notes.md has the measured timings.

`RLSTACK_KERNEL_CACHE=DIR` names the folder (the images set it to the kernel-cache volume; native runs may set it
too); each library's own variable is then set under DIR/<stack>-<lock hash> (one volume serves every stack, and
no stack reads what another lock's libraries generated: Unsloth's generated trainer code is per release), unless
the user set that variable already. Nothing is set when RLSTACK_KERNEL_CACHE is absent: the libraries keep their
defaults.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

ROOT_ENV = "RLSTACK_KERNEL_CACHE"

# Each library's cache variable and its folder under the root. Read by each library at import or first compile,
# so `apply` must run before torch, vllm, unsloth or flashinfer are imported (rlstack's CLI does it first).
VARIABLES: dict[str, str] = {
    "UNSLOTH_COMPILE_LOCATION": "unsloth_compiled_cache",  # unsloth_zoo compiler.py: its generated trainer code
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",  # flashinfer jit/env.py: JIT modules under <base>/.cache/flashinfer
    "VLLM_CACHE_ROOT": "vllm",  # vLLM's torch.compile (AOT) cache and DeepGEMM's JIT
    "TRITON_CACHE_DIR": "triton",  # Triton kernels: Unsloth's, vLLM's LoRA (punica) and FP8 kernels
    "TORCHINDUCTOR_CACHE_DIR": "inductor",  # torch.compile's generated code
}


def scope_name(environ: MutableMapping[str, str]) -> str:
    """The folder of one stack at one lock: the images say both (RLSTACK_STACK, RLSTACK_LOCK_HASH); a native
    install says neither, and its caller gives each stack its own root."""
    stack = environ.get("RLSTACK_STACK", "").strip() or "native"
    lock = environ.get("RLSTACK_LOCK_HASH", "").strip()[:12]
    return f"{stack}-{lock}" if lock else stack


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the libraries' cache variables under $RLSTACK_KERNEL_CACHE (creating the folders); return what was set.
    A variable already set is the user's choice and stays."""
    env = os.environ if environ is None else environ
    root = env.get(ROOT_ENV, "").strip()
    if not root:
        return {}
    done: dict[str, str] = {}
    scope = Path(root) / scope_name(env)
    for name, sub in VARIABLES.items():
        if env.get(name):
            continue
        path = scope / sub
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            # an unwritable cache must not stop a run: the library falls back to its default, which compiles again
            continue
        env[name] = str(path)
        done[name] = str(path)
    return done


INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"


def torch_default_inductor_dir() -> str:
    """torch's own Inductor cache folder (/tmp/torchinductor_<user>), the value torch writes into os.environ."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return str(default_cache_dir())


def reclaim_inductor(environ: MutableMapping[str, str] | None = None, torch_default: str | None = None) -> str | None:
    """Put TORCHINDUCTOR_CACHE_DIR back under $RLSTACK_KERNEL_CACHE after `import unsloth`; return the folder set
    (None: nothing to do).

    Why: unsloth_zoo's patch_torch_compile, run once at `import unsloth`, pops the variable (patching_utils.py:131
    at 2026.6.1, :232 at 2026.10.6), and torch writes its own /tmp default back into os.environ the first time
    anything asks for the folder (`import torch._dynamo` does, and so does any compile: cache_dir_utils.cache_dir).
    `apply` would take that default for the user's choice and keep it, and Inductor's FX-graph and AOTAutograd
    caches (the bulk of a GRPO step's compile) would land on tmpfs again. A value that is neither unset nor torch's
    default is the user's and stays. `torch_default`: that default (asked of torch when not given)."""
    env = os.environ if environ is None else environ
    root = env.get(ROOT_ENV, "").strip()
    if not root:
        return None
    current = env.get(INDUCTOR, "")
    if current:
        default = torch_default if torch_default is not None else torch_default_inductor_dir()
        if os.path.abspath(current) != os.path.abspath(default):
            return None
    path = Path(root) / scope_name(env) / VARIABLES[INDUCTOR]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # as in apply: an unwritable cache must not stop a run
    env[INDUCTOR] = str(path)
    return str(path)
