"""`results compare`: one row per entry comparing two sides' timings (docs/design.md, "A/B runs and
comparisons"). A side is `JOB_ID`, `JOB_ID:VARIANT` or `rev:REVISION`; the statistics are
common.stats'."""

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from common.errors import FleetshardError
from common.stats import DEFAULT_MIN_CHANGE_PCT, benjamini_hochberg, compare, verdict
from master.results.models import NAME_CHARS, TestEntry

# The most timings one side may bring: a revision measured for months is narrowed with --test or
# --label, not read whole into memory.
MAX_SIDE_TIMINGS = 200_000
_JOB_SIDE = re.compile(r"(?P<job>[0-9]{1,18})(?::(?P<variant>[^\x00-\x1f\x7f]{1,255}))?")


@dataclass(frozen=True)
class Side:
    job: int | None = None
    variant: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        if self.revision is not None:
            return f"rev:{self.revision}"
        return f"{self.job}" + (f":{self.variant}" if self.variant else "")


def parse_side(raw: str, field: str) -> Side:
    """`JOB_ID[:VARIANT]` or `rev:REVISION`; anything else is refused naming `field`."""
    if raw.startswith("rev:"):
        revision = raw[4:]
        if not revision or len(revision) > NAME_CHARS or any(ord(c) < 32 or c == "\x7f" for c in revision):
            raise FleetshardError(
                f"{field}: {_clip(raw)}: rev: needs a revision (1-{NAME_CHARS} characters)", field=field
            )
        return Side(revision=revision)
    found = _JOB_SIDE.fullmatch(raw)
    if found is None or int(found["job"]) == 0:
        raise FleetshardError(
            f"{field}: {_clip(raw)} is not a side: use JOB_ID, JOB_ID:VARIANT or rev:REVISION", field=field
        )
    return Side(job=int(found["job"]), variant=found["variant"])


def _clip(raw: str) -> str:
    """A refused value as the error shows it: a query string may carry thousands of characters."""
    return repr(raw) if len(raw) <= 80 else f"{raw[:80]!r}..."


def parse_min_change(raw: str | None) -> float:
    if raw is None or raw == "":
        return DEFAULT_MIN_CHANGE_PCT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1000:
        raise FleetshardError(f"min_change: {_clip(raw)}: use a percentage from 0 to 1000", field="min_change")
    return value


def _timings(side: Side, field: str, test: str | None, label: str | None) -> dict[tuple[str, str], list[float]]:
    found = TestEntry.objects.filter(wall_time_s__isnull=False)
    if side.revision is not None:
        found = found.filter(run__revision=side.revision)
    elif side.job is not None:
        found = found.filter(run__job_id=side.job)
        if side.variant is not None:
            found = found.filter(run__variant=side.variant)
    if test is not None:
        found = found.filter(test=test)
    if label is not None:
        found = found.filter(label=label)
    rows = list(found.order_by().values_list("test", "entry", "wall_time_s")[: MAX_SIDE_TIMINGS + 1])
    if len(rows) > MAX_SIDE_TIMINGS:
        raise FleetshardError(
            f"{field}: {side} has more than {MAX_SIDE_TIMINGS} timings: narrow the comparison with test or label",
            field=field,
        )
    if not rows:
        raise FleetshardError(f"{field}: {side} has no results" + _narrowed(test, label), field=field)
    series: dict[tuple[str, str], list[float]] = defaultdict(list)
    for test_name, entry, wall in rows:
        if wall is not None:
            series[(test_name, entry)].append(wall)
    return series


def _narrowed(test: str | None, label: str | None) -> str:
    parts = [f"test {test!r}"] if test is not None else []
    parts += [f"label {label!r}"] if label is not None else []
    return f" for {' and '.join(parts)}" if parts else ""


def compare_sides(
    base: Side,
    new: Side,
    *,
    test: str | None = None,
    label: str | None = None,
    min_change_pct: float = DEFAULT_MIN_CHANGE_PCT,
) -> list[dict[str, Any]]:
    """One row per (test, entry) of either side, sorted by change (the largest slowdown first, entries
    without a change last). Entries only one side has are `too few runs`."""
    for field, value in (("test", test), ("label", label)):
        if value is not None and "\x00" in value:
            raise FleetshardError(f"{field}: null characters are not allowed", field=field)
    if base == new:
        raise FleetshardError(f"new: {new} is the same side as base: compare two different ones", field="new")
    base_series = _timings(base, "base", test, label)
    new_series = _timings(new, "new", test, label)
    keys = sorted(base_series.keys() | new_series.keys())
    changes = [compare(base_series.get(key, []), new_series.get(key, [])) for key in keys]
    tested = [i for i, change in enumerate(changes) if change.p_value is not None]
    adjusted = benjamini_hochberg([changes[i].p_value or 0.0 for i in tested])
    q_values: dict[int, float] = dict(zip(tested, adjusted, strict=True))
    rows = []
    for i, ((test_name, entry), change) in enumerate(zip(keys, changes, strict=True)):
        q_value = q_values.get(i)
        rows.append(
            {
                "test": test_name,
                "entry": entry,
                "base_median_s": change.base_median,
                "new_median_s": change.new_median,
                "change_pct": _rounded(change.change_pct),
                "ci_low_pct": _rounded(change.ci_low_pct),
                "ci_high_pct": _rounded(change.ci_high_pct),
                "p_value": q_value,
                "base_runs": change.base_runs,
                "new_runs": change.new_runs,
                "verdict": str(verdict(change, q_value, min_change_pct)),
            }
        )
    rows.sort(key=_by_change)
    return rows


def _by_change(row: dict[str, Any]) -> tuple[bool, float, str, str]:
    change = row["change_pct"]
    return (change is None, -(change or 0.0), row["test"], row["entry"])


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
