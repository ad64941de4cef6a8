"""Display helpers shared by the master's and the shard's admin: status badges, ages, preformatted logs.

They only format values already loaded, so a changelist column built on them never queries.
"""

import html
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from common.constants import HostStatus, HQEStatus, JobStatus
from common.models import Host, HostQueueEntry, Job

if TYPE_CHECKING:
    # The column mixins are typed as the admins they join; at runtime they stay plain classes.
    _HostAdmin = admin.ModelAdmin[Host]
    _JobAdmin = admin.ModelAdmin[Job]
    _HQEInline = admin.TabularInline[HostQueueEntry, Job]
else:
    _HostAdmin = _JobAdmin = object
    _HQEInline = admin.TabularInline

# One color per status word, chosen so the eye finds trouble (red, orange) first.
_COLORS: dict[str, str] = {
    HostStatus.READY: "#2e7d32",
    HostStatus.RUNNING: "#1565c0",
    HostStatus.CLEANING: "#00838f",
    HostStatus.REPAIRING: "#ef6c00",
    HostStatus.REPAIR_FAILED: "#c62828",
    HQEStatus.QUEUED: "#616161",
    HQEStatus.STARTING: "#5e35b1",
    JobStatus.COMPLETED: "#2e7d32",
    JobStatus.FAILED: "#c62828",
    JobStatus.ABORTED: "#6d4c41",
    JobStatus.EXPIRED: "#ad1457",
    "online": "#2e7d32",
    "offline": "#c62828",
    "locked": "#f9a825",
}


def color_of(word: str) -> str:
    return _COLORS.get(word, "#455a64")


def badge(text: str, color: str | None = None, title: str = "") -> SafeString:
    """A small colored label; the text stays visible so color is never the only signal. Its shape is
    the admin's stylesheet's (.fs-badge, admin/base_site.html): a list of 100 shards carries 900 of
    them, and the inline style was most of the page's bytes. Built without format_html, whose lazy
    escaping per argument was a fifth of the shard list's time; html.escape quotes as it does."""
    title_attr = f' title="{html.escape(str(title))}"' if title else ""
    return SafeString(
        f'<span class="fs-badge"{title_attr} style="background:{html.escape(color or color_of(text))}">'
        f"{html.escape(str(text))}</span>"
    )


def status_badge(status: str) -> SafeString:
    return badge(status) if status else format_html("{}", "-")


def age(moment: datetime | None, now: datetime | None = None) -> str:
    """'12 s ago', '5 min ago', '3 h ago', '2 d ago' or 'never': short enough for a table cell."""
    if moment is None:
        return "never"
    seconds = max(0, int(((now or timezone.now()) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def pre(text: str, *, lines: int | None = None) -> SafeString:
    """Preformatted text for a log; `lines` keeps only the last few for a changelist cell."""
    if lines is not None:
        text = "\n".join(text.rstrip("\n").splitlines()[-lines:])
    if not text:
        return format_html("{}", "-")
    return format_html(
        '<pre class="fs-log" style="margin:0;max-width:60em;max-height:30em;overflow:auto;'
        'white-space:pre-wrap;font-size:11px">{}</pre>',
        text,
    )


class HostColumns(_HostAdmin):
    """The host columns both admins show; labels come prefetched, so a host list never queries per row."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Host]:
        return super().get_queryset(request).prefetch_related("labels")

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Host) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description="locked", ordering="locked")
    def locked_badge(self, obj: Host) -> SafeString | str:
        return badge("locked", title=obj.lock_reason) if obj.locked else ""

    @admin.display(description="labels")
    def label_list(self, obj: Host) -> str:
        return ", ".join(label.name for label in obj.labels.all())


class JobColumns(_JobAdmin):
    """The job columns both admins show; the HQE count is annotated, not queried per row.

    A correlated subquery, not a join with GROUP BY: the database counts the HQEs of the page's rows
    only, and the paginator's COUNT(*) (which drops an annotation nothing filters or orders by) reads
    the jobs alone instead of grouping every job with its HQEs."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        hqes = (
            HostQueueEntry.objects.filter(job=OuterRef("pk"))
            .order_by()
            .values("job")
            .annotate(n=Count("pk"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(hqe_count=Coalesce(Subquery(hqes, output_field=IntegerField()), Value(0)))
        )

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Job) -> SafeString:
        if obj.aborted and obj.status in JobStatus.ACTIVE:
            return format_html("{} aborting", status_badge(obj.status))
        return status_badge(obj.status)

    @admin.display(description="aborted")
    def aborted_shown(self, obj: Job) -> str:
        """Words, not Django's red cross: not being aborted is the normal state, no error."""
        return "yes" if obj.aborted else "no"

    # Not sortable: sorting by it counts the HQEs of every job, where a page counts its own rows only.
    @admin.display(description="HQEs")
    def hqe_count(self, obj: Job) -> int:
        count: int = obj.hqe_count  # type: ignore[attr-defined]  # annotated by get_queryset
        return count


class NoWrites:
    """For master-owned data on a shard, and execution records: shown, never edited here."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class HQEInlineBase(NoWrites, _HQEInline):
    """An HQE under its job on either site; a site says only where its `log` column comes from."""

    model = HostQueueEntry
    readonly_fields = [
        "id",
        "host",
        "meta_host",
        "status_badge",
        "failure",
        "exit_code",
        "started_on",
        "finished_on",
        "log",
    ]
    fields = tuple(readonly_fields)
    extra = 0
    can_delete = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[HostQueueEntry]:
        return super().get_queryset(request).select_related("host", "meta_host")

    @admin.display(description="status")
    def status_badge(self, obj: HostQueueEntry) -> SafeString:
        return status_badge(obj.status)
