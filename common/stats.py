"""The statistics of an A/B comparison (docs/design.md, "A/B runs and comparisons"), on plain lists
of timings so that the master's compare, the shard's `--repeat auto` and bench/compare.py share them.

Everything is distribution-free: a device's timings are skewed and have outliers, so the test is
Mann-Whitney's and the interval is the Hodges-Lehmann shift of log timings with its Moses bounds (a
change in percent that does not depend on which side is the baseline's scale). p-values across the
entries of one comparison are corrected with Benjamini-Hochberg, since a job with 200 entries would
otherwise find ten "changes" in noise at p < 0.05.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

import numpy as np

from common.constants import AB_DEFAULT_MIN_CHANGE_PCT, AB_MIN_RUNS

MIN_RUNS = AB_MIN_RUNS
DEFAULT_MIN_CHANGE_PCT = AB_DEFAULT_MIN_CHANGE_PCT


# The false discovery rate among the entries called slower or faster. 10%, not 5%: measured on
# bench/compare.py's corpus, 5% missed one in eight real changes of 5% or more on few-repeat noisy
# entries, while 10% still flags under 2% of unchanged entries (the minimum change helps there).
FDR = 0.10
_Z_975 = 1.959963984540054
# Exact Mann-Whitney distributions up to this many values in all (and without ties); the normal
# approximation beyond is within 0.002 of the exact p there.
_EXACT_MAX_TOTAL = 50
# The most pairwise differences the interval lists at once (8 MB); beyond, they are selected by value.
_MAX_PAIRS = 1_000_000
# exp() of more overflows: a change is at most about 1e306 %.
_MAX_LOG_RATIO = 700.0


class Verdict(StrEnum):
    SLOWER = "slower"
    FASTER = "faster"
    NO_CHANGE = "no change"
    TOO_FEW_RUNS = "too few runs"


class Decision(StrEnum):
    """Where an entry's 95% interval lies against the minimum change: what `--repeat auto` waits for."""

    ABOVE = "above"
    BELOW = "below"
    INSIDE = "inside"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Change:
    """One entry's comparison before the correction across entries."""

    base_median: float | None
    new_median: float | None
    change_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    p_value: float | None
    base_runs: int
    new_runs: int


