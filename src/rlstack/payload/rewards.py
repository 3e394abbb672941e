"""GRPO rewards. The report's two: correctness (the extracted answer equals the reference) and format (the
'#### <answer>' marker), with the same extraction as the evaluation. A third, repetition, is opt-in
(`rewards = ["correctness", "format", "repetition"]`): it penalises looping text, and it is the one reward that
still separates the completions of an untrained or random-weight model, whose correctness and format are all 0;
with every reward in a group equal, GRPO's advantages, loss and gradients are exactly 0 and nothing is learned.
All accept TRL's completions in both shapes: plain strings, or chat messages [{'role': 'assistant', ...}]."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from rlstack.payload.extract import NUMBER_RE, extract, reference_answer

MARKER_LINE_RE = re.compile(r"####[ \t]*(?P<rest>[^\n]*)")


def completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: a list of messages
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    return str(completion)


def correctness(completion: str, reference: str) -> float:
    """1.0 when the answer extracted from the completion equals the reference numerically, else 0.0."""
    pred = extract(completion).value
    return 1.0 if pred is not None and pred == reference_answer(reference) else 0.0


def format_score(completion: str) -> float:
    """1.0 for a '#### <number>' marker, 0.5 for the marker without a number after it, 0.0 without a marker.

    The half step gives a dense signal early in training (a small model finds '####' before it finds the whole
    line); a complete marker always beats an incomplete one."""
    matches = list(MARKER_LINE_RE.finditer(completion))
    if not matches:
        return 0.0
    rest = matches[-1]["rest"]
    return 1.0 if NUMBER_RE.match(rest.strip()) else 0.5


REPETITION_NGRAM = 3


def repetition_score(completion: str, n: int = REPETITION_NGRAM) -> float:
    """Minus the share of repeated word n-grams: 0.0 when no n-gram repeats (or the text is shorter than n words),
    toward -1.0 for a loop of one phrase. Words, not tokens, so the score does not depend on the tokenizer."""
    words = completion.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return -(1.0 - len(set(grams)) / len(grams))


def correctness_reward(completions: Sequence[Any], answer: Sequence[str], **_: Any) -> list[float]:
    """TRL reward function: the dataset's `answer` column is passed as a keyword."""
    return [correctness(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]


def format_reward(completions: Sequence[Any], **_: Any) -> list[float]:
    return [format_score(completion_text(c)) for c in completions]


def repetition_reward(completions: Sequence[Any], **_: Any) -> list[float]:
    return [repetition_score(completion_text(c)) for c in completions]


REWARDS: dict[str, Callable[..., list[float]]] = {
    "correctness": correctness_reward,
    "format": format_reward,
    "repetition": repetition_reward,
}


def get(names: Sequence[str]) -> list[Callable[..., list[float]]]:
    from rlstack.core.errors import RlstackError

    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise RlstackError(f"unknown reward(s): {', '.join(unknown)}", f"known rewards: {', '.join(REWARDS)}")
    return [REWARDS[n] for n in names]
