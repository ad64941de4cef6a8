"""The jobs' admin pages."""

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from common.admin_ui import HQEInlineBase, JobColumns, pre
from common.models import HostQueueEntry, Job, Label
from master import services
from master.admin.base import ServiceAdmin, form_action


class JobLabelFilter(admin.SimpleListFilter):
    """Jobs that name a label, as meta-host or as dependency."""

    title = "label"
    parameter_name = "label"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(n, n) for n in Label.objects.order_by("name").values_list("name", flat=True)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        name = self.value()
        if not name:
            return queryset
        return queryset.filter(
            Q(id__in=HostQueueEntry.objects.filter(meta_host__name=name).values("job_id"))
            | Q(id__in=Job.dependency_labels.through.objects.filter(label__name=name).values("job_id"))
        )


class HQEInline(HQEInlineBase):
    show_change_link = False

    @admin.display(description="log")
    def log(self, obj: HostQueueEntry) -> SafeString:
        """The log the shard ships, read live by joblog.js; the stored tail until the first bytes come."""
        return format_html(
            '<div class="fs-live-log" id="fs-log-{}" data-url="{}" data-hqe="{}">'
            '<div class="fs-log-note" style="font-size:11px;color:#666"></div>{}</div>',
            obj.id,
            reverse("job-log", kwargs={"id": obj.job_id}),
            obj.id,
            pre(obj.log_tail, lines=40),
        )


@admin.register(Job)
class JobAdmin(JobColumns, ServiceAdmin):
    list_display = ["id", "name", "owner", "priority", "status_badge", "shard", "hqe_count", "aborted", "created_on"]
    list_display_links = ["id", "name"]
    list_filter = ["status", "shard", JobLabelFilter, "aborted"]
    search_fields = ["name", "owner"]
    list_select_related = ["shard"]
    date_hierarchy = None
    readonly_fields = [
        "id",
        "name",
        "owner",
        "status_badge",
        "shard",
        "priority",
        "command_shown",
        "dependency_label_list",
        "keyvals",
        "parent",
        "timeout_mins",
        "max_runtime_mins",
        "aborted",
        "version",
        "created_on",
        "timeline",
    ]
    fields = tuple(readonly_fields)
    inlines = [HQEInline]
    actions = ["abort_jobs"]

    class Media:
        js = ["master/joblog.js"]

    @admin.display(description="command")
    def command_shown(self, obj: Job) -> SafeString:
        return pre(obj.command)

    @admin.display(description="timeline")
    def timeline(self, obj: Job) -> SafeString:
        url = f"{reverse('timeline-export')}?job={obj.id}&gzip=true"
        return format_html(
            '<a id="fs-timeline-download" href="{}">Download its runs as a trace</a> (Chrome trace)', url
        )

    @admin.display(description="dependency labels")
    def dependency_label_list(self, obj: Job) -> str:
        return ", ".join(label.name for label in obj.dependency_labels.all()) or "-"

    @admin.action(description="Abort selected jobs", permissions=["change"])
    def abort_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], jobs: list[Job]) -> str:
            ids = sorted(job.id for job in jobs)
            services.abort_jobs(ids, acting_user=request.user)
            listed = ", ".join(map(str, ids))
            return f"aborting job{'s' if len(ids) > 1 else ''} {listed}: their shard stops them at its next heartbeat"

        return form_action(
            self,
            request,
            queryset,
            title="Abort jobs",
            apply=apply,
            submit="Yes, abort them",
            intro="Queued HQEs are cancelled and running ones killed by their shard, which reports them Aborted.",
        )
