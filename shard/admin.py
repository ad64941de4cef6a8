"""The shard's admin: a lab operator's view of the shard's own database, served by server/urls/shard.py.

It is a separate AdminSite so that master and shard admins never share registrations: the test
settings install both apps in one process and Django imports every app's admin module. Everything is
read-only here.
Master-owned data (labels, host config, jobs) changes only on the master and arrives by heartbeat;
execution state changes only through the scheduler and executors, which queue each change for the
master in the same transaction, so an edit made here would be lost or would split the two sides.
"""

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.safestring import SafeString

from common.admin_ui import (
    HostColumns,
    HQEInlineBase,
    JobColumns,
    NoWrites,
    age,
    badge,
    color_of,
    pre,
    status_badge,
)
from common.constants import HostStatus, HQEStatus
from common.models import Host, HostQueueEntry, Job, Label
from shard.models import DeadLetter, DiscoveryState, OutboxEntry, ShardState, run_of
from shard.run.workspace import run_log_tail


class ShardAdminSite(admin.AdminSite):
    site_header = "fleetshard shard"
    site_title = "fleetshard shard"
    index_title = "This lab's shard"
    index_template = "shard/admin/index.html"
    site_url = None  # a shard serves no site besides this admin
    enable_nav_sidebar = False  # it repeats the front page and narrows the lists

    def each_context(self, request: HttpRequest) -> dict[str, Any]:
        context = super().each_context(request)
        name = settings.FLEETSHARD_SHARD_HOSTNAME
        if name:
            context["site_header"] = f"fleetshard shard {name}"
        return context

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        return super().index(request, {**summary(), **(extra_context or {})})


shard_site = ShardAdminSite(name="shard_admin")


def summary() -> dict[str, Any]:
    """What a lab operator checks first; a fixed handful of queries."""
    hosts = dict(Host.objects.order_by().values_list("status").annotate(n=Count("id")))
    hqes = dict(
        HostQueueEntry.objects.filter(status__in=HQEStatus.ACTIVE)
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
    )
    state = ShardState.objects.first()
    return {
        "shard_hostname": settings.FLEETSHARD_SHARD_HOSTNAME or "(FLEETSHARD_SHARD_HOSTNAME is not set)",
        "master_url": settings.FLEETSHARD_MASTER_URL,
        "last_heartbeat_ok": age(state.last_heartbeat_ok) if state and state.last_heartbeat_ok else "",
        "host_badges": [badge(f"{hosts[s]} {s}", color_of(s)) for s in HostStatus.ALL if s in hosts],
        "hosts_total": sum(hosts.values()),
        "hosts_locked": Host.objects.filter(locked=True).count(),
        "hqe_counts": [(s, hqes.get(s, 0)) for s in HQEStatus.ACTIVE],
        "outbox_count": OutboxEntry.objects.count(),
        "dead_letter_count": DeadLetter.objects.count(),
        **discovery_summary(),
    }


def discovery_summary() -> dict[str, Any]:
    """Discovery's sources, each one's last run, and what the master refused of the last acked set."""
    found = DiscoveryState.objects.filter(id=1).values("generation", "acked_generation", "rejected", "sources").first()
    if not found:
        return {}
    sources = [{"name": name, **run} for name, run in sorted(found["sources"].items()) if isinstance(run, dict)]
    return {
        "discovery": {
            "generation": found["generation"],
            "acked": found["acked_generation"],
            "sources": sources,
            "rejected": found["rejected"][:50],
        }
    }


if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = admin.ModelAdmin


class ReadOnlyAdmin(NoWrites, _ModelAdmin):
    pass


def _log(hqe: HostQueueEntry, lines: int | None) -> SafeString:
    """The uploaded tail of an ended run; a running one's is read from its log file as it grows."""
    run = run_of(hqe)
    tail = hqe.log_tail if hqe.log_tail or not hqe.is_active else run_log_tail(run.results_dir if run else "")
    return pre(tail, lines=lines)


@admin.register(Host, site=shard_site)
class HostAdmin(HostColumns, ReadOnlyAdmin):
    list_display = ["hostname", "status_badge", "locked_badge", "lock_reason", "label_list", "retired", "version"]
    list_filter = ["status", "locked", "labels", ("state__retired", admin.BooleanFieldListFilter)]
    search_fields = ["hostname"]
    readonly_fields = [
        "hostname",
        "status_badge",
        "label_list",
        "locked",
        "lock_reason",
        "attributes",
        "retired",
        "runner",
        "version",
    ]
    fields = tuple(readonly_fields)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Host]:
        return super().get_queryset(request).select_related("state")

    @admin.display(description="retired", ordering="state__retired")
    def retired(self, obj: Host) -> str:
        """Words, not a red cross: a host in service is the normal state."""
        return "retired" if obj.state.retired else ""

    @admin.display(description="held by (scheduler process)")
    def runner(self, obj: Host) -> str:
        return obj.state.runner


