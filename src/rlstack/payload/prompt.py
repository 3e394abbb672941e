"""The one prompt template, shared by training and evaluation.

The report's hardest-won lever was train/eval alignment: the policy is rewarded on exactly the text it is later
evaluated on. So both sides call `render(tokenizer, question)` and nothing else builds a prompt.
"""

from __future__ import annotations

from typing import Any

INSTRUCTION = (
    "Solve the math problem step by step. "
    "End your reply with the final answer on its own line, in the form '#### <number>'."
)

# Tokenizers without a chat template (the tiny CPU model) get this plain layout of the same content.
PLAIN_FORMAT = "{instruction}\n\nQuestion: {question}\nAnswer:"

# Bumped whenever the wording above changes, and recorded in recipes/results, so old numbers are not compared
# with new ones by accident.
PROMPT_VERSION = "1"


def messages(question: str) -> list[dict[str, str]]:
    """The chat form: one user turn holding the instruction and the question."""
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n{question.strip()}"}]


def plain(question: str) -> str:
    return PLAIN_FORMAT.format(instruction=INSTRUCTION, question=question.strip())


def render(tokenizer: Any, question: str, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The exact prompt string the model sees (tokenized later with add_special_tokens=False, as TRL does).

    `chat_template_kwargs` come from the recipe's [prompt] table (e.g. Qwen3's enable_thinking) and are recorded
    in the adapter's manifest, so evaluation renders with the same ones as training."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages(question), tokenize=False, add_generation_prompt=True,
                                             **(chat_template_kwargs or {}))
        return str(text)
    return plain(question)
