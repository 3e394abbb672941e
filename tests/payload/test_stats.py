"""Statistics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from rlstack.payload import stats


def _wilson_by_quadratic(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    # Solve (p_hat - p)^2 = z^2 p (1 - p) / n for p: an independent route to the Wilson bounds.
    ph = k / n
    a = 1 + z * z / n
    b = -(2 * ph + z * z / n)
    c = ph * ph
    disc = math.sqrt(b * b - 4 * a * c)
    return (-b - disc) / (2 * a), (-b + disc) / (2 * a)


def test_wilson_182_of_300() -> None:
    lo, hi = stats.wilson(182, 300)
    assert lo == pytest.approx(0.55038, abs=1e-5)
    assert hi == pytest.approx(0.66026, abs=1e-5)
    assert (lo, hi) == pytest.approx(_wilson_by_quadratic(182, 300), abs=1e-12)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (10, 10), (1, 2), (205, 300), (50, 1000)])
def test_wilson_matches_quadratic(k: int, n: int) -> None:
    lo, hi = stats.wilson(k, n)
    qlo, qhi = _wilson_by_quadratic(k, n)
    assert lo == pytest.approx(max(0.0, qlo), abs=1e-12)
    assert hi == pytest.approx(min(1.0, qhi), abs=1e-12)
    assert 0 <= lo <= k / n <= hi <= 1


def test_wilson_bad_input() -> None:
    with pytest.raises(ValueError):
        stats.wilson(1, 0)
    with pytest.raises(ValueError):
        stats.wilson(5, 4)


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (0, 0, 1.0),
        (0, 5, 2 / 32),  # 2 * 1/32
        (1, 9, 22 / 1024),  # 2 * (1 + 10) / 2^10
        (2, 8, 2 * (1 + 10 + 45) / 1024),
        (5, 5, 1.0),
        (3, 4, 1.0),
        (0, 10, 2 / 1024),
        (10, 0, 2 / 1024),
    ],
)
def test_mcnemar_exact(b: int, c: int, p: float) -> None:
    assert stats.mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)


def test_mcnemar_report_scenarios() -> None:
    # +23 net questions (182 -> 205 of 300): significance depends on how many answers flipped.
    assert stats.mcnemar_exact(0, 23) == pytest.approx(2 / 2**23)
    assert stats.mcnemar_exact(20, 43) < 0.01
    assert stats.mcnemar_exact(40, 63) < 0.05
    assert stats.mcnemar_exact(95, 118) > 0.05


def test_mcnemar_large_n_no_overflow() -> None:
    assert 0 < stats.mcnemar_exact(600, 700) < 0.01


def test_bootstrap_ci_contains_delta_and_is_seeded() -> None:
    base = [True] * 60 + [False] * 40
    tuned = [True] * 50 + [False] * 10 + [True] * 20 + [False] * 20  # delta = +0.10
    lo, hi = stats.bootstrap_delta_ci(base, tuned, iters=2000, seed=1)
    assert lo < 0.10 < hi
    assert (lo, hi) == stats.bootstrap_delta_ci(base, tuned, iters=2000, seed=1)


def test_bootstrap_identical_is_zero() -> None:
    x = [True, False, True]
    assert stats.bootstrap_delta_ci(x, x, iters=100) == (0.0, 0.0)


def test_paired_counts() -> None:
    base = [True, True, False, False, True]
    tuned = [True, False, True, True, True]
    r = stats.paired(base, tuned, iters=200)
    assert (r.base_only, r.tuned_only, r.base_correct, r.tuned_correct) == (1, 2, 3, 4)
    assert r.delta == pytest.approx(0.2)
    assert r.p_value == pytest.approx(1.0)
