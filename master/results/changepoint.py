"""Finding the steps in one series of timings, and telling which are regressions (docs/design.md, "Benchmark
results": the timings step up and stay there).

The method, chosen by measurement (bench/regressions.py prints the comparison): binary
segmentation with a standardised mean-shift (CUSUM) statistic on the logarithm of the timings,
made robust in three ways:
- the noise level comes first from the successive differences with the largest 4% trimmed, so
  neither the steps themselves nor occasional outliers inflate it (a step is one large
  difference), then, more precisely, from the residuals around the segments that level finds (a
  MAD in their place, measured, raised 2-3% more steps within 6 points at the same offline false
  alarms but tripled the online ones: 13% of series without a step alarmed at some prefix against
  5%, its estimate of the noise being far less precise on a short series);
- each point is clipped to within `CLIP_SIGMAS` noise levels of the median of its neighbours, so a
  lone outlier weighs no more than an ordinary noisy point;
- each step found is confirmed by a Mann-Whitney rank test between the segments either side, which
  drops the cuts that a few extreme points made (several outliers together, which clipping cannot
  tell from a short step) and so lets the threshold of the mean shift be lower: more steps found at
  the same false-alarm rate.
Against a fixed window test (Perfherder's t-test, 12 points back and 12 ahead, or a windowed
Mann-Whitney U), the statistic uses every point on either side of a split, so it finds steps far
smaller than the noise (recall 91-93% against 23-26%) and raises them a few points after they
happen instead of 12. Measured and not kept: a Bayes factor over the split's place and the step's
size in place of max |z| (no better at the same false alarms), a higher threshold for splits near
the newest point (later alarms, no fewer false ones), and the true noise level in place of the
estimate (the same trade-off: the estimate costs nothing). E-Divisive with a permutation test
(Chromium's dashboard) came out about even at the same false-alarm rate (a little sooner, a little
less recall) at 10-50 times the cost and with random p-values; this runs after every upload on
every series. A step is reported only when its size, as medians of the segments either side, is at
least `min_change_pct`, so small real changes do not page anyone; a size beyond `MAX_CHANGE_PCT`
(from a zero timing, or across hundreds of orders of magnitude) is reported as that.
"""

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MIN_CHANGE_PCT = 5.0
# The size given to a step from a zero timing, or of more than this (a ten-million-fold slowdown): the
# database, the REST API's JSON and the charts take no infinity.
MAX_CHANGE_PCT = 1e9
MIN_SEGMENT = 3
MIN_AFTER = 3
CLIP_SIGMAS = 3.0
CLIP_HALF_WINDOW = 3
# The significance threshold of max |z| over all splits, and the Mann-Whitney z (in the step's
# direction, between the segments either side) that then confirms each step; tuned together with
# bench/regressions.py on seeds 3, 4 and 7-10, not the reported ones. The rank test drops the cuts a
# few extreme points made: with it, 3.3 keeps 0.7% false alarms on those 3,000 series without a
# step and finds 91.1% of the steps, where max |z| alone gave 0.6% and 90.3% at 3.6, 0.3% and 89.3%
# at the former 3.8. It needs 4 points after a step (3 of 100 give at most z = 2.94), which raises
# a step a point or two later (median 5-6 points after it instead of 4) and alarms fewer series
# online.
# Where the segments are too short for any order of their points to reach CONFIRM_Z (4 points after
# a step and fewer than 30 before it, 5 and fewer than 13, any number and 3 or fewer), the rank test
# asks for the most it can give: every point after the step beyond every point before. A step needs
# CONFIRM_AFTER points after it either way.
THRESHOLD = 3.3
CONFIRM_Z = 3.2
CONFIRM_AFTER = 4
# A regression is confirmed, and `regression.new` sent (docs/notifications.md), once it is NOTIFY_AFTER
# points old (from its first slow point on) and the detector shows it either with a mean-shift z of at
# least NOTIFY_SCORE, or with at least NOTIFY_HELD_SCORE on each of its last NOTIFY_HELD runs (the
# series without its newest 0..NOTIFY_HELD-1 points). Most alarms on a series without a step are
# brief: raised, then withdrawn as points come in; the few that reach a high z do so for an upload or
# two. A large step is notified at once, a smaller one once it has held. Tuned with bench/regressions.py
# on seeds 3, 4 and 9-16 (5,000 series of each kind): 0.32% of series without a step notified (at most
# 0.8% on a seed), 86.0% of steps notified, a median 8 points after them; the former rule (z >= 4.5 at
# 8 points) gave 0.68% (at most 1.4%), 87.5% and 8.
NOTIFY_SCORE = 5.25
NOTIFY_AFTER = 6
NOTIFY_HELD_SCORE = 4.0
NOTIFY_HELD = 10
# A step found within this many points of another (a known regression, or the same one in a shorter
# series) is the same step.
SAME_STEP = 3
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
    `min_after` points after it to be placed and CONFIRM_AFTER to be confirmed by the rank test
    before it is reported, and MIN_SEGMENT points between steps.
    Timings must be finite and non-negative (the parsers see to it); ValueError otherwise."""
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError("timings must be finite and non-negative numbers")
    if len(x) < MIN_SEGMENT + min_after:
        return []
    # With a zero among them the timings are not logged but scaled to at most 1 (z and the clipping
    # do not depend on the scale), so that sums of timings near the largest float do not overflow.
    peak = float(np.max(x))
    y = np.log(x) if np.all(x > 0) else x / (peak or 1.0)
    floor = max(float(np.max(np.abs(y))) * 1e-9, 1e-300)
    sigma = max(noise_level(y), floor)
    rough = _cuts(y, sigma, threshold * FIRST_PASS, min_after)
    sigma = max(min(residual_level(y, rough), sigma * 1.5), floor)
    return _significant(x, _cuts(y, sigma, threshold, min_after), min_change_pct)


def regressions(values: Sequence[float], *, min_change_pct: float = MIN_CHANGE_PCT) -> list[Step]:
    return [step for step in detect_steps(values, min_change_pct=min_change_pct) if step.is_regression]


def worth_notifying(values: Sequence[float], step: Step) -> bool:
    """Whether `step`, a regression the detector finds in `values`, is confirmed (NOTIFY_SCORE above):
    strong enough now, or held on the detector's last NOTIFY_HELD runs. The runs on shorter series are
    made only for a step between the two scores, so it costs nothing for the rest."""
    if not step.is_regression or len(values) - step.index < NOTIFY_AFTER:
        return False
    if abs(step.score) >= NOTIFY_SCORE:
        return True
    if abs(step.score) < NOTIFY_HELD_SCORE:
        return False
    return all(
        any(
            abs(s.index - step.index) <= SAME_STEP and abs(s.score) >= NOTIFY_HELD_SCORE
            for s in regressions(values[:-k])
        )
        for k in range(1, NOTIFY_HELD)
    )


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
    if n % 2:
        return s[n // 2]
    middle = (s[n // 2 - 1] + s[n // 2]) / 2
    return middle if math.isfinite(middle) else s[n // 2 - 1] / 2 + s[n // 2] / 2


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
    """The cuts whose change, between the medians of the segments either side, reaches the minimum,
    and which a rank test of those segments confirms; the weakest failing cut (the smallest change,
    then the rank z farthest below what it needs; the oldest of equals) is dropped and its neighbours
    measured again until every one passes. Dropping a cut changes only its neighbours, so each cut is
    measured a few times and the failing ones wait in heaps: a series of thousands of short steps costs
    O(cuts log cuts), not a pass over every cut per dropped cut (1.8 s on 10,000 points of 860 weak
    cuts)."""
    m = len(cuts)
    at = [0, *(c for c, _ in cuts), len(x)]  # cut k is at[k + 1]; its neighbours are linked
    prev, nxt = list(range(-1, m + 1)), list(range(1, m + 3))
    alive = [True] * m
    version = [0] * m
    measured: list[tuple[Step, float]] = [(Step(0, 0.0, 0.0, 0.0, 0.0), 0.0)] * m
    small: list[tuple[float, int, int]] = []
    weak: list[tuple[float, int, int]] = []

    def measure(k: int) -> None:
        step, margin = _measure(x, at[prev[k + 1]], at[k + 1], at[nxt[k + 1]], cuts[k][1])
        measured[k] = (step, margin)
        version[k] += 1
        if abs(step.change_pct) < min_change_pct:
            heapq.heappush(small, (abs(step.change_pct), k, version[k]))
        elif margin < 0:
            heapq.heappush(weak, (margin, k, version[k]))

    def pop(heap: list[tuple[float, int, int]]) -> int | None:
        while heap:
            _, k, v = heapq.heappop(heap)
            if alive[k] and v == version[k]:
                return k
        return None

    for k in range(m):
        measure(k)
    while True:
        drop = pop(small)
        if drop is None:
            drop = pop(weak)
        if drop is None:
            return [measured[k][0] for k in range(m) if alive[k]]
        alive[drop] = False
        before, after = prev[drop + 1], nxt[drop + 1]
        nxt[before], prev[after] = after, before
        for neighbour in (before - 1, after - 1):
            if 0 <= neighbour < m:
                measure(neighbour)


def _measure(x: np.ndarray, lo: int, cut: int, hi: int, score: float) -> tuple[Step, float]:
    """The step at `cut` between the segments x[lo:cut] and x[cut:hi], and how far the rank z of the
    second against the first, in the step's direction, is above what confirms it (negative: not
    confirmed)."""
    before = _median(x[lo:cut])
    after = _median(x[cut:hi])
    change = (after - before) / before * 100 if before > 0 else (math.inf if after > 0 else 0.0)
    change = min(change, MAX_CHANGE_PCT)
    n1, n2 = cut - lo, hi - cut
    if n2 < CONFIRM_AFTER:
        return Step(cut, before, after, change, score), -math.inf
    rank_z = mann_whitney_z(x[lo:cut], x[cut:hi])
    separated = math.sqrt(3 * n1 * n2 / (n1 + n2 + 1))  # the rank z when every point after is beyond
    needed = min(CONFIRM_Z, separated * (1 - 1e-9))
    return Step(cut, before, after, change, score), (rank_z if change >= 0 else -rank_z) - needed


def mann_whitney_z(before: np.ndarray, after: np.ndarray) -> float:
    """The Mann-Whitney U statistic of `after` against `before` as a normal z (ties get their mean
    rank and the variance its tie correction): positive when `after` is higher. Ranks, so a few
    extreme points weigh no more than any others; 0.0 when every value is equal."""
    n1, n2 = len(before), len(after)
    n = n1 + n2
    if n1 == 0 or n2 == 0:
        return 0.0
    _, inverse, counts = np.unique(np.concatenate((before, after)), return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2
    u = float(mean_rank[inverse[n1:]].sum()) - n2 * (n2 + 1) / 2
    ties = float(np.sum(counts.astype(float) ** 3 - counts))
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    return (u - n1 * n2 / 2) / math.sqrt(variance) if variance > 0 else 0.0
