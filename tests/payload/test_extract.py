"""Answer extraction against what models really write."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlstack.payload.extract import extract, format_fraction, parse_number, reference_answer, same


@pytest.mark.parametrize(
    ("text", "value", "method"),
    [
        ("#### 72", Fraction(72), "marker"),
        ("She pays 5 + 3 = 8 dollars.\n#### 8", Fraction(8), "marker"),
        ("#### 1,234", Fraction(1234), "marker"),
        ("#### 1,234,567", Fraction(1234567), "marker"),
        ("#### $1,234.50", Fraction(246900, 200), "marker"),
        ("#### -5", Fraction(-5), "marker"),
        ("#### −12", Fraction(-12), "marker"),
        ("#### $-3", Fraction(-3), "marker"),
        ("#### -$3", Fraction(-3), "marker"),
        ("#### 0.5", Fraction(1, 2), "marker"),
        ("#### .25", Fraction(1, 4), "marker"),
        ("#### 42.", Fraction(42), "marker"),
        ("#### 18 dollars.", Fraction(18), "marker"),
        ("#### 12 km", Fraction(12), "marker"),
        ("#### 50%", Fraction(50), "marker"),
        ("#### The answer is 18", Fraction(18), "marker"),
        ("#### 3/4", Fraction(3, 4), "marker"),
        ("first #### 3\nthen I reconsider\n#### 7", Fraction(7), "marker"),
        ("#### 3 #### 9", Fraction(9), "marker"),
        ("The answer is \\boxed{42}.", Fraction(42), "boxed"),
        ("\\boxed{1,000}", Fraction(1000), "boxed"),
        ("\\boxed{\\frac{1}{2}}", Fraction(1, 2), "boxed"),
        ("\\boxed{\\dfrac{3}{4}}", Fraction(3, 4), "boxed"),
        ("\\boxed{\\$ 15}", Fraction(15), "boxed"),
        ("\\boxed{1} then \\boxed{2}", Fraction(2), "boxed"),
        ("So the total is 42.", Fraction(42), "last_number"),
        ("10 - 3 = 7 apples", Fraction(7), "last_number"),
        ("It costs $2,500.", Fraction(2500), "last_number"),
        ("the result is -2", Fraction(-2), "last_number"),
    ],
)
def test_extract(text: str, value: Fraction, method: str) -> None:
    got = extract(text)
    assert got.value == value
    assert got.method == method


def test_marker_beats_boxed_and_numbers() -> None:
    assert extract("\\boxed{5} 99 #### 7 then 100").value == 7


def test_empty_marker_falls_back() -> None:
    got = extract("we get 12 so\n####")
    assert got.value == 12 and got.method == "last_number"


@pytest.mark.parametrize("text", ["", "no number here", "####", "version v1.2.3", "\\boxed{x}"])
def test_nothing_found(text: str) -> None:
    assert extract(text).value is None
    assert not extract(text).found


def test_no_fallback() -> None:
    assert extract("the total is 42", fallback=False).value is None


def test_numeric_not_string_comparison() -> None:
    assert same(extract("#### 7.0").value, reference_answer("#### 7"))
    assert same(extract("#### 7.00").value, Fraction(7))
    assert same(extract("#### 14/2").value, Fraction(7))
    assert not same(extract("#### 7.01").value, Fraction(7))
    assert not same(None, Fraction(7))


def test_thousands_vs_list() -> None:
    # '1,23' is not a thousands-separated number: it is 1 and 23.
    assert extract("1,23").value == 23
    assert parse_number("1, 2, 3") == 1


def test_reference_answer() -> None:
    assert reference_answer("Natalia sold 48/2 = 24 clips.\n#### 72") == 72
    assert reference_answer("1,080") == 1080
    with pytest.raises(ValueError):
        reference_answer("none")


@pytest.mark.parametrize(("value", "text"), [(Fraction(5), "5"), (Fraction(-5, 2), "-2.5"), (Fraction(1, 3), "1/3"),
                                             (None, None), (Fraction(1, 8), "0.125")])
def test_format_fraction(value: Fraction | None, text: str | None) -> None:
    assert format_fraction(value) == text


@given(st.integers(min_value=-10**9, max_value=10**9))
def test_any_integer_with_separators_roundtrips(n: int) -> None:
    assert extract(f"#### {n:,}").value == n
    assert extract(f"so the answer is {n}.").value == n


@given(st.decimals(min_value=-10**6, max_value=10**6, places=3, allow_nan=False, allow_infinity=False))
def test_decimals_roundtrip(d: object) -> None:
    text = format(d, "f")
    assert extract(f"#### {text}").value == Fraction(str(d))
