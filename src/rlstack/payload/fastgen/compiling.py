"""How fastgen compiles: torch.compile's settings for the decode step, and the one fallback every first compiled
call goes through (the state it may have advanced set back, the reason kept, never eager in silence). torch is
imported inside functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlstack.payload.fastgen.errors import error_text


def first_compiled_call(call: Callable[[], Any], state: list[Any]) -> tuple[Any, str | None]:
    """The first call of a torch.compile'd function (the decode step): (its output, None), or where it
    raised, (None, why) with ``state`` (the tensors the call may have advanced in place) set back, for the caller
    to fall back to eager and say so. Dynamo's suppress_errors is off for the call: Unsloth turns it on for the
    whole process (unsloth_zoo patching_utils.py), and a failed compile would then run eager in silence, under
    fastgen's name and at eager speed."""
    import torch._dynamo

    snapshot = [t.clone() for t in state]
    try:
        with torch._dynamo.config.patch(suppress_errors=False):
            return call(), None
    except Exception as exc:
        for cur, old in zip(state, snapshot, strict=True):
            cur.copy_(old)
        return None, error_text(exc)


def compile_settings(mode: str | None, emulate_precision_casts: bool) -> dict[str, Any]:
    """torch.compile's ``mode`` or ``options`` for the decode step: the mode alone, or with
    ``emulate_precision_casts`` inductor's options for that mode plus the option (torch.compile takes a mode or
    options, not both; ``torch._inductor.list_mode_options`` is what a mode means)."""
    if not emulate_precision_casts:
        return {"mode": mode}
    import torch._inductor

    # (list_mode_options(None) lists every mode's options: no mode is no options)
    modal = torch._inductor.list_mode_options(mode) if mode else {}
    return {"options": {**modal, "emulate_precision_casts": True}}


def compiled(fn: Callable[..., Any], graph: str, emulate_precision_casts: bool) -> Callable[..., Any]:
    """``fn`` through torch.compile as the decode step is compiled: one static shape a compile (dynamic=False),
    graph breaks allowed (the first call says where compiling failed instead), ``mode="reduce-overhead"`` for
    cudagraph trees (``graph="trees"``), else inductor's default mode; with ``emulate_precision_casts`` inductor's
    option of that name. Dynamo's cache is widened: each (batch, cache length) is a compile of its own."""
    import torch
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    mode = "reduce-overhead" if graph == "trees" else None
    return torch.compile(fn, fullgraph=False, dynamic=False, **compile_settings(mode, emulate_precision_casts))
