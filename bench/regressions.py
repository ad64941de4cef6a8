"""How well regressions are found: fleetshard's detector against a Perfherder-style t-test baseline.

Run: `.venv/bin/python bench/regressions.py [--flat 500] [--steps 500] [--seed 1]`. Prints a markdown
table (docs/benchmarks.md's) and the run time. The detector's thresholds were tuned on seeds 3, 4 and 7-10;
docs/benchmarks.md reports seeds 1, 2, 5 and 6, which tuning never looked at.

The corpus is seeded: series of 100 timings with normal noise of 2-10% of the level, 1% outliers
(x1.3-3 slower, or x0.5-0.8 faster, one in five), and, in half of them, one step up of 5-20% at a
point drawn from 12-88 (so that the baseline's 12-point windows fit on both sides).
- false alarms: the share of series without a step where a regression is reported; "online" runs
  the detector on every prefix of at least 24 points, as the master does after each upload.
- recall: the share of stepped series where a regression is reported within MATCH points of the
  true step (one placed farther away is a false alarm, not a detection).
- spurious: the share of stepped series where a regression is also reported farther than MATCH
  points from the step.
- location error: points between the reported and the true first slow point, over detected series.
- delay: the fewest points from the step on (the first slow point counts as 1) at which the
  detector, run on the series up to there, reports the step.
"Located within 2" and "raised within 6" are given twice: over every stepped series (a step not
found counts as neither: the issue's target) and over the steps found (the detector's precision).
The oracle bounds below the table are about what a detector told the true level, noise, step size and (for
the delay) place could reach on the same steps, with a 1% false-alarm rate: no real detector does
better, so they show how much of a shortfall is the corpus's and how much the detector's.
`--candidates N` also measures the other methods considered (E-Divisive means with a permutation
test, a windowed Mann-Whitney U) on the first N series of each kind (slow: E-Divisive permutes).
"""

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from master.results.changepoint import (  # noqa: E402
    NOTIFY_AFTER,
    NOTIFY_HELD,
    NOTIFY_HELD_SCORE,
    NOTIFY_SCORE,
    regressions,
    worth_notifying,
)

LENGTH = 100
MATCH = 10
ONLINE_FROM = 24
Detector = Callable[[Sequence[float]], list[int]]


@dataclass(frozen=True)
class Series:
    values: np.ndarray
    step: int | None
    step_pct: float
    noise_pct: float
    level: float


def corpus(seed: int, flat: int, stepped: int, length: int = LENGTH) -> list[Series]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(flat + stepped):
        level = 10 ** rng.uniform(-6, 1)
        noise = rng.uniform(0.02, 0.10)
        values = level * (1 + noise * rng.standard_normal(length))
        outliers = rng.random(length) < 0.01
        slow = rng.random(length) < 0.8
        values[outliers & slow] *= rng.uniform(1.3, 3.0, length)[outliers & slow]
        values[outliers & ~slow] *= rng.uniform(0.5, 0.8, length)[outliers & ~slow]
        step, pct = None, 0.0
        if k >= flat:
            step, pct = int(rng.integers(12, length - 12 + 1)), float(rng.uniform(0.05, 0.20))
            values[step:] *= 1 + pct
        out.append(Series(np.maximum(values, level * 1e-3), step, pct * 100, noise * 100, level))
    return out


def fleetshard(values: Sequence[float]) -> list[int]:
    return [step.index for step in regressions(values)]


def ttest_baseline(values: Sequence[float], back: int = 12, ahead: int = 12, t_min: float = 7.0) -> list[int]:
    """Perfherder's classic rule: Welch's t between the 12 points before i and the 12 from i on, an
    alert where t > 7 and t is not lower than at either neighbour (here only upward steps)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < back + ahead:
        return []
    w = sliding_window_view(x, back)
    mean, var = w.mean(axis=1), w.var(axis=1, ddof=1)
    i = np.arange(back, n - ahead + 1)
    diff = mean[i] - mean[i - back]
    se = np.sqrt(var[i - back] / back + var[i] / ahead)
    t = np.divide(diff, se, out=np.where(diff > 0, np.inf, 0.0), where=se > 0)
    found = []
    for k in range(len(i)):
        if t[k] > t_min and (k == 0 or t[k] >= t[k - 1]) and (k == len(i) - 1 or t[k] >= t[k + 1]):
            found.append(int(i[k]))
    return found


def mann_whitney_windows(
    values: Sequence[float], back: int = 12, ahead: int = 12, z_min: float = 3.3, min_change_pct: float = 5.0
) -> list[int]:
    """A windowed Mann-Whitney U test (normal approximation, one-sided): the same windows and local
    maximum as the t-test, a rank statistic (robust to outliers), and the 5% minimum change."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < back + ahead:
        return []
    w = sliding_window_view(x, back)
    i = np.arange(back, n - ahead + 1)
    a, b = w[i - back], w[i]
    u = (b[:, :, None] > a[:, None, :]).sum(axis=(1, 2)) + 0.5 * (b[:, :, None] == a[:, None, :]).sum(axis=(1, 2))
    z = (u - back * ahead / 2) / np.sqrt(back * ahead * (back + ahead + 1) / 12)
    change = (np.median(b, axis=1) / np.median(a, axis=1) - 1) * 100
    found = []
    for k in range(len(i)):
        peak = (k == 0 or z[k] >= z[k - 1]) and (k == len(i) - 1 or z[k] >= z[k + 1])
        if z[k] > z_min and change[k] >= min_change_pct and peak:
            found.append(int(i[k]))
    return found


