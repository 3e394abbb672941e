"""rlstack train's fastgen switch (rlstack.payload.train.grpo.use_fastgen): installed with the recipe's
grpo.fastgen_options on CUDA, off with the reason on stderr where it cannot serve."""

from __future__ import annotations

import types
from typing import Any

import pytest

from rlstack.payload import recipes


def _recipe(*overrides: str) -> recipes.Recipe:
    return recipes.load("gsm8k-grpo", list(overrides))


def test_the_recipes_fastgen_options_reach_the_engine(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    pytest.importorskip("trl")
    from rlstack.payload import fastgen
    from rlstack.payload.train import grpo

    seen: list[tuple[Any, fastgen.FastgenOptions]] = []
    monkeypatch.setattr(fastgen, "install_on_trainer", lambda trainer, options: seen.append((trainer, options)))
    trainer = object()
    loaded = types.SimpleNamespace(device="cuda", loader="unsloth")
    recipe = _recipe("grpo.fastgen_options.decode_attention=triton", "grpo.fastgen_options.attend_bucket=256")
    assert grpo.use_fastgen(recipe, trainer, loaded, use_vllm=False)
    assert seen == [(trainer, fastgen.FastgenOptions(decode_attention="triton", attend_bucket=256))]
    assert seen[0][1].changed() == {"attend_bucket": 256, "decode_attention": "triton"}  # only what was set
    assert "options attend_bucket=256, decode_attention=triton" in capsys.readouterr().err
    assert grpo.use_fastgen(_recipe(), trainer, loaded, use_vllm=False)
    assert seen[-1][1] == fastgen.FastgenOptions() and seen[-1][1].changed() == {}  # the engine's defaults


@pytest.mark.parametrize(("device", "use_vllm", "why"), [("cpu", False, "no CUDA device"),
                                                         ("cuda", True, "vLLM generates the rollouts")])
def test_where_fastgen_cannot_serve_it_says_why(monkeypatch: pytest.MonkeyPatch, capsys: Any, device: str,
                                                use_vllm: bool, why: str) -> None:
    pytest.importorskip("trl")
    from rlstack.payload import fastgen
    from rlstack.payload.train import grpo

    monkeypatch.setattr(fastgen, "install_on_trainer", lambda *a, **k: pytest.fail("installed where it cannot serve"))
    loaded = types.SimpleNamespace(device=device, loader="transformers")
    assert not grpo.use_fastgen(_recipe(), object(), loaded, use_vllm=use_vllm)
    assert f"fastgen is off: {why}" in capsys.readouterr().err