class ActiveFilter(admin.SimpleListFilter):
    title = "activity"
    parameter_name = "activity"

    def lookups(self, request: HttpRequest, model_admin: "admin.ModelAdmin[Any]") -> list[tuple[str, str]]:
        return [("active", "queued, starting or running"), ("finished", "finished")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "active":
            return queryset.filter(status__in=HQEStatus.ACTIVE)
        if self.value() == "finished":
            return queryset.filter(status__in=HQEStatus.TERMINAL)
        return queryset


@admin.register(HostQueueEntry, site=shard_site)
class HQEAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "host", "meta_host", "status_badge", "failure", "started_on", "runtime", "log_lines"]
    list_filter = [ActiveFilter, "status", "failure"]
    search_fields = ["job__name", "host__hostname"]
    readonly_fields = [
        "id",
        "job",
        "host",
        "meta_host",
        "status_badge",
        "failure",
        "exit_code",
        "started_on",
        "finished_on",
        "runtime",
        "results_dir",
        "pid",
        "full_log",
    ]
    fields = tuple(readonly_fields)

    def get_queryset(self, request: HttpRequest) -> QuerySet[HostQueueEntry]:
        # Here rather than list_select_related, which the change list skips once a query selects any.
        return super().get_queryset(request).select_related("job", "host", "meta_host", "run")

    @admin.display(description="results dir")
    def results_dir(self, obj: HostQueueEntry) -> str:
        run = run_of(obj)
        return run.results_dir if run else ""

    @admin.display(description="pid")
    def pid(self, obj: HostQueueEntry) -> int | None:
        run = run_of(obj)
        return run.pid if run else None

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: HostQueueEntry) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description="run time")
    def runtime(self, obj: HostQueueEntry) -> str:
        if obj.started_on is None:
            return "-"
        seconds = int(((obj.finished_on or timezone.now()) - obj.started_on).total_seconds())
        return f"{seconds // 60} min {seconds % 60} s"

    @admin.display(description="log tail (last lines)")
    def log_lines(self, obj: HostQueueEntry) -> SafeString:
        return _log(obj, lines=6)

    @admin.display(description="log tail")
    def full_log(self, obj: HostQueueEntry) -> SafeString:
        return _log(obj, lines=None)


class HQEInline(HQEInlineBase):
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet[HostQueueEntry]:
        return super().get_queryset(request).select_related("run")

    @admin.display(description="log tail")
    def log(self, obj: HostQueueEntry) -> SafeString:
        return _log(obj, lines=40)


@admin.register(Job, site=shard_site)
class JobAdmin(JobColumns, ReadOnlyAdmin):
    list_display = ["id", "name", "owner", "priority", "status_badge", "hqe_count", "created_on"]
    list_display_links = ["id", "name"]
    list_filter = ["status", "aborted"]
    search_fields = ["name", "owner"]
    ordering = ["-priority", "created_on", "id"]
    readonly_fields = [
        "id",
        "name",
        "owner",
        "status_badge",
        "priority",
        "command",
        "keyvals",
        "suite_keyvals",
        "parent_id",
        "timeout_mins",
        "max_runtime_mins",
        "aborted_shown",
        "version",
        "created_on",
    ]
    fields = tuple(readonly_fields)
    inlines = [HQEInline]


@admin.register(Label, site=shard_site)
class LabelAdmin(ReadOnlyAdmin):
    list_display = ["name", "hosts_total"]
    search_fields = ["name"]
    fields = ["name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Label]:
        labels: QuerySet[Label] = super().get_queryset(request).annotate(hosts_total=Count("hosts"))
        return labels

    @admin.display(description="hosts", ordering="hosts_total")
    def hosts_total(self, obj: Label) -> int:
        total: int = obj.hosts_total  # type: ignore[attr-defined]  # annotated by get_queryset
        return total


@admin.register(OutboxEntry, site=shard_site)
class OutboxAdmin(ReadOnlyAdmin):
    list_display = ["seq", "hqe_id", "job_id", "update_status", "created_on", "waiting"]
    search_fields = ["=hqe_id", "=job_id"]
    readonly_fields = ["seq", "hqe_id", "job_id", "update_status", "created_on", "payload"]
    fields = tuple(readonly_fields)

    @admin.display(description="status")
    def update_status(self, obj: OutboxEntry) -> SafeString:
        return status_badge(str(obj.payload.get("status", "")))

    @admin.display(description="waiting since")
    def waiting(self, obj: OutboxEntry) -> str:
        return age(obj.created_on)


@admin.register(DeadLetter, site=shard_site)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ["seq", "hqe_id", "job_id", "update_status", "error", "created_on"]
    search_fields = ["=hqe_id", "=job_id", "error"]
    readonly_fields = ["seq", "hqe_id", "job_id", "update_status", "error", "created_on", "payload"]
    fields = tuple(readonly_fields)

    @admin.display(description="status")
    def update_status(self, obj: DeadLetter) -> SafeString:
        return status_badge(str(obj.payload.get("status", "")))


# Accounts are the shard's own: its operators log in here, not on the master.
shard_site.register(User, UserAdmin)
shard_site.register(Group, GroupAdmin)
