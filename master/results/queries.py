"""The reads of stored results the REST API serves (DESIGN.md, "Benchmark results": tests, runs,
timings of one entry, regressions). Each returns a queryset the API paginates, so a page costs a
fixed number of queries."""

from datetime import datetime
from typing import Any

from django.db.models import Count, Max, OuterRef, QuerySet, Subquery

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


def runs(test: str, since: datetime | None = None) -> QuerySet[TestRun]:
    """A test's runs, newest first, with their job, host and shard."""
    found = TestRun.objects.filter(test=test).select_related("host", "shard")
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
