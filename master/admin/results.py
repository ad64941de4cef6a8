"""Benchmark results in the admin: runs with their entries and the files refused from shards
(read-only: they come from uploads), and regressions, whose status people change with actions
that call the same service as the API and the CLI."""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from common.errors import FleetshardError
from master.admin.base import ServiceAdmin
from master.models import Regression, RegressionStatus, RejectedResult, TestEntry, TestRun
from master.results.ingest import UNSENT_DIGEST
from master.results.models import REGRESSION_FIELDS
from master.results.regressions import set_regression_status


def chart_link(test: str, entry: str, text: str = "chart") -> str:
    """A link to the Benchmarks chart of one entry (names escaped: they come from uploaded files)."""
    query = urlencode({"test": test, "entry": entry})
    return format_html('<a href="{}?{}">{}</a>', reverse("benchmarks-chart"), query, text)


# A run may have 10,000 entries: all of them inline made a 39 MB page in 11.7 s. The admin lists the
# first ones by name; the Benchmarks pages (linked above them) have every entry.
ADMIN_ENTRIES_SHOWN = 200


class FirstEntries(BaseInlineFormSet):
    def get_queryset(self) -> QuerySet[TestEntry]:
        if not hasattr(self, "_capped"):
            self._capped = super().get_queryset().order_by("entry", "id")[:ADMIN_ENTRIES_SHOWN]
        return self._capped


class TestEntryInline(admin.TabularInline):
    model = TestEntry
    formset = FirstEntries
    verbose_name_plural = f"entries (the first {ADMIN_ENTRIES_SHOWN} by name)"
    readonly_fields = ["entry", "chart", "wall_time_s", "cpu_time_s", "iterations", "throughput", "extras"]
    fields = tuple(readonly_fields)
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: TestRun | None = None) -> bool:
        return False

    @admin.display(description="timings")
    def chart(self, obj: TestEntry) -> str:
        return chart_link(obj.test, obj.entry)


@admin.register(TestRun)
class TestRunAdmin(ServiceAdmin):
    list_display = ["test", "start", "label", "entry_count", "job", "host", "shard", "uploaded_by", "created_on"]
    list_filter = ["format"]
    search_fields = ["test", "label"]
    list_select_related = ["job", "host", "shard", "uploaded_by"]
    date_hierarchy = "start"
    readonly_fields = [
        "test",
        "benchmarks",
        "start",
        "format",
        "label",
        "labels",
        "entry_count",
        "job",
        "hqe",
        "host",
        "shard",
        "uploaded_by",
        "created_on",
        "digest",
        "info",
    ]
    fields = tuple(readonly_fields)
    inlines = [TestEntryInline]

    @admin.display(description="benchmarks")
    def benchmarks(self, obj: TestRun) -> str:
        url = f"{reverse('benchmarks-entries')}?{urlencode({'test': obj.test})}"
        link = format_html('<a href="{}">this test\'s entries, each charted over time</a>', url)
        if obj.entry_count <= ADMIN_ENTRIES_SHOWN:
            return link
        return format_html(
            "{} (this run has {} entries: the first {} by name are listed below)",
            link,
            obj.entry_count,
            ADMIN_ENTRIES_SHOWN,
        )


@admin.register(Regression)
class RegressionAdmin(ServiceAdmin):
    list_display = ["test", "entry", "label", "start", "before_s", "after_s", "change_shown", "status", "detected_on"]
    list_filter = ["status"]
    search_fields = ["test", "entry", "label"]
    readonly_fields = [*REGRESSION_FIELDS, "chart"]
    fields = tuple(readonly_fields)
    actions = ["mark_acknowledged", "mark_invalid", "mark_fixed", "mark_new"]

    @admin.display(description="chart")
    def chart(self, obj: Regression) -> str:
        return chart_link(obj.test, obj.entry, "this entry's timings over time")

    @admin.display(description="change", ordering="change_pct")
    def change_shown(self, obj: Regression) -> str:
        return f"{obj.change_pct:+.1f}%"

    def _set(self, request: HttpRequest, queryset: QuerySet[Regression], status: RegressionStatus) -> None:
        ids = list(queryset.values_list("id", flat=True))
        try:
            for regression_id in ids:
                set_regression_status(regression_id, status, acting_user=request.user)
        except FleetshardError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            self.message_user(request, f"{len(ids)} regression(s) now {status.value}", messages.SUCCESS)

    @admin.action(description="Mark selected regressions acknowledged", permissions=["change"])
    def mark_acknowledged(self, request: HttpRequest, queryset: QuerySet[Regression]) -> None:
        self._set(request, queryset, RegressionStatus.ACKNOWLEDGED)

    @admin.action(description="Mark selected regressions invalid", permissions=["change"])
    def mark_invalid(self, request: HttpRequest, queryset: QuerySet[Regression]) -> None:
        self._set(request, queryset, RegressionStatus.INVALID)

    @admin.action(description="Mark selected regressions fixed", permissions=["change"])
    def mark_fixed(self, request: HttpRequest, queryset: QuerySet[Regression]) -> None:
        self._set(request, queryset, RegressionStatus.FIXED)

    @admin.action(description="Mark selected regressions new", permissions=["change"])
    def mark_new(self, request: HttpRequest, queryset: QuerySet[Regression]) -> None:
        self._set(request, queryset, RegressionStatus.NEW)


@admin.register(RejectedResult)
class RejectedResultAdmin(ServiceAdmin):
    list_display = ["name", "hqe", "job", "refused_by", "reason", "created_on"]
    search_fields = ["name", "reason"]
    list_select_related = ["hqe__job"]
    readonly_fields = ["name", "hqe", "job", "refused_by", "digest", "reason", "created_on"]
    fields = tuple(readonly_fields)

    @admin.display(description="refused by")
    def refused_by(self, obj: RejectedResult) -> str:
        """The shard never sends what it refuses, so the master holds no digest of it."""
        return "shard" if obj.digest == UNSENT_DIGEST else "master"

    @admin.display(description="job")
    def job(self, obj: RejectedResult) -> str:
        return f"{obj.hqe.job_id} {obj.hqe.job.name}"