def _energy(d: np.ndarray, m: int = 3) -> tuple[int, float]:
    """The best split of a series by E-Divisive's energy statistic (alpha = 1), from its distance
    matrix `d`; block sums come from one 2-D cumulative sum, so every split costs O(1)."""
    n = len(d)
    c = np.zeros((n + 1, n + 1))
    c[1:, 1:] = d.cumsum(0).cumsum(1)
    t = np.arange(m, n - m + 1)
    within_a = c[t, t]
    within_b = c[n, n] - 2 * c[t, n] + c[t, t]
    between = c[t, n] - c[t, t]
    na, nb = t, n - t
    q = na * nb / n * (2 * between / (na * nb) - within_a / (na * (na - 1)) - within_b / (nb * (nb - 1)))
    k = int(np.argmax(q))
    return int(t[k]), float(q[k])


def e_divisive(
    values: Sequence[float], permutations: int = 99, alpha: float = 0.05, min_change_pct: float = 5.0
) -> list[int]:
    """E-Divisive means (Matteson and James; Chromium's and MongoDB's dashboards): binary segmentation
    by the energy statistic, each split kept when a permutation test gives p <= alpha, then the 5%
    minimum change between segment medians, upward steps only."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(0)
    cuts: list[int] = []

    def seg(lo: int, hi: int) -> None:
        if hi - lo < 8:
            return
        y = x[lo:hi]
        d = np.abs(y[:, None] - y[None, :])
        t, q = _energy(d)
        worse = 0
        for _ in range(permutations):
            p = rng.permutation(len(y))
            if _energy(d[p][:, p])[1] >= q:
                worse += 1
        if (worse + 1) / (permutations + 1) > alpha:
            return
        cuts.append(lo + t)
        seg(lo, lo + t)
        seg(lo + t, hi)

    seg(0, len(x))
    cuts.sort()
    bounds = [0, *cuts, len(x)]
    return [
        c
        for k, c in enumerate(cuts)
        if np.median(x[c : bounds[k + 2]]) / np.median(x[bounds[k] : c]) - 1 >= min_change_pct / 100
    ]


def _near(found: list[int], step: int) -> int | None:
    close = [abs(f - step) for f in found if abs(f - step) <= MATCH]
    return min(close) if close else None


@dataclass
class Figures:
    false_alarms: float
    online_false_alarms: float | None
    recall: float
    spurious: float
    recall_by_ratio: dict[str, float]
    location: dict[int, int]  # by the series' index, for detected steps
    delay: dict[int, int]


RATIO_BUCKETS = ((0, 1, "step < 1x noise"), (1, 2, "1-2x noise"), (2, 3, "2-3x noise"), (3, 99, ">= 3x noise"))


def measure(detect: Detector, series: list[Series], *, online: bool = True) -> Figures:
    flat = [s for s in series if s.step is None]
    stepped = [s for s in series if s.step is not None]
    alarms = sum(bool(detect(s.values)) for s in flat)
    online_alarms = (
        sum(any(detect(s.values[:end]) for end in range(ONLINE_FROM, LENGTH + 1)) for s in flat) if online else 0
    )
    location: dict[int, int] = {}
    delay: dict[int, int] = {}
    spurious = 0
    hits = {label: [0, 0] for *_, label in RATIO_BUCKETS}
    for i, s in enumerate(stepped):
        assert s.step is not None
        found = detect(s.values)
        spurious += any(abs(f - s.step) > MATCH for f in found)
        error = _near(found, s.step)
        label = next(label for lo, hi, label in RATIO_BUCKETS if lo <= s.step_pct / s.noise_pct < hi)
        hits[label][1] += 1
        if error is None:
            continue
        hits[label][0] += 1
        location[i] = error
        delay[i] = next(
            k for k in range(1, LENGTH - s.step + 1) if _near(detect(s.values[: s.step + k]), s.step) is not None
        )
    return Figures(
        false_alarms=alarms / len(flat),
        online_false_alarms=online_alarms / len(flat) if online else None,
        recall=len(location) / len(stepped),
        spurious=spurious / len(stepped),
        recall_by_ratio={label: h / max(n, 1) for label, (h, n) in hits.items()},
        location=location,
        delay=delay,
    )


def notified(series: list[Series]) -> tuple[float, float | None, float]:
    """What `regression.new` does, run after every upload as the master runs the detector: the share of
    flat series notified at some prefix ("notified false alarms"), the median delay in points from the
    step to the notification, and the share of steps notified within MATCH points of their place. A
    regression is notified once the master's rule (changepoint.worth_notifying) confirms it."""

    def confirmed(values: np.ndarray, end: int, near: int | None = None) -> bool:
        return any(
            (near is None or abs(st.index - near) <= MATCH) and worth_notifying(values[:end], st)
            for st in regressions(values[:end])
        )

    flat = [s for s in series if s.step is None]
    stepped = [s for s in series if s.step is not None]
    alarms = sum(any(confirmed(s.values, end) for end in range(ONLINE_FROM, LENGTH + 1)) for s in flat)
    delays = []
    for s in stepped:
        assert s.step is not None
        first = next((end for end in range(s.step + 1, LENGTH + 1) if confirmed(s.values, end, s.step)), None)
        if first is not None:
            delays.append(first - s.step)
    return alarms / len(flat), float(np.median(delays)) if delays else None, len(delays) / len(stepped)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _stats(values: list[int], within: int, out_of: int) -> tuple[str, str, str, str, str]:
    """Mean, median, 95th percentile, share within `within` of the values, and of `out_of` series."""
    if not values:
        return "-", "-", "-", "-", "-"
    a = np.asarray(values)
    near = int(np.sum(a <= within))
    return (
        f"{a.mean():.2f}",
        f"{np.median(a):.0f}",
        f"{np.percentile(a, 95):.0f}",
        _pct(near / len(a)),
        _pct(near / out_of),
    )


