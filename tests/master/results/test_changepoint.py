"""The regression detector on series whose truth is known, and a short run of bench/regressions.py's
corpus against the Perfherder-style baseline (the full run is docs/benchmarks.md's table)."""

import importlib.util
import time
from types import ModuleType

import numpy as np
import pytest

from master.results import changepoint
from master.results.changepoint import detect_steps, fixed_at, mann_whitney_z, regressions
from tests.support import ROOT


def noisy(levels: list[tuple[int, float]], noise: float = 0.03, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    values = np.concatenate([np.full(n, level) for n, level in levels])
    return list(values * (1 + noise * rng.standard_normal(len(values))))


def test_a_clear_step_up_is_found_where_it_is_with_its_size():
    (step,) = regressions(noisy([(60, 2.0), (40, 2.3)]))
    assert step.index == 60
    assert step.before == pytest.approx(2.0, rel=0.02)
    assert step.after == pytest.approx(2.3, rel=0.02)
    assert step.change_pct == pytest.approx(15, abs=2)
    assert step.is_regression


def test_a_step_is_raised_a_few_points_after_it():
    series = noisy([(50, 1.0), (50, 1.2)], noise=0.02, seed=3)
    raised = next(k for k in range(1, 51) if regressions(series[: 50 + k]))
    assert raised <= 6
    assert regressions(series[: 50 + raised])[0].index == 50


@pytest.mark.parametrize("seed", range(30))
def test_no_alarm_on_flat_noisy_series_with_outliers(seed):
    rng = np.random.default_rng(seed)
    values = 1e-3 * (1 + 0.08 * rng.standard_normal(100))
    values[rng.choice(100, 2, replace=False)] *= 3  # two slow outliers, one may be the newest point
    values[-1] *= 1 + 2 * (seed % 2)
    assert regressions(list(values)) == []


def test_the_rank_z_is_large_for_a_clear_step_small_without_one_and_zero_when_all_are_equal():
    rng = np.random.default_rng(4)
    before, after = rng.normal(1.0, 0.05, 40), rng.normal(1.2, 0.05, 20)
    assert mann_whitney_z(before, after) > 5
    assert mann_whitney_z(after, before) < -5
    assert abs(mann_whitney_z(before[:20], before[20:])) < 2
    assert mann_whitney_z(np.zeros(30), np.ones(30)) > 7  # ties: mean ranks, corrected variance
    assert mann_whitney_z(np.ones(5), np.ones(5)) == 0.0
    assert mann_whitney_z(np.ones(5), np.array([])) == 0.0


def test_three_slow_newest_points_are_not_yet_a_regression_and_a_fourth_makes_one(monkeypatch):
    flat = noisy([(60, 1.0)])
    assert regressions(flat + [1.3] * 3) == []
    assert [s.index for s in regressions(flat + [1.3] * 4)] == [60]
    monkeypatch.setattr(changepoint, "CONFIRM_Z", -np.inf)  # the mean shift alone raises it at once
    monkeypatch.setattr(changepoint, "CONFIRM_AFTER", 0)
    assert [s.index for s in regressions(flat + [1.3] * 3)] == [60]


@pytest.mark.parametrize(("before", "after"), [(3, 4), (5, 5), (12, 4), (3, 40)])
def test_a_step_in_a_young_series_is_found_once_four_points_follow_it(before, after):
    """Too few points for the rank test's threshold: every point after above every point before."""
    assert [s.index for s in regressions(noisy([(before, 1.0), (after, 1.5)]))] == [before]
    assert regressions(noisy([(before, 1.0), (3, 1.5)])) == []


def test_outliers_among_the_newest_points_are_not_a_step(monkeypatch):
    series = noisy([(60, 1.0)]) + [3.0, 1.0, 1.0, 3.0, 1.0, 2.5, 3.0]
    assert detect_steps(series) == []
    monkeypatch.setattr(changepoint, "CONFIRM_Z", -np.inf)  # what the rank test drops
    assert [s.index for s in detect_steps(series)] == [63]


def test_many_weak_cuts_cost_a_few_measures_each_not_one_per_cut_per_dropped_cut(monkeypatch):
    measures, cuts_found = [], []
    measure, significant = changepoint._measure, changepoint._significant
    monkeypatch.setattr(changepoint, "_measure", lambda *a: measures.append(1) or measure(*a))
    monkeypatch.setattr(
        changepoint, "_significant", lambda x, cuts, pct: cuts_found.append(len(cuts)) or significant(x, cuts, pct)
    )
    levels = np.array([1.0 if (i // 8) % 2 else 1.07 for i in range(200)])  # blocks of 8 points, 2 noise levels apart
    series = list(levels * (1 + 0.02 * np.random.default_rng(1).standard_normal(200)))
    assert detect_steps(series) == []  # no block differs from its neighbours by a confirmed step
    (cuts,) = cuts_found
    assert cuts >= 20
    assert len(measures) <= 3 * cuts  # measured afresh on every drop, it took about cuts**2 / 2


def test_dropping_thousands_of_failing_cuts_one_by_one_costs_time_linear_in_their_number(monkeypatch):
    """Each drop re-measures only the two neighbours; a pass over every cut per drop took minutes here."""
    calls = []

    def no_change(x, lo, cut, hi, score):
        calls.append(cut)
        return changepoint.Step(cut, 1.0, 1.0, 0.0, score), 0.0

    monkeypatch.setattr(changepoint, "_measure", no_change)
    cuts = [(i, 4.0) for i in range(3, 60_000, 3)]
    started = time.process_time()
    assert changepoint._significant(np.ones(60_000), cuts, 5.0) == []
    assert time.process_time() - started < 3.0
    assert len(calls) <= 3 * len(cuts)


def test_a_step_smaller_than_the_minimum_change_is_not_reported():
    series = noisy([(50, 1.0), (50, 1.03)], noise=0.002)
    assert detect_steps(series) == []
    (step,) = detect_steps(series, min_change_pct=2)
    assert (step.index, round(step.change_pct)) == (50, 3)


def test_a_step_down_is_a_step_but_not_a_regression():
    series = noisy([(50, 1.0), (50, 0.8)])
    assert regressions(series) == []
    (step,) = detect_steps(series)
    assert step.index == 50 and step.change_pct == pytest.approx(-20, abs=2) and not step.is_regression


def test_fixed_when_the_series_steps_back_to_the_old_level():
    series = noisy([(40, 1.0), (30, 1.25), (30, 1.01)], seed=5)
    (regression,) = regressions(series)
    assert regression.index == 40
    assert fixed_at(series, regression) == 70
    assert fixed_at(series[:70], regression) is None
    partly = noisy([(40, 1.0), (30, 1.25), (30, 1.12)], seed=5)  # better, still 12% slower
    (regression,) = regressions(partly)
    assert fixed_at(partly, regression) is None


def test_two_regressions_in_one_series():
    steps = regressions(noisy([(40, 1.0), (30, 1.2), (30, 1.5)], seed=2))
    assert [s.index for s in steps] == [40, 70]


@pytest.mark.parametrize("values", [[], [1.0] * 5, [1.0] * 100, [0.0] * 100, [1.0, 0.0] * 50])
def test_short_constant_or_zero_series_have_no_step(values):
    assert detect_steps(values) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_timing_that_is_not_finite_and_non_negative_is_an_error(bad):
    with pytest.raises(ValueError, match="timings must be finite and non-negative numbers"):
        detect_steps([1.0] * 50 + [bad])


def test_a_step_in_a_series_without_noise_or_with_zeros():
    assert [s.index for s in regressions([1.0] * 30 + [1.2] * 30)] == [30]
    assert [s.index for s in regressions([0.0] * 30 + [1.0] * 30)] == [30]


@pytest.mark.parametrize(("values", "index"), [([0.0] * 20 + [1.0] * 10, 20), ([1e-300] * 20 + [1e300] * 10, 20)])
def test_a_step_from_zero_or_across_hundreds_of_orders_of_magnitude_has_a_finite_size(values, index):
    """Its size goes to the database, the REST API's JSON and the charts, none of which takes infinity."""
    (step,) = detect_steps(values)
    assert (step.index, step.change_pct) == (index, changepoint.MAX_CHANGE_PCT)


def test_timings_near_the_largest_float_are_placed_and_measured_with_zeros_among_them():
    """With a zero the timings are not logged: their sums must not overflow, nor the medians."""
    (step,) = detect_steps([0.0] * 50 + [1e308] * 50)
    assert (step.index, step.before, step.after) == (50, 0.0, 1e308)
    values = [0.0] + [1e308] * 49 + [1.7e308] * 50
    (step,) = detect_steps(values)
    assert (step.index, step.before, step.after) == (50, 1e308, 1.7e308)
    assert step.change_pct == pytest.approx(70) and np.isfinite(step.score)
    (step,) = detect_steps([0.0] + [1.7e308] * 50 + [1e308] * 50)
    assert (step.index, step.before, step.after) == (51, 1.7e308, 1e308)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regressions_bench", ROOT / "bench" / "regressions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_short_corpus_meets_the_targets_loosely_and_beats_the_baseline(bench):
    series = bench.corpus(seed=2, flat=60, stepped=60)
    ours = bench.measure(bench.fleetshard, series, online=False)
    baseline = bench.measure(bench.ttest_baseline, series, online=False)
    assert ours.false_alarms <= 0.04
    assert ours.recall >= 0.8
    assert ours.recall > baseline.recall + 0.4
    assert np.mean(np.array(list(ours.location.values())) <= 2) >= 0.8
    assert np.mean(np.array(list(ours.delay.values())) <= 6) >= 0.5
    assert np.mean(list(ours.delay.values())) < np.mean(list(baseline.delay.values()))
    both = set(ours.location) & set(baseline.location)
    assert sum(ours.location[k] for k in both) <= sum(baseline.location[k] for k in both) + 1
    table = bench.table({"fleetshard": ours, "baseline": baseline}, 60, 60)
    assert "| recall, steps 5-20% (target >= 90%) |" in table


def _shown(values: list[float], near: int) -> list[changepoint.Step]:
    return [s for s in regressions(values) if abs(s.index - near) <= changepoint.SAME_STEP]


def test_a_large_step_is_worth_notifying_once_notify_after_points_are_slow():
    series = noisy([(40, 1.0), (30, 1.3)], noise=0.02, seed=1)
    first = next(end for end in range(41, 71) if _shown(series[:end], 40))
    assert first - 40 < changepoint.NOTIFY_AFTER
    for end in range(first, 40 + changepoint.NOTIFY_AFTER):
        (step,) = _shown(series[:end], 40)
        assert abs(step.score) >= changepoint.NOTIFY_SCORE and not changepoint.worth_notifying(series[:end], step)
    end = 40 + changepoint.NOTIFY_AFTER
    (step,) = _shown(series[:end], 40)
    assert changepoint.worth_notifying(series[:end], step)


def test_a_smaller_step_is_worth_notifying_once_it_has_held_on_the_detectors_last_runs():
    """8% on 6% noise: its z stays under NOTIFY_SCORE; it is confirmed at the first upload after which
    the detector showed it with NOTIFY_HELD_SCORE on NOTIFY_HELD runs in a row, not one before."""
    rng = np.random.default_rng(3)
    series = list((1 + 0.06 * rng.standard_normal(80)) * np.r_[np.ones(40), np.full(40, 1.08)])
    confirmed = [
        end
        for end in range(41, 81)
        if any(changepoint.worth_notifying(series[:end], s) for s in _shown(series[:end], 40))
    ]
    end = confirmed[0]
    (step,) = _shown(series[:end], 40)
    assert changepoint.NOTIFY_HELD_SCORE <= abs(step.score) < changepoint.NOTIFY_SCORE
    held = [end - k for k in range(changepoint.NOTIFY_HELD)]
    assert all(any(abs(s.score) >= changepoint.NOTIFY_HELD_SCORE for s in _shown(series[:e], 40)) for e in held)
    before = [s for s in _shown(series[: end - 1], 40) if abs(s.score) >= changepoint.NOTIFY_HELD_SCORE]
    assert before and end - 1 - before[0].index >= changepoint.NOTIFY_AFTER  # held one run too few
    assert not changepoint.worth_notifying(series[: end - 1], before[0])
    # Held on one run fewer: one of the detector's last NOTIFY_HELD runs on the series before did not show it.
    shorter = end - changepoint.NOTIFY_HELD
    assert not any(abs(s.score) >= changepoint.NOTIFY_HELD_SCORE for s in _shown(series[:shorter], 40))


def test_a_step_down_is_never_worth_notifying():
    series = noisy([(40, 1.3), (30, 1.0)], noise=0.02, seed=1)
    (step,) = detect_steps(series)
    assert not step.is_regression and abs(step.score) >= changepoint.NOTIFY_SCORE
    assert not changepoint.worth_notifying(series, step)


def test_the_bench_measures_notifications_with_the_masters_rule(bench):
    series = bench.corpus(seed=2, flat=40, stepped=40)
    alarms, delay, share = bench.notified(series)
    assert alarms <= 0.05 and share >= 0.7
    assert delay is not None and changepoint.NOTIFY_AFTER <= delay <= 15
