"""The two GRPO rewards, in both completion shapes TRL passes."""

from __future__ import annotations

import pytest

from rlstack.core.errors import RlstackError
from rlstack.payload import rewards


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("5 + 3 = 8\n#### 8", 1.0),
        ("#### 1,234.5", 1.0),
        ("####8", 1.0),
        ("#### -4", 1.0),
        ("#### eight", 0.5),
        ("####", 0.5),
        ("#### 8\nbut then #### ", 0.5),  # the last marker counts
        ("the answer is 8", 0.0),
        ("\\boxed{8}", 0.0),
        ("", 0.0),
    ],
)
def test_format_score(completion: str, score: float) -> None:
    assert rewards.format_score(completion) == score


def test_correctness_numeric() -> None:
    ref = "Natalia sold 24 clips.\n#### 72"
    assert rewards.correctness("so #### 72.0", ref) == 1.0
    assert rewards.correctness("\\boxed{72}", ref) == 1.0
    assert rewards.correctness("#### 71", ref) == 0.0
    assert rewards.correctness("nothing", ref) == 0.0


def test_trl_signature_strings_and_messages() -> None:
    completions = ["#### 3", "#### 4", "no"]
    answers = ["#### 3", "#### 3", "#### 3"]
    assert rewards.correctness_reward(completions, answer=answers, prompts=["p"] * 3) == [1.0, 0.0, 0.0]
    assert rewards.format_reward(completions, answer=answers) == [1.0, 1.0, 0.0]
    chat = [[{"role": "assistant", "content": c}] for c in completions]
    assert rewards.correctness_reward(chat, answer=answers) == [1.0, 0.0, 0.0]
    assert rewards.format_reward(chat) == [1.0, 1.0, 0.0]


def test_lengths_must_match() -> None:
    with pytest.raises(ValueError):
        rewards.correctness_reward(["#### 1"], answer=["1", "2"])


def test_get() -> None:
    assert rewards.get(["format", "correctness"]) == [rewards.format_reward, rewards.correctness_reward]
    with pytest.raises(RlstackError, match="unknown reward"):
        rewards.get(["style"])