def oracle_bounds(series: list[Series], false_alarms: float = 0.01) -> tuple[float, float, float]:
    """Upper bounds, over the stepped series, of recall, "located within 2" and "raised within 6" for
    any detector with `false_alarms`, computed for an oracle that knows the level, the noise and the
    step's size (on log timings; approximate, as the noise is taken as normal on the log scale and an
    outlier weighs as a 3-sigma point):
    - raised within 6: one test, at the true place, of the 6 slow points against the known level;
    - located within 2: the Bayes-best guess of the place (most posterior mass within 2 points);
    - recall: a test of all points at the true place, times the chance that the step's size measured
      from the segments' medians reaches the 5% minimum."""
    normal = NormalDist()
    z = normal.inv_cdf(1 - false_alarms)
    raised, located, recall = [], [], []
    for s in series:
        if s.step is None:
            continue
        sigma = s.noise_pct / 100
        shift = float(np.log1p(s.step_pct / 100))
        ratio = shift / sigma
        raised.append(normal.cdf(ratio * np.sqrt(6) - z))
        y = np.log(s.values)
        base = float(np.log(s.level))
        fit = np.minimum((y - base) ** 2, (3 * sigma) ** 2)  # an outlier weighs as a 3-sigma point
        fit_after = np.minimum((y - base - shift) ** 2, (3 * sigma) ** 2)
        places = np.arange(12, LENGTH - 12 + 1)
        before, after = np.concatenate(([0.0], np.cumsum(fit))), np.concatenate(([0.0], np.cumsum(fit_after)))
        loglik = -(before[places] + after[-1] - after[places]) / (2 * sigma**2)
        posterior = np.exp(loglik - loglik.max())
        posterior /= posterior.sum()
        located.append(float(np.max(np.convolve(posterior, np.ones(5), mode="same"))))
        m, k = s.step, LENGTH - s.step
        measured = sigma * np.sqrt(1 / m + 1 / k) * np.sqrt(np.pi / 2)  # the error of a difference of medians
        recall.append(normal.cdf(ratio * np.sqrt(m * k / LENGTH) - z) * normal.cdf((shift - np.log(1.05)) / measured))
    return float(np.mean(recall)), float(np.mean(located)), float(np.mean(raised))


