"""fastgen's error type and the one way it turns an exception into a line of text (no torch import)."""

from __future__ import annotations

from rlstack.core.errors import RlstackError


class FastgenError(RlstackError):
    """A generation request fastgen cannot serve (the caller may fall back to ``model.generate``)."""


def error_text(exc: BaseException, head: int = 300, tail: int = 1200) -> str:
    """An exception as one string for a warning, the engine's ``*_error`` fields and the fallback's reason (the
    training hook's, the evaluation's): its start (what failed) and its end (why). A Triton CompilationError
    states its reason after the kernel source it quotes: a cut after the first characters kept the source and
    lost the reason (docs/archive/notes.md)."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) <= head + tail:
        return text
    return f"{text[:head]} [... {len(text) - head - tail} characters ...] {text[-tail:]}"
