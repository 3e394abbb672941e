"""One prompt template for train and eval."""

from __future__ import annotations

from typing import Any

from rlstack.payload import prompt


class ChatTok:
    chat_template = "x"

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool,
                            enable_thinking: bool = True) -> Any:
        assert tokenize is False and add_generation_prompt is True
        return "<user>" + messages[0]["content"] + "<assistant>" + ("" if enable_thinking else "<no-think>")


class PlainTok:
    chat_template = None


def test_instruction_asks_for_the_rewarded_format() -> None:
    assert "#### <number>" in prompt.INSTRUCTION


def test_chat_and_plain_share_content() -> None:
    q = "  Ava has 3 apples. How many?  "
    chat = prompt.render(ChatTok(), q)
    plain = prompt.render(PlainTok(), q)
    assert chat == f"<user>{prompt.INSTRUCTION}\n\nAva has 3 apples. How many?<assistant>"
    assert plain.startswith(prompt.INSTRUCTION) and plain.endswith("Question: Ava has 3 apples. How many?\nAnswer:")
    assert prompt.render(None, q) == plain


def test_training_and_eval_use_render() -> None:
    """Both sides must build prompts through prompt.render (no second copy of the template)."""
    from pathlib import Path

    src = Path(prompt.__file__).parent
    for rel in ("train/grpo.py", "evaluate/gsm8k.py"):
        text = (src / rel).read_text()
        assert "prompt.render(" in text
        assert prompt.INSTRUCTION[:30] not in text


def test_chat_template_kwargs_pass_through() -> None:
    assert prompt.render(ChatTok(), "q", {"enable_thinking": False}).endswith("<assistant><no-think>")
    assert prompt.render(PlainTok(), "q", {"enable_thinking": False}) == prompt.plain("q")
