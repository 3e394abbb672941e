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


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("", 0.0),
        ("too short", 0.0),  # fewer words than one 3-gram
        ("one two three four five", 0.0),  # no 3-gram twice
        ("a b c a b c", -0.25),  # 4 trigrams, 3 distinct
        ("x " * 102, -0.99),  # one phrase looping: 100 trigrams, 1 distinct
    ],
)
def test_repetition_score(completion: str, score: float) -> None:
    assert rewards.repetition_score(completion) == pytest.approx(score)


def test_repetition_separates_what_correctness_and_format_cannot() -> None:
    """The reason it exists: random-weight text scores 0 on both report rewards, so GRPO sees no signal; the
    repetition reward still ranks a loop below varied text."""
    loop, varied = "t5 t5 t5 t5 t5 t5 t5", "t1 t9 t4 t7 t2 t8 t3"
    assert rewards.format_reward([loop, varied]) == [0.0, 0.0]
    assert rewards.correctness_reward([loop, varied], answer=["#### 3", "#### 3"]) == [0.0, 0.0]
    low, high = rewards.repetition_reward([loop, varied])
    assert low < high == 0.0


def test_recipe_reward_names_are_the_registry() -> None:
    """A recipe validates reward names against a Literal (for its schema); the registry is what runs."""
    from typing import get_args

    from rlstack.payload.recipes import RewardName

    assert set(get_args(RewardName)) == set(rewards.REWARDS)
