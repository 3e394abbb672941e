"""`python -m rlstack.payload.serve ARGS`: TRL's rollout server for GRPO's server mode (`trl vllm-serve`,
trl/scripts/vllm_serve.py), made to start on the locked versions. ARGS are vllm-serve's own flags (--model,
--port, --tensor_parallel_size, ...), parsed by trl's own parser; `invoke train --vllm-server` writes them.

Why not `trl vllm-serve` as it is: trl 0.24.0's script was written against vLLM 0.10/0.11, and the fp8 stack
locks vLLM 0.21.0, where (read from both wheels):
- `from vllm.sampling_params import GuidedDecodingParams` (vllm_serve.py:63) fails: vLLM 0.11 renamed it
  StructuredOutputsParams and 0.12 removed the old name (compat.alias_guided_decoding_params covers the trainer's
  copy of the same import; the server has its own).
- `from vllm.utils import get_open_port` (vllm_serve.py:64) fails: vLLM split vllm/utils into submodules, and
  0.21.0 has the function in vllm.utils.network_utils only.
- every POST /generate/ builds `SamplingParams(..., truncate_prompt_tokens=..., guided_decoding=...)`
  (vllm_serve.py:575-587); 0.21.0's SamplingParams, a msgspec Struct, has neither field (structured_outputs
  replaced guided_decoding; prompt truncation left SamplingParams) and rejects unknown keywords with TypeError.
  Prompts are then not truncated by the server: its --max_model_len is the recipe's prompt plus completion
  length, so an over-long prompt is refused by vLLM with a message that names its length.
The two imports are patched when this module runs as a program, which includes vLLM's spawned worker processes
(multiprocessing's spawn runs the parent's `-m` module again, as __mp_main__, before the child imports
trl.scripts.vllm_serve for its WeightSyncWorkerExtension). SamplingParams is patched in the API process, which
builds it. Every patch does nothing where the name already exists, so a vLLM that trl 0.24 supports is untouched.
These are compat shims like those in train/compat.py and belong in its list; they live here until they move.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any


def _vllm_module(name: str) -> Any | None:
    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is None:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # a vllm that does not import: trl's own import then names the problem
        return None


def alias_get_open_port() -> bool:
    """Give `vllm.utils` the `get_open_port` trl 0.24's server imports; True when it set it."""
    utils = _vllm_module("vllm.utils")
    if utils is None or hasattr(utils, "get_open_port"):
        return False
    net = _vllm_module("vllm.utils.network_utils")
    if net is None or not hasattr(net, "get_open_port"):
        return False
    utils.get_open_port = net.get_open_port
    return True


def _fields(cls: Any) -> set[str]:
    fields = getattr(cls, "__struct_fields__", None)  # msgspec.Struct
    if fields is not None:
        return set(fields)
    import inspect

    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


def sampling_params_compat(cls: Any) -> Any:
    """`cls` (vLLM's SamplingParams), or where it lacks trl 0.24's keywords a factory that takes them:
    guided_decoding becomes structured_outputs, truncate_prompt_tokens is dropped (see the module docstring)."""
    known = _fields(cls)
    if not known or "guided_decoding" in known or "structured_outputs" not in known:
        return cls

    def make(*args: Any, guided_decoding: Any = None, truncate_prompt_tokens: Any = None, **kwargs: Any) -> Any:
        if guided_decoding is not None:
            kwargs["structured_outputs"] = guided_decoding
        if truncate_prompt_tokens is not None and "truncate_prompt_tokens" in known:
            kwargs["truncate_prompt_tokens"] = truncate_prompt_tokens
        return cls(*args, **kwargs)

    make.__wrapped__ = cls  # type: ignore[attr-defined]
    return make


def prepare() -> None:
    """The import-time patches, before anything imports trl.scripts.vllm_serve."""
    from rlstack.payload.train.compat import alias_guided_decoding_params, patch_trl_availability_flags

    alias_guided_decoding_params()
    alias_get_open_port()
    patch_trl_availability_flags()


def main(argv: list[str] | None = None) -> None:
    from rlstack.payload import kernelcache

    kernelcache.apply()  # the server runs as `python -m rlstack.payload.serve`, not through rlstack's CLI
    prepare()
    import trl.scripts.vllm_serve as serve

    if hasattr(serve, "SamplingParams"):  # absent when vllm is not installed: trl's main says so
        serve.SamplingParams = sampling_params_compat(serve.SamplingParams)
    (script_args,) = serve.make_parser().parse_args_and_config(args=argv)
    serve.main(script_args)


if __name__ == "__mp_main__":  # a spawned vLLM worker: the import patches, before it unpickles its task
    prepare()
elif __name__ == "__main__":
    main()
