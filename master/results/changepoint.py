"""Finding the steps in one series of timings, and telling which are regressions (DESIGN.md, "Benchmark
results": the timings step up and stay there).

The method, chosen by measurement (bench/regressions.py prints the comparison): binary
segmentation with a standardised mean-shift (CUSUM) statistic on the logarithm of the timings,
made robust in two ways:
- the noise level comes first from the successive differences with the largest 4% trimmed, so
  neither the steps themselves nor occasional outliers inflate it (a step is one large
  difference), then, more precisely, from the residuals around the segments that level finds (a
  MAD in their place, measured, raised 2-3% more steps within 6 points at the same offline false
  alarms but tripled the online ones: 13% of series without a step alarmed at some prefix against
  5%, its estimate of the noise being far less precise on a short series);
- each point is clipped to within `CLIP_SIGMAS` noise levels of the median of its neighbours, so a
  lone outlier weighs no more than an ordinary noisy point.
Against a fixed window test (Perfherder's t-test, 12 points back and 12 ahead, or a windowed
Mann-Whitney U), the statistic uses every point on either side of a split, so it finds steps far
smaller than the noise (recall 90% against 24% and 59%) and raises them a few points after they
happen instead of 12. E-Divisive with a permutation test (Chromium's dashboard) came out about
even at the same false-alarm rate (a little sooner, a little less recall) at 10-50 times the cost
and with random p-values; this runs after every upload on every series. A step is reported only
when its size, as medians of the segments either side, is at least `min_change_pct`, so small
real changes do not page anyone.
"""

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MIN_CHANGE_PCT = 5.0
MIN_SEGMENT = 3
MIN_AFTER = 3
CLIP_SIGMAS = 3.0
CLIP_HALF_WINDOW = 3
# The significance threshold of max |z| over all splits, tuned with bench/regressions.py: under 1%
# false alarms on 100-point series of 2-10% noise with the minimum change applied (0.4% on 7,000
# series of seeds 3 and 4, not the reported ones; 3.6 gives 0.75% and 3-4% more steps raised within
# 6 points, but 8.0% instead of 6.4% of 500 series of seed 3 alarm at some prefix online).
THRESHOLD = 3.8
# The first pass, only to find the segments the noise is then measured around, is more eager.
FIRST_PASS = 0.85
_TRIM = 0.96
_TRIM_Z = 2.053748910631823  # the normal's 98th percentile: |X| below it 96% of the time
_TRIMMED_VAR = 1 - 2 * _TRIM_Z * math.exp(-(_TRIM_Z**2) / 2) / math.sqrt(2 * math.pi) / _TRIM


@dataclass(frozen=True)
class Step:
    """A change of level: `index` is the first point at the new level; `before` and `after` are the
    typical values (medians) of the segments either side; positive `change_pct` means slower."""

    index: int
    before: float
    after: float
    change_pct: float
    score: float

    @property
    def is_regression(self) -> bool:
        return self.change_pct > 0


def detect_steps(
    values: Sequence[float],
    *,
    min_change_pct: float = MIN_CHANGE_PCT,
    threshold: float = THRESHOLD,
    min_after: int = MIN_AFTER,
) -> list[Step]:
    """Every step up or down in `values` (timings in time order), oldest first; a step needs
    `min_after` points after it before it is reported, and MIN_SEGMENT points between steps.
    Timings must be finite and non-negative (the parsers see to it); ValueError otherwise."""
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError("timings must be finite and non-negative numbers")
    if len(x) < MIN_SEGMENT + min_after:
        return []
    y = np.log(x) if np.all(x > 0) else x.copy()
    floor = max(float(np.max(np.abs(y))) * 1e-9, 1e-300)
    sigma = max(noise_level(y), floor)
    rough = _cuts(y, sigma, threshold * FIRST_PASS, min_after)
    sigma = max(min(residual_level(y, rough), sigma * 1.5), floor)
    return _significant(x, _cuts(y, sigma, threshold, min_after), min_change_pct)


def regressions(values: Sequence[float], *, min_change_pct: float = MIN_CHANGE_PCT) -> list[Step]:
    return [step for step in detect_steps(values, min_change_pct=min_change_pct) if step.is_regression]


def fixed_at(values: Sequence[float], regression: Step, *, min_change_pct: float = MIN_CHANGE_PCT) -> int | None:
    """The index where the series stepped back down after `regression` (to within `min_change_pct`
    of the level before it, or lower), or None while it stays slow."""
    for step in detect_steps(values, min_change_pct=min_change_pct):
        if step.index <= regression.index or step.is_regression:
            continue
        if step.after <= regression.before * (1 + min_change_pct / 100):
            return step.index
    return None


