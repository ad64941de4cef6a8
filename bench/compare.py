"""How trustworthy `results compare` is: fleetshard's statistics against a plain Welch t-test.

Run: `.venv/bin/python bench/compare.py [--entries 2000] [--seed 1]`. Prints a markdown table (the
one in docs/ab-runs.md) and the run time.

The corpus is seeded A/B pairs, one per entry: a base and a new sample of 5-20 timings each (the same
count both sides), each timing the level times lognormal noise of 1-5%, and 2% of the timings
outliers (x1.3-3 slower). 30% of the entries have a true change of 3-10%, up or down. An entry counts
as flagged when the method calls it slower or faster:
- fleetshard: Mann-Whitney p corrected across all entries of the run (Benjamini-Hochberg) under
  0.10 (the false discovery rate) and a change of the medians of at least the minimum change (2%), as
  `results compare` does;
- Welch: Welch's t-test on the raw timings at p < 0.05, no correction, no minimum change.
"changes flagged" counts only flags in the true change's direction.
"""

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.stats import DEFAULT_MIN_CHANGE_PCT, Verdict, benjamini_hochberg, compare, verdict  # noqa: E402


@dataclass(frozen=True)
class Pair:
    change_pct: float
    base: list[float]
    new: list[float]


def corpus(entries: int, seed: int) -> list[Pair]:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(entries):
        changed = rng.random() < 0.3
        change = float(rng.uniform(3, 10) * rng.choice([-1, 1])) if changed else 0.0
        noise = rng.uniform(0.01, 0.05)
        repeats = int(rng.integers(5, 21))

        def sample(level: float, n: int = repeats, noise: float = noise) -> list[float]:
            values = level * np.exp(rng.normal(0, noise, n))
            outliers = rng.random(n) < 0.02
            values[outliers] *= rng.uniform(1.3, 3.0, int(outliers.sum()))
            return [float(v) for v in values]

        pairs.append(Pair(change, sample(1.0), sample(1.0 + change / 100)))
    return pairs


def fleetshard_flags(pairs: list[Pair]) -> list[int]:
    """-1 faster, +1 slower, 0 not flagged."""
    changes = [compare(p.base, p.new) for p in pairs]
    tested = [i for i, c in enumerate(changes) if c.p_value is not None]
    q = dict(zip(tested, benjamini_hochberg([changes[i].p_value or 0.0 for i in tested]), strict=True))
    out = []
    for i, change in enumerate(changes):
        said = verdict(change, q.get(i), DEFAULT_MIN_CHANGE_PCT)
        out.append(1 if said is Verdict.SLOWER else -1 if said is Verdict.FASTER else 0)
    return out


def welch_flags(pairs: list[Pair]) -> list[int]:
    out = []
    for p in pairs:
        result = scipy_stats.ttest_ind(p.new, p.base, equal_var=False)
        out.append(int(np.sign(result.statistic)) if result.pvalue < 0.05 else 0)
    return out


def shares(pairs: list[Pair], flags: list[int]) -> tuple[float, float, float]:
    def share(selected: list[tuple[Pair, int]], hit: bool) -> float:
        if not selected:
            return float("nan")
        if hit:
            return sum(f == np.sign(p.change_pct) for p, f in selected) / len(selected)
        return sum(f != 0 for _, f in selected) / len(selected)

    both = list(zip(pairs, flags, strict=True))
    big = [(p, f) for p, f in both if abs(p.change_pct) >= 5]
    changed = [(p, f) for p, f in both if p.change_pct != 0]
    flat = [(p, f) for p, f in both if p.change_pct == 0]
    return share(big, True), share(changed, True), share(flat, False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.monotonic()
    pairs = corpus(args.entries, args.seed)
    rows = [
        ("fleetshard (Mann-Whitney, BH q < 0.10, min 2%)", fleetshard_flags(pairs)),
        ("Welch t-test, p < 0.05", welch_flags(pairs)),
    ]
    print(f"{args.entries} entries, seed {args.seed}, {sum(p.change_pct != 0 for p in pairs)} with a true change\n")
    print("| method | changes >= 5% flagged | all changes flagged | unchanged flagged |")
    print("|---|---|---|---|")
    for name, flags in rows:
        big, changed, flat = shares(pairs, flags)
        print(f"| {name} | {big:.1%} | {changed:.1%} | {flat:.1%} |")
    print(f"\n({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
