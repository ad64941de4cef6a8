"""The admin's Benchmarks pages: tests, a test's entries, and one entry's timings charted over time,
one line per board label, with its regressions marked and each point linked to its run's job.

Names come from uploaded files, so they are never trusted: they travel in query parameters (a name
may hold any character), are escaped by the templates, and reach the chart's script only through
`json_script`. Each page costs a fixed number of queries, whatever the number of runs.
"""

from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from common.errors import FleetshardError
from common.units import duration
from master.results import queries
from master.results.compare import compare_sides, parse_min_change, parse_side
from master.results.models import OPEN_STATUSES, Regression, TestEntry

# The newest points a chart draws; older ones are left out and the page says so.
MAX_POINTS = 5000


def _allowed(request: HttpRequest) -> None:
    """Staff reach these pages through the admin's login check; results also need their view right."""
    if not request.user.has_perm("master.view_testrun"):
        raise PermissionDenied


def _param(request: HttpRequest, name: str) -> str | None:
    value = request.GET.get(name, "")
    return value if value else None


def _page(request: HttpRequest, template: str, title: str, **context: Any) -> TemplateResponse:
    return TemplateResponse(
        request, template, {**admin.site.each_context(request), "title": title, "subtitle": None, **context}
    )


def _missing(name: str) -> HttpResponse:
    return HttpResponseBadRequest(format_html("missing query parameter {}: name the test (and entry) to show", name))


def _count_open_regressions(rows: list[dict[str, Any]], key: str, regressions: QuerySet[Regression]) -> None:
    """Adds each row's number of `new` and `acknowledged` regressions, grouped by `key`, in one query."""
    open_counts = dict(
        regressions.filter(status__in=OPEN_STATUSES)
        .order_by()
        .values(key)
        .annotate(n=Count("id"))
        .values_list(key, "n")
    )
    for row in rows:
        row["open_regressions"] = open_counts.get(row[key], 0)


def tests_page(request: HttpRequest) -> HttpResponse:
    """Every test with its runs and latest start, and how many regressions are still open."""
    _allowed(request)
    rows = list(queries.tests())
    _count_open_regressions(rows, "test", Regression.objects.all())
    return _page(request, "master/benchmarks/tests.html", "Benchmarks", tests=rows)


def entries_page(request: HttpRequest) -> HttpResponse:
    """A test's entries, each with its number of timings, latest start, board labels and open regressions."""
    _allowed(request)
    test = _param(request, "test")
    if test is None:
        return _missing("test")
    rows = list(
        TestEntry.objects.filter(test=test)
        .order_by()
        .values("entry")
        .annotate(points=Count("id"), latest_start=Max("start"), boards=Count("label", distinct=True))
        .order_by("entry")
    )
    if not rows:
        raise Http404(f"no runs of test {test!r}")
    _count_open_regressions(rows, "entry", Regression.objects.filter(test=test))
    return _page(request, "master/benchmarks/entries.html", test, test=test, entries=rows)


@dataclass
class Chart:
    """What the chart's script draws, as plain JSON: one series per board label, oldest point first."""

    series: list[dict[str, Any]]
    regressions: list[Regression]
    points: int
    truncated: bool

    def data(self, test: str, entry: str) -> dict[str, Any]:
        return {
            "test": test,
            "entry": entry,
            "series": self.series,
            "regressions": [
                {
                    "label": r.label,
                    "start": r.start.timestamp(),
                    "change_pct": round(r.change_pct, 2),
                    "status": r.status,
                    "url": reverse("admin:master_regression_change", args=[r.id]),
                }
                for r in self.regressions
            ],
        }


def seconds(value: float) -> str:
    """A time per iteration in the unit that shows it best (the chart's axis uses the same)."""
    return duration(value)


def chart_of(test: str, entry: str) -> Chart:
    """Two queries: the newest MAX_POINTS timings (along the series index), and the entry's regressions."""
    rows = list(queries.timings(test, entry)[: MAX_POINTS + 1])
    truncated = len(rows) > MAX_POINTS
    by_label: dict[str, list[list[Any]]] = {}
    for row in reversed(rows[:MAX_POINTS]):
        job_id = row["job"]
        by_label.setdefault(row["label"], []).append(
            [
                row["start"].timestamp(),
                row["wall_time_s"],
                reverse("admin:common_job_change", args=[job_id]) if job_id is not None else None,
                row["host"],
            ]
        )
    series = [{"label": label, "points": points} for label, points in sorted(by_label.items())]
    found = list(queries.regressions(test).filter(entry=entry).order_by("start", "id"))
    for regression in found:
        regression.before_shown = seconds(regression.before_s)  # type: ignore[attr-defined]
        regression.after_shown = seconds(regression.after_s)  # type: ignore[attr-defined]
    return Chart(series, found, min(len(rows), MAX_POINTS), truncated)


def chart_page(request: HttpRequest) -> HttpResponse:
    """One entry's wall time per iteration over time; a click on a point opens the run's job."""
    _allowed(request)
    test, entry = _param(request, "test"), _param(request, "entry")
    if test is None:
        return _missing("test")
    if entry is None:
        return _missing("entry")
    chart = chart_of(test, entry)
    if not chart.points:
        raise Http404(f"no timings of entry {entry!r} of test {test!r}")
    return _page(
        request,
        "master/benchmarks/chart.html",
        f"{test} / {entry}",
        test=test,
        entry=entry,
        chart=chart,
        chart_data=chart.data(test, entry),
        max_points=MAX_POINTS,
    )


def compare_url(base: str = "", new: str = "", test: str | None = None) -> str:
    query = urlencode({k: v for k, v in {"base": base, "new": new, "test": test}.items() if v})
    return f"{reverse('benchmarks-compare')}?{query}"


def compare_page(request: HttpRequest) -> HttpResponse:
    """Perfherder's compare view: two sides entry by entry, the largest slowdown first. The form is
    the page itself, so a comparison is a link people can share."""
    _allowed(request)
    base, new = request.GET.get("base", ""), request.GET.get("new", "")
    test, label = _param(request, "test"), _param(request, "label")
    rows: list[dict[str, Any]] = []
    error = None
    min_change = request.GET.get("min_change", "")
    if base or new:
        try:
            rows = compare_sides(
                parse_side(base, "base"),
                parse_side(new, "new"),
                test=test,
                label=label,
                min_change_pct=parse_min_change(min_change),
            )
        except FleetshardError as exc:
            error = str(exc)
    counts = Counter(row["verdict"] for row in rows)
    for row in rows:
        row["shown"] = {side: _g(row[f"{side}_median_s"]) for side in ("base", "new")}
    return _page(
        request,
        "master/benchmarks/compare.html",
        "Compare",
        base=base,
        new=new,
        test=test or "",
        label=label or "",
        min_change=min_change,
        rows=rows,
        error=error,
        counts=sorted(counts.items()),
    )


def _g(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"