def table(results: dict[str, Figures], flat: int, stepped: int) -> str:
    names = list(results)
    figs = list(results.values())
    rows = [
        ("false alarms (no step; target <= 1%)", [_pct(f.false_alarms) for f in figs]),
        (
            f"false alarms online (every prefix >= {ONLINE_FROM} points)",
            ["-" if f.online_false_alarms is None else _pct(f.online_false_alarms) for f in figs],
        ),
        ("recall, steps 5-20% (target >= 90%)", [_pct(f.recall) for f in figs]),
        (f"stepped series with a regression farther than {MATCH} points", [_pct(f.spurious) for f in figs]),
    ]
    for *_, label in RATIO_BUCKETS:
        rows.append((f"recall, {label}", [_pct(f.recall_by_ratio[label]) for f in results.values()]))
    both = set.intersection(*(set(f.location) for f in figs))
    loc = [_stats(list(f.location.values()), 2, stepped) for f in figs]
    dly = [_stats(list(f.delay.values()), 6, stepped) for f in figs]
    loc_both = [_stats([f.location[k] for k in both], 2, len(both)) for f in figs]
    dly_both = [_stats([f.delay[k] for k in both], 6, len(both)) for f in figs]
    rows += [
        ("location error, mean / median (points, steps found)", [f"{s[0]} / {s[1]}" for s in loc]),
        ("location error, p95 (points)", [s[2] for s in loc]),
        ("located within 2 points, of all steps (target: all)", [s[4] for s in loc]),
        ("located within 2 points, of the steps found", [s[3] for s in loc]),
        ("delay, mean / median (points after the step, steps found)", [f"{s[0]} / {s[1]}" for s in dly]),
        ("delay, p95 (points)", [s[2] for s in dly]),
        ("raised within 6 points, of all steps (target: all)", [s[4] for s in dly]),
        ("raised within 6 points, of the steps found", [s[3] for s in dly]),
        (f"on the {len(both)} steps all detect: location error, mean", [s[0] for s in loc_both]),
        ("... located within 2 points", [s[3] for s in loc_both]),
        ("... delay, mean / median", [f"{s[0]} / {s[1]}" for s in dly_both]),
        ("... raised within 6 points", [s[3] for s in dly_both]),
    ]
    out = [f"Corpus: {flat} series without a step, {stepped} with one (100 points each).", ""]
    out.append("| figure | " + " | ".join(names) + " |")
    out.append("|---|" + "---|" * len(names))
    out += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flat", type=int, default=500)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--candidates",
        type=int,
        default=0,
        metavar="N",
        help="also compare the methods considered (E-Divisive, windowed Mann-Whitney) on N series of each kind",
    )
    parser.add_argument(
        "--notifications-only", action="store_true", help="only the notification figures (a quarter of the time)"
    )
    args = parser.parse_args()
    started = time.monotonic()
    series = corpus(args.seed, args.flat, args.steps)
    detectors: dict[str, Detector] = {"fleetshard": fleetshard, "t-test 12/12, t > 7": ttest_baseline}
    if not args.notifications_only:
        results = {name: measure(detect, series) for name, detect in detectors.items()}
        print(table(results, args.flat, args.steps))
    alarms, delay, share = notified(series)
    print(
        f"\nNotifications (regression.new from {NOTIFY_AFTER} points after the step, at a score of {NOTIFY_SCORE}, "
        f"or of {NOTIFY_HELD_SCORE} on the last {NOTIFY_HELD} uploads): "
        f"notified false alarms {_pct(alarms)} of flat series (target <= 1%); steps notified {_pct(share)}, a median "
        f"{'-' if delay is None else f'{delay:.0f}'} points after the step."
    )
    if args.notifications_only:
        print(f"\nRun time: {time.monotonic() - started:.1f} s (seed {args.seed})")
        return
    recall, located, raised = oracle_bounds(series)
    print(
        f"\nOracle bounds at 1% false alarms (true level, noise and size known): recall {_pct(recall)}, "
        f"located within 2 points {_pct(located)}, raised within 6 points {_pct(raised)} of all steps."
    )
    if args.candidates:
        subset = series[: args.candidates] + series[args.flat : args.flat + args.candidates]
        candidates: dict[str, Detector] = {
            **detectors,
            "E-Divisive, 99 permutations, p <= 0.05": e_divisive,
            "Mann-Whitney 12/12, z > 3.3": mann_whitney_windows,
        }
        results = {name: measure(detect, subset, online=False) for name, detect in candidates.items()}
        print("\nThe methods considered, on the first series of each kind:\n")
        print(table(results, args.candidates, args.candidates))
    print(f"\nRun time: {time.monotonic() - started:.1f} s (seed {args.seed})")


if __name__ == "__main__":
    main()
