"""`fleetshard results ...`: benchmark results stored on the master, their timings and regressions.

`results upload` (the uploader) lives in cli/results_upload.py.
"""

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from cli.action import Run, action
from cli.inputs import Id, Number
from cli.output import Column, table, when
from cli.results_upload import upload
from common.units import duration

STATUSES = ("new", "acknowledged", "invalid", "fixed")
SPARKS = "▁▂▃▄▅▆▇█"

TEST_COLUMNS: list[Column] = [("Test", "test"), ("Runs", "runs"), ("Latest start", when("latest_start"))]
RUN_COLUMNS: list[Column] = [
    ("Id", "id"),
    ("Start", when("start")),
    ("Entries", "entries"),
    ("Job", "job"),
    ("HQE", "hqe"),
    ("Host", "host"),
    ("Shard", "shard"),
]
TIMING_COLUMNS: list[Column] = [
    ("Start", when("start")),
    ("Wall", lambda r: _seconds(r["wall_time_s"])),
    ("CPU", lambda r: _seconds(r["cpu_time_s"])),
    ("Iterations", "iterations"),
    ("Label", "label"),
    ("Host", "host"),
    ("Job", "job"),
]
REGRESSION_COLUMNS: list[Column] = [
    ("Id", "id"),
    ("Test", "test"),
    ("Entry", "entry"),
    ("Label", "label"),
    ("First slow run", when("start")),
    ("Before", lambda r: _seconds(r["before_s"])),
    ("After", lambda r: _seconds(r["after_s"])),
    ("Change", lambda r: f"{r['change_pct']:+.1f}%"),
    ("Status", "status"),
]

F = TypeVar("F", bound=Callable[..., Any])

SINCE = click.option("--since", metavar="WHEN", help="Only since an ISO time or within an age (90m, 24h, 7d).")


def _limit(default: int) -> Callable[[F], F]:
    option: Callable[[F], F] = click.option(
        "--limit", type=click.IntRange(min=0), default=default, show_default=True, help="Newest N; 0: all."
    )
    return option


def _seconds(value: float | None) -> str | None:
    """In the unit the admin's chart uses (`3.2 µs`); JSON keeps the API's seconds."""
    return None if value is None else duration(value)


def sparkline(values: Sequence[float]) -> str:
    """One character per value, from ▁ (the lowest) to █ (the highest)."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - low) / span * len(SPARKS))) if span else 0] for v in values)


def _shown(run: Run, rows: list[dict[str, Any]], what: str) -> None:
    if len(rows) < run.api.total:
        click.echo(f"(the newest {len(rows)} of {run.api.total} {what}; --limit 0 shows all)", err=True)


@click.group()
def results() -> None:
    """Benchmark results: tests, their runs, timings of one entry, and regressions."""


@results.command("tests")
@SINCE
@action
def results_tests(run: Run, since: str | None) -> None:
    """List tests with results: runs and the latest start."""
    rows = run.api.list("/results/tests/", since=since)
    run.rows(rows, TEST_COLUMNS, "tests with results")


@results.command("runs")
@click.argument("test")
@SINCE
@_limit(100)
@action
def results_runs(run: Run, test: str, since: str | None, limit: int) -> None:
    """List a test's runs, newest first."""
    rows = run.api.list("/results/runs/", limit=limit or None, test=test, since=since)
    _shown(run, rows, "runs")
    run.rows(rows, RUN_COLUMNS, "runs")


@results.command("timings")
@click.argument("test")
@click.argument("entry")
@click.option("--label", metavar="LABEL", help="Only runs on hosts with this board label.")
@SINCE
@_limit(100)
@action
def results_timings(run: Run, test: str, entry: str, label: str | None, since: str | None, limit: int) -> None:
    """Show one entry's timings, oldest first; on a terminal, a sparkline of the wall times."""
    rows = run.api.list("/results/timings/", limit=limit or None, test=test, entry=entry, label=label, since=since)
    rows.reverse()  # the API gives the newest first; a series reads in time order
    _shown(run, rows, "timings")

    def text() -> str:
        shown = table(rows, TIMING_COLUMNS)
        walls = [r["wall_time_s"] for r in rows if r["wall_time_s"] is not None]
        if not rows:
            return "No timings."
        return f"{shown}\n{sparkline(walls)}" if walls and sys.stdout.isatty() else shown

    run.done(rows, text)


@results.command("regressions")
@click.option("--test", metavar="TEST", help="Only this test's regressions.")
@click.option("--status", type=click.Choice(STATUSES), help="Only regressions with this status.")
@action
def results_regressions(run: Run, test: str | None, status: str | None) -> None:
    """List regressions, most recently detected first."""
    rows = run.api.list("/results/regressions/", test=test, status=status)
    run.rows(rows, REGRESSION_COLUMNS, "regressions")


COMPARE_COLUMNS: list[Column] = [
    ("Test", "test"),
    ("Entry", "entry"),
    ("Base s", lambda r: _seconds(r["base_median_s"])),
    ("New s", lambda r: _seconds(r["new_median_s"])),
    ("Change", lambda r: _pct(r["change_pct"])),
    ("95% interval", lambda r: _interval(r)),
    ("p", lambda r: None if r["p_value"] is None else f"{r['p_value']:.3g}"),
    ("Runs", lambda r: f"{r['base_runs']}/{r['new_runs']}"),
    ("Verdict", "verdict"),
]


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:+.1f}%"


def _interval(row: dict[str, Any]) -> str | None:
    if row["ci_low_pct"] is None:
        return None
    return f"{row['ci_low_pct']:+.1f}% .. {row['ci_high_pct']:+.1f}%"


@results.command("compare")
@click.option("--base", required=True, metavar="SIDE", help="The baseline: JOB_ID, JOB_ID:VARIANT or rev:REVISION.")
@click.option("--new", "new", required=True, metavar="SIDE", help="Compared with it: JOB_ID[:VARIANT] or rev:REVISION.")
@click.option("--test", metavar="TEST", help="Only this test's entries.")
@click.option("--label", metavar="LABEL", help="Only runs on hosts with this board label.")
@click.option(
    "--min-change",
    type=Number(0, 1000),
    default=2.0,
    show_default=True,
    metavar="PCT",
    help="The least change in percent that counts as one.",
)
@action
def results_compare(run: Run, base: str, new: str, test: str | None, label: str | None, min_change: float) -> None:
    """Compare two sides entry by entry: medians, change, its 95% interval, p-value and a verdict
    (slower, faster, no change, too few runs), the largest slowdown first."""
    rows = run.api.get("/results/compare", base=base, new=new, test=test, label=label, min_change=f"{min_change:g}")
    run.rows(rows, COMPARE_COLUMNS, "entries")


@results.command("set-status")
@click.argument("regression_id", metavar="ID", type=Id("regression"))
@click.argument("status", metavar="STATUS", type=click.Choice(STATUSES))
@action
def results_set_status(run: Run, regression_id: int, status: str) -> None:
    """Set a regression's status: new, acknowledged, invalid or fixed."""
    row = run.api.request("PATCH", f"/results/regressions/{regression_id}/", body={"status": status})
    run.done(row, f"regression {row['id']} ({row['test']} / {row['entry']}) is {row['status']}")


results.add_command(upload)
