"""The fleet at a glance: per-shard and per-label counts, and the staff page that shows them.

Every count is a correlated subquery or a filtered aggregate inside one SELECT, so the page and the
shard changelist cost the same few queries for two shards or two thousand. Counting through
subqueries rather than joins keeps hosts and jobs from multiplying each other's rows.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db.models import Count, IntegerField, Model, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.safestring import SafeString

from common.admin_ui import age, badge, color_of
from common.constants import HostStatus, JobStatus
from common.models import Host, Job, Label, Shard, offline_after_s
from master.timeline.stats import utilisation_by_shard

FAILED_WINDOW = timedelta(hours=24)

# Annotation names for hosts by status, e.g. "hosts_repair_failed".
HOST_STATUS_FIELDS: dict[str, str] = {s: "hosts_" + s.lower().replace(" ", "_") for s in HostStatus.ALL}


def _count_per_shard(qs: QuerySet[Any]) -> Coalesce:
    """`qs` counted for the outer shard row, 0 when it has none."""
    counted = (
        qs.filter(shard=OuterRef("pk")).order_by().values("shard").annotate(n=Count("pk", distinct=True)).values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def annotate_shards(qs: QuerySet[Shard], now: datetime | None = None) -> QuerySet[Shard]:
    """Adds hosts (total and by status), queued and running jobs, and jobs failed in the last 24 hours."""
    since = (now or timezone.now()) - FAILED_WINDOW
    annotations: dict[str, Any] = {
        "hosts_total": _count_per_shard(Host.objects.all()),
        "hosts_locked": _count_per_shard(Host.objects.filter(locked=True)),
        "jobs_queued": _count_per_shard(Job.objects.filter(status=JobStatus.QUEUED)),
        "jobs_running": _count_per_shard(Job.objects.filter(status=JobStatus.RUNNING)),
        "jobs_failed_24h": _count_per_shard(Job.objects.filter(status=JobStatus.FAILED, hqes__finished_on__gte=since)),
    }
    for status, name in HOST_STATUS_FIELDS.items():
        annotations[name] = _count_per_shard(Host.objects.filter(status=status))
    return qs.annotate(**annotations)


def annotate_labels(qs: QuerySet[Label]) -> QuerySet[Label]:
    """Adds hosts_total and hosts_ready (Ready and unlocked: the hosts that could take work now)."""
    return qs.annotate(
        hosts_total=Count("hosts", distinct=True),
        hosts_ready=Count("hosts", filter=Q(hosts__status=HostStatus.READY, hosts__locked=False), distinct=True),
    )


def hosts_by_status(obj: Model) -> list[tuple[str, int]]:
    """The non-zero host counts of an annotated shard, in the vocabulary's order."""
    return [(s, getattr(obj, name)) for s, name in HOST_STATUS_FIELDS.items() if getattr(obj, name)]


def host_badges(obj: Model) -> list[SafeString]:
    """Hosts by status, then how many of them are locked (a locked host keeps its status)."""
    badges = [badge(f"{n} {status}", color_of(status)) for status, n in hosts_by_status(obj)]
    if getattr(obj, "hosts_locked", 0):
        badges.append(badge(f"{obj.hosts_locked} locked", color_of("locked"), title="locked hosts get no new jobs"))  # type: ignore[attr-defined]
    return badges


def refresh_every_s() -> int:
    """The page follows the heartbeat, but never faster than every 2 s nor slower than every 30 s."""
    return int(min(30, max(2, settings.FLEETSHARD_HEARTBEAT_INTERVAL_S)))


@dataclass
class ShardCard:
    shard: Shard
    online: bool
    heartbeat_age: str
    host_badges: list[SafeString]

    @property
    def state_badge(self) -> SafeString:
        return badge("online" if self.online else "offline")


@dataclass
class Snapshot:
    now: datetime
    cards: list[ShardCard]
    labels: list[Label]
    unassigned_hosts: int
    unassigned_ready: int
    utilisation: list[dict[str, Any]]  # per shard over the last 24 hours (master.timeline.stats)


def fleet_snapshot(now: datetime | None = None) -> Snapshot:
    """Six queries whatever the fleet's size: shards, labels, hosts without a shard, and the three of
    the shards' utilisation."""
    now = now or timezone.now()
    shards = list(annotate_shards(Shard.objects.all(), now).order_by("hostname"))
    labels = list(annotate_labels(Label.objects.select_related("shard")).order_by("name"))
    unassigned = Host.objects.filter(shard__isnull=True).aggregate(
        total=Count("pk"), ready=Count("pk", filter=Q(status=HostStatus.READY, locked=False))
    )
    cards = [ShardCard(s, s.is_online(now), age(s.last_heartbeat, now), host_badges(s)) for s in shards]
    return Snapshot(now, cards, labels, unassigned["total"], unassigned["ready"], utilisation_by_shard(now))


def fleet_overview(request: HttpRequest) -> HttpResponse:
    """Staff only (the URLconf wraps it in the admin site's login check)."""
    snapshot = fleet_snapshot()
    context = {
        **admin.site.each_context(request),
        "title": "Fleet overview",
        "snapshot": snapshot,
        "online_count": sum(1 for c in snapshot.cards if c.online),
        "refresh_s": refresh_every_s(),
        "offline_after_s": offline_after_s(),
        "host_statuses": HostStatus.ALL,
    }
    response = TemplateResponse(request, "master/fleet_overview.html", context)
    response["Cache-Control"] = "no-store"
    return response
