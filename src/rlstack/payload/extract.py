"""Answer extraction: the number a model means, from what models really write.

Handled: thousands separators (1,234), currency and units ($1,234.50, 12 km, 50%), negatives (-5, −5), decimals,
a trailing period ("is 42."), LaTeX \\boxed{} (with \\frac), several '####' markers (the last one counts).
Answers are compared as exact fractions, so 7, 7.0, 7.00 and 14/2 are equal and string quirks never matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Literal

Method = Literal["marker", "boxed", "last_number"]

_SIGN = r"[-−–]?"
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
# A number, optionally signed, optionally a fraction a/b; a currency sign may sit between sign and digits.
NUMBER_RE = re.compile(
    rf"(?<![\w.])(?P<sign>{_SIGN})\s?[$€£¥]?\s?(?P<num>{_NUM})(?:\s?/\s?(?P<den>\d+(?:\.\d+)?))?(?![\d])"
)
MARKER_RE = re.compile(r"####")
FRAC_RE = re.compile(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}")


@dataclass(frozen=True)
class Extraction:
    value: Fraction | None
    method: Method | None
    text: str | None  # the matched span, for the raw generations file

    @property
    def found(self) -> bool:
        return self.value is not None


def parse_number(text: str) -> Fraction | None:
    """The first number in `text` as an exact Fraction, or None."""
    m = NUMBER_RE.search(text)
    return _to_fraction(m) if m else None


def _to_fraction(m: re.Match[str]) -> Fraction | None:
    try:
        value = Fraction(Decimal(m["num"].replace(",", "")))
        if m["den"] is not None:
            den = Fraction(Decimal(m["den"]))
            if den == 0:
                return None
            value /= den
    except (InvalidOperation, ValueError):
        return None
    return -value if m["sign"] else value


def _boxed_contents(text: str) -> str | None:
    """Contents of the last \\boxed{...}, with nested braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract(text: str, *, fallback: bool = True) -> Extraction:
    """The answer in a completion: after the last '####' marker, else in the last \\boxed{}, else (fallback)
    the last number anywhere."""
    markers = list(MARKER_RE.finditer(text))
    if markers:
        tail = text[markers[-1].end():]
        line = tail.strip().splitlines()[0] if tail.strip() else ""
        m = NUMBER_RE.search(line)
        if m and (value := _to_fraction(m)) is not None:
            return Extraction(value, "marker", m.group(0).strip())
    boxed = _boxed_contents(text)
    if boxed is not None:
        inner = FRAC_RE.sub(r"\1/\2", boxed).replace("{", "").replace("}", "")
        m = NUMBER_RE.search(inner)
        if m and (value := _to_fraction(m)) is not None:
            return Extraction(value, "boxed", boxed)
    if fallback:
        for m in reversed(list(NUMBER_RE.finditer(text))):
            if (value := _to_fraction(m)) is not None:
                return Extraction(value, "last_number", m.group(0).strip())
    return Extraction(None, None, None)


def reference_answer(answer: str) -> Fraction:
    """The reference of a GSM8K row ('... #### 72') or of a JSONL row holding just the number."""
    got = extract(answer).value
    if got is None:
        raise ValueError(f"no number in reference answer {answer!r}")
    return got


def same(pred: Fraction | None, ref: Fraction | None) -> bool:
    return pred is not None and ref is not None and pred == ref


def format_fraction(value: Fraction | None) -> str | None:
    """A stable text form for JSON: integers plainly, terminating decimals as decimals, else a/b."""
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d == 1:
        return format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    return f"{value.numerator}/{value.denominator}"
