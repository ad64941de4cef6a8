"""The fleet at a glance: per-shard and per-label counts, and the staff page that shows them.

Every count is grouped in the database (one GROUP BY over a table, or a correlated subquery for the
rows of one page), so the page and the shard changelist cost the same few queries for two shards or
two thousand. Counting through subqueries rather than joins keeps hosts and jobs from multiplying
each other's rows.
"""

from collections.abc import Callable, Sequence
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


def _count_per_shard(qs: QuerySet[Any], distinct: bool = False) -> Coalesce:
    """`qs` counted for the outer shard row, 0 when it has none; `distinct` when `qs` joins rows that
    multiply it (a job's HQEs)."""
    counted = (
        qs.filter(shard=OuterRef("pk"))
        .order_by()
        .values("shard")
        .annotate(n=Count("pk", distinct=distinct))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def annotate_shards(qs: QuerySet[Shard], now: datetime | None = None) -> QuerySet[Shard]:
    """Adds hosts_total, queued and running jobs, and jobs failed in the last 24 hours: the counts a
    list sorts by, each read from an index (Host's shard_id, Job's shard and status).

    Hosts by status and locked hosts come after the page is cut (`count_hosts_by_status`): counting
    them in correlated subqueries read every host row of every listed shard, eight times."""
    since = (now or timezone.now()) - FAILED_WINDOW
    return qs.annotate(
        hosts_total=_count_per_shard(Host.objects.all()),
        jobs_queued=_count_per_shard(Job.objects.filter(status=JobStatus.QUEUED)),
        jobs_running=_count_per_shard(Job.objects.filter(status=JobStatus.RUNNING)),
        jobs_failed_24h=_count_per_shard(
            Job.objects.filter(status=JobStatus.FAILED, hqes__finished_on__gte=since), distinct=True
        ),
    )


def count_hosts_by_status(shards: Sequence[Shard]) -> None:
    """Sets hosts_<status> (HOST_STATUS_FIELDS) and hosts_locked on each of `shards`: one grouped query
    over their hosts, whatever their number."""
    counts: dict[int, dict[str, int]] = {s.pk: {} for s in shards}
    if counts:
        rows = Host.objects.filter(shard_id__in=counts).order_by().values("shard_id", "status", "locked")
        for row in rows.annotate(n=Count("*")):  # from the (shard, status, locked) index alone
            of = counts[row["shard_id"]]
            of[row["status"]] = of.get(row["status"], 0) + row["n"]
            of["locked"] = of.get("locked", 0) + (row["n"] if row["locked"] else 0)
    for shard in shards:
        for status, name in HOST_STATUS_FIELDS.items():
            setattr(shard, name, counts[shard.pk].get(status, 0))
        shard.hosts_locked = counts[shard.pk].get("locked", 0)  # type: ignore[attr-defined]


def count_label_hosts(labels: Sequence[Label]) -> None:
    """Sets hosts_total and hosts_ready (Ready and unlocked: the hosts that could take work now) on each
    of `labels`: one grouped query over their hosts, whatever their number. After the page is cut, so
    the database counts the hosts of the labels shown only (a label holds a host once: no DISTINCT)."""
    counts: dict[int, tuple[int, int]] = {}
    if labels:
        ready = Q(hosts__status=HostStatus.READY, hosts__locked=False)
        rows = Label.objects.filter(pk__in=[label.pk for label in labels]).order_by().values("pk")
        for row in rows.annotate(total=Count("hosts"), ready=Count("hosts", filter=ready)):
            counts[row["pk"]] = (row["total"], row["ready"])
    for label in labels:
        label.hosts_total, label.hosts_ready = counts.get(label.pk, (0, 0))  # type: ignore[attr-defined]


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


# The shard list's pages and orders. "worst" puts shards that need someone first: silent ones that
# had been heard from, then never seen ones, then by hosts in trouble and jobs failed in the last day.
PAGE_SIZE = 50
SORTS = ("worst", "name", "heartbeat", "hosts")
MAX_QUERY_CHARS = 255
# Host statuses that want an operator's eye (a shard's "problems").
TROUBLE = (HostStatus.REPAIRING, HostStatus.REPAIR_FAILED, HostStatus.MISSING)
# Labels listed under the shards: those of the page's shards and, at most this many, those of no shard.
UNOWNED_LABELS = 50


class OverviewError(ValueError):
    """A query parameter the overview cannot answer; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class ShardLine:
    """One shard's line on the overview, with its counts from the fleet-wide grouped queries."""

    shard: Shard
    state: str  # online, late (heard from, silent since), never (never heard from)
    heartbeat_age: str
    hosts_total: int
    hosts_locked: int
    by_status: dict[str, int]
    jobs_queued: int
    jobs_running: int
    jobs_failed_24h: int

    @property
    def online(self) -> bool:
        return self.state == "online"

    @property
    def trouble(self) -> int:
        return sum(self.by_status.get(s, 0) for s in TROUBLE)

    @property
    def state_badge(self) -> SafeString:
        word = "online" if self.online else "offline"
        return badge(word, color_of(word))

    @property
    def host_badges(self) -> list[SafeString]:
        badges = [badge(f"{self.by_status[s]} {s}", color_of(s)) for s in HostStatus.ALL if self.by_status.get(s)]
        if self.hosts_locked:
            badges.append(badge(f"{self.hosts_locked} locked", color_of("locked"), "locked hosts get no new jobs"))
        return badges


def _sort_key(sort: str) -> Callable[[ShardLine], Any]:
    rank = {"late": 0, "never": 1, "online": 2}
    if sort == "worst":
        return lambda x: (rank[x.state], -x.trouble, -x.jobs_failed_24h, x.shard.hostname)
    if sort == "heartbeat":  # the longest silent first, never heard from before all
        return lambda x: (x.shard.last_heartbeat is not None, x.shard.last_heartbeat or x.shard.created_on)
    if sort == "hosts":
        return lambda x: (-x.hosts_total, x.shard.hostname)
    return lambda x: x.shard.hostname


@dataclass
class Snapshot:
    now: datetime
    lines: list[ShardLine]  # the page's shards, in the page's order
    page: int
    pages: int
    sort: str
    q: str
    matching: int  # shards the search matches (all shards without one)
    shards: dict[str, int]  # fleet-wide: total, online, late, never
    hosts: dict[str, int]  # fleet-wide hosts by status, and total, locked, unassigned, unassigned_ready
    jobs: dict[str, int]  # fleet-wide: queued, running, failed_24h
    labels: Sequence[Label]  # those of the page's shards, then (at most UNOWNED_LABELS) those of no shard
    utilisation: list[dict[str, Any]]  # the page's shards over the last 24 hours (master.timeline.stats)


def parse_page(raw: str | None) -> int:
    if raw is None or raw == "":
        return 1
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9 or int(raw) < 1:
        raise OverviewError(f"page must be a whole number from 1 to 999999999, not {raw[:40]!r}")
    return int(raw)


def parse_sort(raw: str | None) -> str:
    if raw is None or raw == "":
        return "worst"
    if raw not in SORTS:
        raise OverviewError(f"sort must be one of {', '.join(SORTS)}, not {raw[:40]!r}")
    return raw


def parse_q(raw: str | None) -> str:
    q = (raw or "").strip()
    if len(q) > MAX_QUERY_CHARS or "\x00" in q:
        raise OverviewError(f"q (a part of a shard's name) must be at most {MAX_QUERY_CHARS} characters, without NUL")
    return q


def fleet_snapshot(now: datetime | None = None, *, page: int = 1, sort: str = "worst", q: str = "") -> Snapshot:
    """Eight queries whatever the fleet's size (five when no shard matches: no utilisation to count):
    the shards, hosts grouped by shard, status and lock, active jobs and jobs failed in a day grouped
    by shard, the page's labels, and the three of the page's utilisation.

    The counts are grouped in the database, one pass over each table, and the shards (a few thousand
    rows at most) are ordered and cut into pages here, so any order costs the same."""
    now = now or timezone.now()
    sort = parse_sort(sort)
    cutoff = now - timedelta(seconds=offline_after_s())
    shards_qs = Shard.objects.only("id", "hostname", "last_heartbeat", "client_version", "created_on")
    all_shards = list(shards_qs.order_by("hostname"))

    hosts: dict[str, int] = dict.fromkeys(HostStatus.ALL, 0)
    hosts.update(total=0, locked=0, unassigned=0, unassigned_ready=0)
    per_shard_hosts: dict[int, dict[str, int]] = {}
    # COUNT(*), not COUNT(id): the index on (shard, status, locked) answers it without the table.
    # Tuples, not dicts: a row per shard and status, thousands of them.
    grouped = Host.objects.order_by().values_list("shard_id", "status", "locked").annotate(n=Count("*"))
    for shard_id, status, locked, n in grouped:
        hosts[status] = hosts.get(status, 0) + n
        hosts["total"] += n
        hosts["locked"] += n if locked else 0
        if shard_id is None:
            hosts["unassigned"] += n
            hosts["unassigned_ready"] += n if status == HostStatus.READY and not locked else 0
            continue
        counts = per_shard_hosts.setdefault(shard_id, {"total": 0, "locked": 0})
        counts[status] = counts.get(status, 0) + n
        counts["total"] += n
        counts["locked"] += n if locked else 0

    active: dict[tuple[int | None, str], int] = {
        (shard_id, status): n
        for shard_id, status, n in Job.objects.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING))
        .order_by()
        .values_list("shard_id", "status")
        .annotate(n=Count("*"))
    }
    failed: dict[int | None, int] = dict(
        Job.objects.filter(status=JobStatus.FAILED, hqes__finished_on__gte=now - FAILED_WINDOW)
        .order_by()
        .values_list("shard_id")
        .annotate(n=Count("pk", distinct=True))
    )
    jobs = {
        "queued": sum(n for (_, status), n in active.items() if status == JobStatus.QUEUED),
        "running": sum(n for (_, status), n in active.items() if status == JobStatus.RUNNING),
        "failed_24h": sum(failed.values()),
    }

    def line(shard: Shard) -> ShardLine:
        state = "never" if shard.last_heartbeat is None else "online" if shard.last_heartbeat >= cutoff else "late"
        counts = per_shard_hosts.get(shard.pk, {})
        return ShardLine(
            shard,
            state,
            "",  # set for the page's shards only, below
            counts.get("total", 0),
            counts.get("locked", 0),
            {s: counts[s] for s in HostStatus.ALL if counts.get(s)},
            active.get((shard.pk, JobStatus.QUEUED), 0),
            active.get((shard.pk, JobStatus.RUNNING), 0),
            failed.get(shard.pk, 0),
        )

    lines = [line(s) for s in all_shards]
    summary = {"total": len(lines), "online": 0, "late": 0, "never": 0}
    for x in lines:
        summary[x.state] += 1
    query = q.casefold()
    matching = sorted((x for x in lines if query in x.shard.hostname.casefold()), key=_sort_key(sort))
    pages = max(1, -(-len(matching) // PAGE_SIZE))
    if page > pages:
        raise OverviewError(f"page {page} does not exist: there {'is' if pages == 1 else 'are'} {pages}", status=404)
    shown = matching[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    for x in shown:
        x.heartbeat_age = age(x.shard.last_heartbeat, now)

    ids = [x.shard.pk for x in shown]
    # The labels and their hosts counted in one query (count_label_hosts' join, in the same SELECT):
    # correlated subqueries a label were slower, and costly enough on paper for PostgreSQL to JIT them.
    ready = Q(hosts__status=HostStatus.READY, hosts__locked=False)
    # Only the columns shown: each label row is joined to its hosts' before grouping, so every column
    # of the shard (its pools, its counters) was carried through 10,000 rows at 100,000 hosts.
    labels = list(
        Label.objects.select_related("shard")
        .only("id", "name", "shard_id", "shard__hostname")
        .filter(Q(shard_id__in=ids) | Q(shard__isnull=True))
        .annotate(hosts_total=Count("hosts"), hosts_ready=Count("hosts", filter=ready))
        .order_by("name")
    )
    unowned = [label for label in labels if label.shard_id is None]
    labels = [label for label in labels if label.shard_id is not None] + unowned[:UNOWNED_LABELS]
    utilisation = utilisation_by_shard(now, tuple(x.shard.hostname for x in shown))
    return Snapshot(now, shown, page, pages, sort, q, len(matching), summary, hosts, jobs, labels, utilisation)


def fleet_overview(request: HttpRequest) -> HttpResponse:
    """Staff only (the URLconf wraps it in the admin site's login check). A bad parameter is answered
    with a plain message saying what would do (400, or 404 for a page past the last)."""
    try:
        get = request.GET.get
        snapshot = fleet_snapshot(page=parse_page(get("page")), sort=parse_sort(get("sort")), q=parse_q(get("q")))
    except OverviewError as exc:
        response = HttpResponse(exc.message + "\n", status=exc.status, content_type="text/plain; charset=utf-8")
        response["Cache-Control"] = "no-store"
        return response
    context = {
        **admin.site.each_context(request),
        "title": "Fleet overview",
        "snapshot": snapshot,
        "online_count": snapshot.shards["online"],
        "refresh_s": refresh_every_s(),
        "offline_after_s": offline_after_s(),
        "host_statuses": [(s, snapshot.hosts.get(s, 0), color_of(s)) for s in HostStatus.ALL],
        "locked_color": color_of("locked"),
        "sorts": SORTS,
        "page_size": PAGE_SIZE,
        "first_shown": (snapshot.page - 1) * PAGE_SIZE + 1,
        "last_shown": (snapshot.page - 1) * PAGE_SIZE + len(snapshot.lines),
    }
    response = TemplateResponse(request, "master/fleet_overview.html", context)
    response["Cache-Control"] = "no-store"
    return response
