"""The A/B statistics (common/stats.py) against SciPy's answers and textbook cases."""

import math
import random

import numpy as np
import pytest
from scipy import stats as scipy_stats

from common.stats import (
    MIN_RUNS,
    Decision,
    Verdict,
    benjamini_hochberg,
    compare,
    decision,
    mann_whitney_p,
    shift_interval,
    verdict,
)


@pytest.mark.parametrize("seed", range(40))
def test_mann_whitney_p_matches_scipy_exact_and_asymptotic(seed):
    rng = random.Random(seed)
    m, n = rng.randint(1, 25), rng.randint(1, 25)
    tied = seed % 3 == 0
    draw = (lambda: float(rng.randint(1, 6))) if tied else (lambda: rng.gauss(1.0, 0.1))
    a, b = [draw() for _ in range(m)], [draw() * 1.05 for _ in range(n)]
    has_ties = len(set(a + b)) < m + n
    method = "asymptotic" if has_ties or m + n > 50 else "exact"
    expected = scipy_stats.mannwhitneyu(b, a, alternative="two-sided", method=method).pvalue
    assert mann_whitney_p(a, b) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_mann_whitney_p_of_fully_separated_small_samples_is_the_exact_tail():
    # 5 against 5, every new value above every base value: 2 / C(10, 5).
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)


def test_mann_whitney_p_of_identical_constant_samples_is_one():
    assert mann_whitney_p([2.0] * 6, [2.0] * 6) == 1.0


def test_benjamini_hochberg_matches_scipy():
    rng = random.Random(7)
    p = [rng.random() ** 3 for _ in range(200)]
    assert benjamini_hochberg(p) == pytest.approx(list(scipy_stats.false_discovery_control(p, method="bh")))
    assert benjamini_hochberg([]) == []


def test_the_shift_interval_is_hodges_lehmann_with_moses_bounds():
    a = [1.0, 1.1, 0.9, 1.05, 0.95, 1.02, 0.98, 1.01]
    b = [v * 1.2 for v in a]
    estimate, low, high = shift_interval(a, b)
    diffs = sorted(math.log(y) - math.log(x) for x in a for y in b)
    assert estimate == pytest.approx(float(np.median(diffs)))
    assert estimate == pytest.approx(math.log(1.2))
    # 8 and 8: C = floor(32 - 1.96 * sqrt(64 * 17 / 12)) = floor(13.3) = 13, so d(13) and d(52).
    assert (low, high) == (pytest.approx(diffs[12]), pytest.approx(diffs[51]))
    assert low < math.log(1.2) < high


def test_the_interval_covers_the_true_change_about_95_percent_of_the_time():
    rng = random.Random(11)
    covered = 0
    for _ in range(400):
        base = [math.exp(rng.gauss(0, 0.03)) for _ in range(12)]
        new = [1.05 * math.exp(rng.gauss(0, 0.03)) for _ in range(12)]
        change = compare(base, new)
        covered += change.ci_low_pct <= 5.0 <= change.ci_high_pct
    assert 0.92 <= covered / 400 <= 0.99


def test_compare_needs_min_runs_each_side_and_leaves_out_values_that_measured_nothing():
    few = compare([1.0] * (MIN_RUNS - 1) + [0.0, math.nan, math.inf], [1.1] * 10)
    assert few.base_runs == MIN_RUNS - 1
    assert few.p_value is None and few.ci_low_pct is None
    assert few.change_pct == pytest.approx(10.0)
    assert verdict(few, None, 2.0) is Verdict.TOO_FEW_RUNS
    assert compare([], [1.0]).change_pct is None


def test_verdicts_need_significance_and_the_minimum_change():
    base = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99]
    slower = compare(base, [v * 1.15 for v in base])
    assert verdict(slower, 0.001, 2.0) is Verdict.SLOWER
    assert verdict(slower, 0.2, 2.0) is Verdict.NO_CHANGE
    assert verdict(slower, 0.001, 20.0) is Verdict.NO_CHANGE
    faster = compare(base, [v * 0.85 for v in base])
    assert verdict(faster, 0.001, 2.0) is Verdict.FASTER


def test_decisions_place_the_interval_against_the_minimum_change():
    base = [1.0 + 0.001 * i for i in range(20)]
    assert decision(compare(base, [v * 1.2 for v in base]), 2.0) is Decision.ABOVE
    assert decision(compare(base, [v * 0.8 for v in base]), 2.0) is Decision.BELOW
    assert decision(compare(base, list(base)), 2.0) is Decision.INSIDE
    noisy = [1.0, 1.5, 0.7, 1.3, 0.8]
    assert decision(compare(noisy, [v * 1.02 for v in noisy]), 2.0) is Decision.UNDECIDED
    assert decision(compare([1.0], [1.0]), 2.0) is Decision.UNDECIDED


def test_the_interval_of_many_timings_is_selected_without_listing_every_pair():
    # 1,200 x 900 pairs is past what is listed at once: the selection gives exactly the listed answer,
    # ties included; 20,000 a side (400 million pairs, 3.2 GB listed) comes back in well under a minute.
    rng = random.Random(5)
    a = [1.0] * 50 + [math.exp(rng.gauss(0, 0.05)) for _ in range(1150)]
    b = [1.0] * 50 + [1.03 * math.exp(rng.gauss(0, 0.05)) for _ in range(850)]
    diffs = np.sort(np.subtract.outer(np.log(b), np.log(a)).ravel())
    estimate, low, high = shift_interval(a, b)
    pairs = len(diffs)
    reach = math.floor(pairs / 2 - 1.959963984540054 * math.sqrt(pairs * (len(a) + len(b) + 1) / 12))
    assert (estimate, low, high) == (float(np.median(diffs)), diffs[reach - 1], diffs[pairs - reach])
    big = compare([math.exp(rng.gauss(0, 0.05)) for _ in range(20_000)], [1.03] * 20_000)
    assert big.ci_low_pct is not None and big.ci_low_pct < 3.0 < big.ci_high_pct


def test_extreme_timings_give_finite_numbers_not_an_overflow():
    # Any positive finite timing may be stored; the change of 1e-300 s against 1e300 s is absurd but
    # must stay a finite number (JSON has no infinity), as must a median of two near-largest floats.
    slower = compare([1e-300] * 5, [1e300] * 5)
    assert slower.change_pct is not None and slower.ci_low_pct is not None and slower.ci_high_pct is not None
    assert all(math.isfinite(v) and v > 1e300 for v in (slower.change_pct, slower.ci_low_pct, slower.ci_high_pct))
    assert compare([1e300] * 5, [1e-300] * 5).change_pct == -100.0
    huge = compare([1.7e308] * 6, [1.0] * 5)
    assert huge.base_median == 1.7e308
    assert compare([5e-324] * 5, [1.0] * 5).change_pct == pytest.approx(1.0142320547350045e306)
