"""The payload under a multi-process launcher and beside TRL's vLLM server, without a GPU: which process writes,
the recipe's vLLM fields, and the server entry's patches for the locked vLLM (on fake vllm modules)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rlstack.core.errors import RlstackError
from rlstack.payload import recipes, serve
from rlstack.payload.train import grpo, ranks


def test_rank_comes_from_the_launchers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (ranks.rank(), ranks.world_size(), ranks.is_main()) == (0, 1, True)
    ranks.barrier()  # one process: nothing to wait for, and torch.distributed is not touched
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (ranks.rank(), ranks.world_size(), ranks.is_main()) == (1, 2, False)


def test_a_multi_process_run_needs_one_name_for_every_process(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """Each process would stamp its own time into a default name, and write into its own run folder."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RLSTACK_RUNS", str(tmp_path))
    with pytest.raises(RlstackError) as exc:
        grpo.run(recipes.load("smoke-cpu"), adapters_root=tmp_path / "adapters")
    assert "one run name" in exc.value.message and exc.value.hint == "pass --adapter-name NAME"


def test_recipe_vllm_fields_are_checked() -> None:
    r = recipes.load("smoke-cpu")
    assert r.grpo.vllm_mode == "off"
    with pytest.raises(recipes.RecipeError, match="grpo.vllm_mode"):
        recipes.load("smoke-cpu", ["grpo.vllm_mode=remote"])
    with pytest.raises(recipes.RecipeError, match="grpo.vllm_server_port"):
        recipes.load("smoke-cpu", ["grpo.vllm_server_port=70000"])
    with pytest.raises(recipes.RecipeError, match="grpo.vllm_gpu_memory_utilization"):
        recipes.load("smoke-cpu", ["grpo.vllm_gpu_memory_utilization=1.0"])
    with pytest.raises(recipes.RecipeError, match="did you mean grpo.vllm_mode"):
        recipes.load("smoke-cpu", ["grpo.vllm_mod=server"])


# --- the server entry's patches, on fake vllm modules ---------------------------------------------------------


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, *, old_utils: bool) -> types.ModuleType:
    vllm = types.ModuleType("vllm")
    utils = types.ModuleType("vllm.utils")
    net = types.ModuleType("vllm.utils.network_utils")
    net.get_open_port = lambda: 12345  # type: ignore[attr-defined]
    if old_utils:
        utils.get_open_port = lambda: 1  # type: ignore[attr-defined]
    vllm.utils = utils  # type: ignore[attr-defined]
    for name, mod in (("vllm", vllm), ("vllm.utils", utils), ("vllm.utils.network_utils", net)):
        monkeypatch.setitem(sys.modules, name, mod)
    return utils


def test_get_open_port_is_found_where_vllm_021_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    utils = _fake_vllm(monkeypatch, old_utils=False)
    assert serve.alias_get_open_port() is True
    from vllm.utils import get_open_port  # type: ignore[import-not-found]  # trl 0.24's server import

    assert get_open_port() == 12345
    assert serve.alias_get_open_port() is False  # already there: nothing to do
    utils = _fake_vllm(monkeypatch, old_utils=True)
    assert serve.alias_get_open_port() is False and utils.get_open_port() == 1  # an older vLLM stays as it is


class _Struct:
    """Like vLLM 0.21's SamplingParams: a msgspec Struct that refuses keywords it does not have."""

    __struct_fields__ = ("n", "temperature", "max_tokens", "structured_outputs", "logprobs")

    def __init__(self, **kw: Any) -> None:
        unknown = set(kw) - set(self.__struct_fields__)
        if unknown:
            raise TypeError(f"Unexpected keyword argument {sorted(unknown)[0]!r}")
        self.kw = kw


def test_sampling_params_take_trl_024s_keywords() -> None:
    with pytest.raises(TypeError, match="guided_decoding"):
        _Struct(n=2, guided_decoding=None)  # what trl 0.24's /generate/ does on vLLM 0.21
    make = serve.sampling_params_compat(_Struct)
    sp = make(n=2, temperature=1.0, max_tokens=8, truncate_prompt_tokens=512, guided_decoding=None, logprobs=0)
    assert sp.kw == {"n": 2, "temperature": 1.0, "max_tokens": 8, "logprobs": 0}
    regex = object()
    assert make(n=1, guided_decoding=regex).kw == {"n": 1, "structured_outputs": regex}

    class Old(_Struct):
        __struct_fields__ = ("n", "guided_decoding", "truncate_prompt_tokens")

    assert serve.sampling_params_compat(Old) is Old  # a vLLM trl 0.24 supports: untouched


def test_server_entry_runs_trls_main_with_its_own_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    serve.prepare()
    import trl.scripts.vllm_serve as trl_serve

    seen: dict[str, Any] = {}
    monkeypatch.setattr(trl_serve, "main", lambda args: seen.setdefault("args", args))
    monkeypatch.setattr(trl_serve, "SamplingParams", _Struct, raising=False)
    serve.main(["--model", "org/m", "--port", "8001", "--tensor_parallel_size", "2"])
    args = seen["args"]
    assert (args.model, args.port, args.tensor_parallel_size) == ("org/m", 8001, 2)
    assert trl_serve.SamplingParams is not _Struct and trl_serve.SamplingParams.__wrapped__ is _Struct
