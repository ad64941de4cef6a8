"""Google Benchmark's JSON (`--benchmark_format=json` or `--benchmark_out=FILE`).

Decisions, since one run of a benchmark can appear as several rows:
- A benchmark repeated (`--benchmark_repetitions=N`) is one entry: the median of its repetitions'
  times (robust to the one slow repetition), `iterations` summed, `extras.repetitions` = N.
- Aggregate rows (`run_type: aggregate`: mean, median, stddev, cv) are skipped, since they are
  derived from rows we keep; only when a benchmark has no iteration rows at all
  (`--benchmark_report_aggregates_only`) does its `median` row (else its `mean`) become its entry.
- Rows with `error_occurred` are skipped and listed in the run's info under `errors`.
- `date` without a zone (older versions wrote the local time, "2024/01/02-03:04:05") is taken as
  UTC, and the info says so (`date_assumed_utc`).
"""

import re
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from common.result_formats.records import (
    MAX_ENTRIES,
    ParsedEntry,
    ParsedRun,
    Reader,
    clean_info,
)
from common.wire import parse_time

FORMAT = "google_benchmark"
UNITS_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_ROW_FIELDS = {
    "name", "run_name", "run_type", "repetitions", "repetition_index", "threads", "iterations", "real_time",
    "cpu_time", "time_unit", "family_index", "per_family_instance_index", "aggregate_name", "aggregate_unit",
    "label", "error_occurred", "error_message", "big_o", "rms", "complexity_n",
}  # fmt: skip
_NAIVE_DATE = re.compile(r"(\d{4})[-/](\d{2})[-/](\d{2})[ T-](\d{2}):(\d{2}):(\d{2})")


def looks_like(doc: dict[str, Any]) -> bool:
    return "benchmarks" in doc and "context" in doc


def parse(doc: dict[str, Any], r: Reader) -> ParsedRun:
    context = r.obj(doc["context"], "context")
    if "executable" not in context:
        raise r.fail("context.executable", "required")
    executable = r.name(context["executable"], "context.executable")
    test = r.name(re.split(r"[/\\]", executable.rstrip("/\\"))[-1], "context.executable")
    start, assumed_utc = _date(context.get("date"), r)
    rows = r.items(doc["benchmarks"], "benchmarks", MAX_ENTRIES)
    iterations: dict[str, list[ParsedEntry]] = {}
    first_row: dict[str, str] = {}
    aggregates: dict[str, dict[str, ParsedEntry]] = {}
    errors: dict[str, str] = {}
    for i, raw in enumerate(rows):
        path = f"benchmarks[{i}]"
        row = r.obj(raw, path)
        name = r.name(row.get("name"), f"{path}.name")
        if row.get("error_occurred") is True:
            message = row.get("error_message", "")
            errors[name] = r.text(message, f"{path}.error_message") if message else "error"
            continue
        run_type = row.get("run_type", "iteration")
        if run_type not in ("iteration", "aggregate"):
            raise r.fail(f"{path}.run_type", f"expected iteration or aggregate, got {run_type!r}")
        if run_type == "aggregate":
            run_name = r.name(row.get("run_name"), f"{path}.run_name")
            kind = row.get("aggregate_name")
            if kind in ("median", "mean"):
                aggregates.setdefault(run_name, {})[kind] = _row(row, run_name, path, r)
            continue
        iterations.setdefault(name, []).append(_row(row, name, path, r))
        first_row.setdefault(name, path)
    entries = [_collapse(reps, first_row[name], r) for name, reps in iterations.items()]
    for run_name, kinds in aggregates.items():
        if run_name not in iterations:
            entries.append(kinds.get("median") or kinds["mean"])
    info: dict[str, Any] = dict(clean_info(context))
    if errors:
        info["errors"] = errors
    if assumed_utc:
        info["date_assumed_utc"] = True
    return ParsedRun(test=test, start=start, info=info, entries=tuple(entries), format=FORMAT)


def _date(value: object, r: Reader) -> tuple[datetime, bool]:
    if value is None:
        raise r.fail("context.date", "required")
    if isinstance(value, str) and (match := _NAIVE_DATE.fullmatch(value)):
        try:
            year, month, day, hour, minute, second = (int(part) for part in match.groups())
            naive = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
        except ValueError as exc:
            raise r.fail("context.date", f"not a date: {exc}") from None
        return r.start(naive, "context.date"), True
    try:
        when = parse_time(value)
    except ValueError as exc:
        raise r.fail("context.date", str(exc)) from None
    assert when is not None
    return when, False


def _row(row: dict[str, Any], name: str, path: str, r: Reader) -> ParsedEntry:
    unit = row.get("time_unit", "ns")
    if unit not in UNITS_S:
        raise r.fail(f"{path}.time_unit", f"expected one of {', '.join(UNITS_S)}, got {unit!r}")
    scale = UNITS_S[unit]
    if "real_time" not in row:
        raise r.fail(f"{path}.real_time", "required")
    extras: dict[str, float | str] = {}
    for key, value in row.items():
        if key in _ROW_FIELDS or isinstance(value, dict | list | str) or value is None:
            continue
        extras[r.extras_key(key, f"{path}.{key}", extras)] = r.number(value, f"{path}.{key}", negative=True)
    if row.get("label"):
        extras["label"] = r.text(row["label"], f"{path}.label")
    bytes_per_s = extras.get("bytes_per_second")
    return ParsedEntry(
        name=name,
        wall_time_s=r.number(row["real_time"], f"{path}.real_time") * scale,
        cpu_time_s=None if row.get("cpu_time") is None else r.number(row["cpu_time"], f"{path}.cpu_time") * scale,
        iterations=None if row.get("iterations") is None else r.count(row["iterations"], f"{path}.iterations"),
        throughput=bytes_per_s / 1e6 if isinstance(bytes_per_s, float) and bytes_per_s >= 0 else None,
        extras=extras,
    )


def _collapse(reps: list[ParsedEntry], path: str, r: Reader) -> ParsedEntry:
    """One entry of a benchmark's repetitions; `path` (its first row) names it in errors. A median
    or sum that overflows (two repetitions of 1.7e308 s, of 2^63-1 iterations) refuses the file."""
    if len(reps) == 1:
        return reps[0]

    def median(get: Callable[[ParsedEntry], float | int | None], field: str) -> float | None:
        values = [v for v in map(get, reps) if v is not None]
        typical = float(statistics.median(values)) if values else None
        return r.finite(typical, f"{path}.{field}", f"the median of {len(values)} repetitions")

    counts = [rep.iterations for rep in reps if rep.iterations is not None]
    extras: dict[str, float | str] = dict(reps[0].extras)
    for key, value in extras.items():
        if isinstance(value, float):

            def extra(rep: ParsedEntry, key: str = key) -> float | None:
                return _float(rep.extras.get(key))

            typical = median(extra, key)
            extras[key] = value if typical is None else typical
    extras["repetitions"] = float(len(reps))
    return ParsedEntry(
        name=reps[0].name,
        wall_time_s=median(lambda rep: rep.wall_time_s, "real_time"),
        cpu_time_s=median(lambda rep: rep.cpu_time_s, "cpu_time"),
        iterations=r.total(counts, f"{path}.iterations") if counts else None,
        throughput=median(lambda rep: rep.throughput, "bytes_per_second"),
        extras=extras,
    )


def _float(value: object) -> float | None:
    return value if isinstance(value, float) else None