def _midranks(values: np.ndarray) -> tuple[np.ndarray, bool]:
    """Ranks from 1, ties sharing their mean rank, and whether there were ties."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    ranks = np.empty(len(values), dtype=float)
    ties = False
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[i]:
            j += 1
        ties = ties or j > i
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks, ties


@cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many orderings of m and n distinct values give each U from 0 to m*n: the largest value is
    either of the first sample (it beats all n of the second) or of the second (it beats none)."""
    if m == 0 or n == 0:
        return (1,)
    with_first = _u_counts(m - 1, n)
    with_second = _u_counts(m, n - 1)
    counts = [0] * (m * n + 1)
    for u, c in enumerate(with_first):
        counts[u + n] += c
    for u, c in enumerate(with_second):
        counts[u] += c
    return tuple(counts)


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sided p-value of Mann-Whitney's U: exact for small samples without ties, else the
    normal approximation with the tie correction and a continuity correction (as SciPy's)."""
    m, n = len(a), len(b)
    if m == 0 or n == 0:
        raise ValueError("both samples need values")
    ranks, ties = _midranks(np.concatenate([np.asarray(a, dtype=float), np.asarray(b, dtype=float)]))
    u1 = float(ranks[:m].sum()) - m * (m + 1) / 2
    u = max(u1, m * n - u1)
    if not ties and m + n <= _EXACT_MAX_TOTAL:
        counts = _u_counts(m, n)
        at_least = sum(counts[math.ceil(u) :])
        return min(1.0, 2 * at_least / math.comb(m + n, m))
    total = m + n
    _, tie_sizes = np.unique(ranks, return_counts=True)
    tie_term = float((tie_sizes**3 - tie_sizes).sum()) / (total * (total - 1))
    sigma = math.sqrt(m * n / 12 * ((total + 1) - tie_term))
    if sigma == 0:
        return 1.0
    z = (u - m * n / 2 - 0.5) / sigma
    return min(1.0, math.erfc(z / math.sqrt(2)))


def shift_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """The Hodges-Lehmann estimate of how much larger b is than a, in log units, with its 95% Moses
    bounds: order statistics of all pairwise differences log(b_j) - log(a_i). Past _MAX_PAIRS pairs
    (a revision's side may bring 200,000 timings) they are selected without listing every pair."""
    log_a = np.sort(np.log(np.asarray(a, dtype=float)))
    log_b = np.sort(np.log(np.asarray(b, dtype=float)))
    m, n = len(a), len(b)
    pairs = m * n
    # 1-based bounds d(C) and d(pairs + 1 - C); with C under 1 the interval is unbounded.
    reach = math.floor(pairs / 2 - _Z_975 * math.sqrt(pairs * (m + n + 1) / 12))
    low_index, high_index = (reach - 1, pairs - reach) if reach >= 1 else (0, pairs - 1)
    middle = ((pairs - 1) // 2, pairs // 2)
    if pairs <= _MAX_PAIRS:
        diffs = np.sort(np.subtract.outer(log_b, log_a).ravel())
        estimate = float(np.median(diffs))
        return estimate, float(diffs[low_index]), float(diffs[high_index])
    estimate = (_kth_difference(log_a, log_b, middle[0]) + _kth_difference(log_a, log_b, middle[1])) / 2
    return estimate, _kth_difference(log_a, log_b, low_index), _kth_difference(log_a, log_b, high_index)


def _kth_difference(log_a: np.ndarray, log_b: np.ndarray, k: int) -> float:
    """The k-th smallest (from 0) of all b_j - a_i of two sorted arrays, by bisection on its value:
    each step counts the differences at most a value in O(n log m), never holding the m*n of them."""
    m = len(log_a)

    def at_most(d: float) -> int:
        return int((m - np.searchsorted(log_a, log_b - d, side="left")).sum())

    low, high = float(log_b[0] - log_a[-1]), float(log_b[-1] - log_a[0])
    for _ in range(200):
        mid = low + (high - low) / 2
        if not low < mid < high:
            break
        if at_most(mid) >= k + 1:
            high = mid
        else:
            low = mid
    # The largest difference not above `high`: a real pair's, not a point between two of them.
    index = np.searchsorted(log_a, log_b - high, side="left")
    valid = index < m
    return float((log_b[valid] - log_a[index[valid]]).max()) if valid.any() else high


def _pct(log_ratio: float) -> float:
    """A change in percent; past e^700 (timings of 1e-300 s against 1e300 s) it stays finite."""
    return (math.exp(min(log_ratio, _MAX_LOG_RATIO)) - 1) * 100


def _median(values: list[float]) -> float:
    """The median without overflow: the mean of two middle values near the largest float is finite."""
    ordered = sorted(values)
    half = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[half]
    mean = (ordered[half - 1] + ordered[half]) / 2
    return mean if math.isfinite(mean) else ordered[half - 1] / 2 + ordered[half] / 2


def compare(base: Sequence[float], new: Sequence[float]) -> Change:
    """One entry: medians, the change of the medians in percent, its interval and the raw p-value.
    Timings that are not positive finite numbers are left out (a run that measured nothing)."""
    a = [float(v) for v in base if math.isfinite(v) and v > 0]
    b = [float(v) for v in new if math.isfinite(v) and v > 0]
    base_median = _median(a) if a else None
    new_median = _median(b) if b else None
    change = None
    if base_median and new_median:
        ratio = new_median / base_median
        change = (ratio - 1) * 100 if math.isfinite(ratio) else _pct(math.log(new_median) - math.log(base_median))
    if len(a) < MIN_RUNS or len(b) < MIN_RUNS:
        return Change(base_median, new_median, change, None, None, None, len(a), len(b))
    _, low, high = shift_interval(a, b)
    return Change(base_median, new_median, change, _pct(low), _pct(high), mann_whitney_p(a, b), len(a), len(b))


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Adjusted p-values (q-values) controlling the false discovery rate across a family."""
    count = len(p_values)
    if count == 0:
        return []
    order = sorted(range(count), key=lambda i: p_values[i])
    adjusted = [0.0] * count
    running = 1.0
    for rank in range(count, 0, -1):
        index = order[rank - 1]
        running = min(running, p_values[index] * count / rank)
        adjusted[index] = running
    return adjusted


def verdict(change: Change, q_value: float | None, min_change_pct: float) -> Verdict:
    """`slower` or `faster` when the corrected p-value is under FDR and the change is at least the
    minimum; `too few runs` when either side has fewer than MIN_RUNS timings."""
    if q_value is None or change.change_pct is None:
        return Verdict.TOO_FEW_RUNS
    if q_value < FDR and abs(change.change_pct) >= min_change_pct:
        return Verdict.SLOWER if change.change_pct > 0 else Verdict.FASTER
    return Verdict.NO_CHANGE


def decision(change: Change, min_change_pct: float) -> Decision:
    """Whether the 95% interval of the change lies wholly above +min, below -min, or inside +-min."""
    if change.ci_low_pct is None or change.ci_high_pct is None:
        return Decision.UNDECIDED
    if change.ci_low_pct > min_change_pct:
        return Decision.ABOVE
    if change.ci_high_pct < -min_change_pct:
        return Decision.BELOW
    if -min_change_pct <= change.ci_low_pct and change.ci_high_pct <= min_change_pct:
        return Decision.INSIDE
    return Decision.UNDECIDED
