"""Benchmark results in the admin: runs with their entries and the files refused from shards
(read-only: they come from uploads), and regressions, whose status people change with actions
that call the same service as the API and the CLI."""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from common.errors import FleetshardError
from master.admin.base import ServiceAdmin
from master.models import Regression, RegressionStatus, RejectedResult, TestEntry, TestRun
from master.results.regressions import set_regression_status


class TestEntryInline(admin.TabularInline):
    model = TestEntry
    fields = ["entry", "wall_time_s", "cpu_time_s", "iterations", "throughput", "extras"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: TestRun | None = None) -> bool:
        return False


@admin.register(TestRun)
class TestRunAdmin(ServiceAdmin):
    list_display = ["test", "start", "label", "entry_count", "job", "host", "shard", "uploaded_by", "created_on"]
    list_filter = ["format"]
    search_fields = ["test", "label"]
    list_select_related = ["job", "host", "shard", "uploaded_by"]
    date_hierarchy = "start"
    fields = [
        "test",
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
    readonly_fields = fields
    inlines = [TestEntryInline]


@admin.register(Regression)
class RegressionAdmin(ServiceAdmin):
    list_display = ["test", "entry", "label", "start", "before_s", "after_s", "change_shown", "status", "detected_on"]
    list_filter = ["status"]
    search_fields = ["test", "entry", "label"]
    fields = [
        "test",
        "entry",
        "label",
        "start",
        "before_s",
        "after_s",
        "change_pct",
        "status",
        "detected_on",
        "fixed_on",
        "run",
    ]
    readonly_fields = fields
    actions = ["mark_acknowledged", "mark_invalid", "mark_fixed", "mark_new"]

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
    list_display = ["name", "hqe", "job", "reason", "created_on"]
    search_fields = ["name", "reason"]
    list_select_related = ["hqe__job"]
    fields = ["name", "hqe", "job", "digest", "reason", "created_on"]
    readonly_fields = fields

    @admin.display(description="job")
    def job(self, obj: RejectedResult) -> str:
        return f"{obj.hqe.job_id} {obj.hqe.job.name}"
