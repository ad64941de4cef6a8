"""The reads of stored results the REST API serves (docs/design.md, "Benchmark results": tests, runs,
timings of one entry, regressions). Each returns a queryset the API paginates, so a page costs a
fixed number of queries."""

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, Max, OuterRef, QuerySet, Subquery
from django.urls import reverse

from master.results.models import Regression, RegressionStatus, TestEntry, TestRun

# A timing row as the API, the CLI and the chart read it: the entry's columns (all in the series
# index on PostgreSQL), its run's job and host. Those two are subqueries, not joins, so that the
# page's count reads the index alone, and PostgreSQL runs them for the page's rows only.
TIMING_FIELDS = ("test", "entry", "start", "wall_time_s", "cpu_time_s", "iterations", "label", "run_id")
_RUN = TestRun.objects.filter(id=OuterRef("run_id")).order_by()
TIMING_RELATED = {"job": Subquery(_RUN.values("job_id")), "host": Subquery(_RUN.values("host__hostname"))}


def tests(since: datetime | None = None) -> QuerySet[TestRun, dict[str, Any]]:
    """Rows of `test`, `runs` and `latest_start`, by test name."""
    runs = TestRun.objects.all() if since is None else TestRun.objects.filter(start__gte=since)
    return runs.order_by().values("test").annotate(runs=Count("id"), latest_start=Max("start")).order_by("test")


def runs(test: str, since: datetime | None = None, *, revision: str | None = None) -> QuerySet[TestRun]:
    """A test's runs, newest first, with their job, host and shard."""
    found = TestRun.objects.filter(test=test).select_related("host", "shard")
    if revision is not None:
        found = found.filter(revision=revision)
    return (found if since is None else found.filter(start__gte=since)).order_by("-start", "-id")


def timings(
    test: str, entry: str, *, label: str | None = None, since: datetime | None = None
) -> QuerySet[TestEntry, dict[str, Any]]:
    """One entry's timings, newest first, read along the (test, entry, start) index: rows of
    TIMING_FIELDS plus `job` and `host`, as dicts: building three models per row (entry, run, host)
    was most of the time of a page of them."""
    found = TestEntry.objects.filter(test=test, entry=entry)
    if label is not None:
        found = found.filter(label=label)
    if since is not None:
        found = found.filter(start__gte=since)
    rows: QuerySet[TestEntry, dict[str, Any]] = found.order_by("-start", "-id").values(*TIMING_FIELDS, **TIMING_RELATED)
    return rows


def regressions(test: str | None = None, status: RegressionStatus | None = None) -> QuerySet[Regression]:
    """Regressions, most recently detected first."""
    found = Regression.objects.all()
    if test is not None:
        found = found.filter(test=test)
    if status is not None:
        found = found.filter(status=status)
    return found.order_by("-detected_on", "-id")


def result_tests(runs: Iterable[TestRun]) -> list[dict[str, Any]]:
    """An entry's stored runs by test: how many, their timed entries, and the admin page charting the
    test (its entries, each a chart). What `job stat` and the admin's job page show."""
    tests: dict[str, dict[str, Any]] = {}
    for run in runs:
        row = tests.setdefault(run.test, {"test": run.test, "runs": 0, "entries": 0, "chart": chart_path(run.test)})
        row["runs"] += 1
        row["entries"] += run.entry_count
    return [tests[name] for name in sorted(tests)]


def chart_path(test: str, entry: str | None = None) -> str:
    """The admin's page for a test's entries, or for one entry's chart."""
    if entry is None:
        return reverse("benchmarks-entries") + "?" + urlencode({"test": test})
    return reverse("benchmarks-chart") + "?" + urlencode({"test": test, "entry": entry})