def noise_level(y: np.ndarray) -> float:
    """The noise's standard deviation from successive differences, the largest 4% left out (they are
    steps and outliers) and corrected for that trimming under normal noise."""
    return _trimmed_sd(np.diff(y)) / math.sqrt(2)


def residual_level(y: np.ndarray, cuts: list[tuple[int, float]]) -> float:
    """The noise's standard deviation around the medians of the segments between `cuts`: about twice
    as precise as `noise_level` once the steps are known, hence the second pass."""
    bounds = [0, *(c for c, _ in cuts), len(y)]
    return _trimmed_sd(np.concatenate([y[a:b] - _median(y[a:b]) for a, b in itertools.pairwise(bounds)]))


def _median(a: np.ndarray) -> float:
    """np.median of a short array without its overhead (it runs after every upload, per series)."""
    s: list[float] = sorted(a.tolist())
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _trimmed_sd(d: np.ndarray) -> float:
    a = np.sort(np.abs(d))
    if len(a) == 0:
        return 0.0
    a = a[: max(1, math.ceil(len(a) * _TRIM))]
    return math.sqrt(float(a @ a) / len(a) / _TRIMMED_VAR)


def clipped(y: np.ndarray, sigma: float) -> np.ndarray:
    """Each point kept within CLIP_SIGMAS noise levels of the median of its neighbourhood."""
    h = CLIP_HALF_WINDOW
    n = len(y)
    med = np.empty(n)
    if n > 2 * h:
        med[h : n - h] = np.sort(sliding_window_view(y, 2 * h + 1), axis=1)[:, h]
    for i in [*range(min(h, n)), *range(max(h, n - h), n)]:
        med[i] = _median(y[max(0, i - h) : i + h + 1])
    kept: np.ndarray = np.clip(y, med - CLIP_SIGMAS * sigma, med + CLIP_SIGMAS * sigma)
    return kept


def _cuts(y: np.ndarray, sigma: float, threshold: float, min_after: int) -> list[tuple[int, float]]:
    cuts: list[tuple[int, float]] = []
    _segment(clipped(y, sigma), 0, len(y), sigma, threshold, cuts, min_after)
    return sorted(cuts)


def _segment(
    y: np.ndarray, lo: int, hi: int, sigma: float, threshold: float, cuts: list[tuple[int, float]], min_after: int
) -> None:
    """Binary segmentation of y[lo:hi]. At the newest end a split may leave a single point after it:
    where the best split leaves fewer than `min_after`, the step is not reported yet (and the points
    after it are left out), rather than reported early at a wrong place."""
    newest = hi == len(y)
    n = hi - lo
    if n < MIN_SEGMENT + (1 if newest else MIN_SEGMENT):
        return
    sums = np.concatenate(([0.0], np.cumsum(y[lo:hi])))
    t = np.arange(MIN_SEGMENT, n - (0 if newest else MIN_SEGMENT) + (0 if newest else 1))
    n2 = n - t
    z = ((sums[n] - sums[t]) / n2 - sums[t] / t) / (sigma * np.sqrt(1 / t + 1 / n2))
    best = int(np.argmax(np.abs(z)))
    cut = lo + int(t[best])
    if abs(z[best]) < threshold:
        return
    if newest and hi - cut < min_after:
        _segment(y, lo, cut, sigma, threshold, cuts, min_after)
        return
    cuts.append((cut, float(z[best])))
    _segment(y, lo, cut, sigma, threshold, cuts, min_after)
    _segment(y, cut, hi, sigma, threshold, cuts, min_after)


def _significant(x: np.ndarray, cuts: list[tuple[int, float]], min_change_pct: float) -> list[Step]:
    """The cuts whose change, between the medians of the segments either side, reaches the minimum;
    the smallest is dropped and its neighbours measured again until every one does."""
    while True:
        bounds = [0, *(c for c, _ in cuts), len(x)]
        steps = []
        for k, (cut, score) in enumerate(cuts):
            before = _median(x[bounds[k] : cut])
            after = _median(x[cut : bounds[k + 2]])
            change = (after - before) / before * 100 if before > 0 else (math.inf if after > 0 else 0.0)
            steps.append(Step(cut, before, after, change, score))
        small = [k for k, s in enumerate(steps) if abs(s.change_pct) < min_change_pct]
        if not small:
            return steps
        del cuts[min(small, key=lambda k: abs(steps[k].change_pct))]
