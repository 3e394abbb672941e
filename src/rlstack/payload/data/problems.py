"""The one record type every data source produces."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str  # the reference: a GSM8K solution ending in '#### N', or just the number
    solution: str | None = None  # worked text, used to train the tiny model's tokenizer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
