"""What people look up about one host or one shard (`host stat`, `shard stat`, the admin's host page):
a host's current run and its last ones, a shard's hosts and jobs counted by status. Reads only."""

from django.db.models import Count

from common.constants import HostStatus, HQEStatus, JobStatus
from common.models import Host, HostQueueEntry, Job, Shard

RECENT_RUNS = 10


def running(host: Host) -> list[HostQueueEntry]:
    """The entries the host runs now (Starting or Running): one at most, as the shard runs them."""
    active = (HQEStatus.STARTING, HQEStatus.RUNNING)
    return list(HostQueueEntry.objects.select_related("job").filter(host=host, status__in=active).order_by("-id"))


def recent_runs(host: Host, limit: int = RECENT_RUNS) -> list[HostQueueEntry]:
    """The host's last `limit` runs that ended, newest first (by when they ended; never started: by id)."""
    ended = HostQueueEntry.objects.select_related("job").filter(host=host, status__in=HQEStatus.TERMINAL)
    return list(ended.order_by("-finished_on", "-id")[:limit])


def _by_status(rows: list[dict[str, object]], order: tuple[str, ...]) -> dict[str, int]:
    counts = {str(row["status"]): int(row["n"]) for row in rows}  # type: ignore[call-overload]
    return {status: counts[status] for status in order if counts.get(status)}


def hosts_by_status(shard: Shard) -> dict[str, int]:
    rows = list(Host.objects.filter(shard=shard).values("status").annotate(n=Count("id")).order_by())
    return _by_status(rows, HostStatus.ALL)


def jobs_by_status(shard: Shard) -> dict[str, int]:
    rows = list(Job.objects.filter(shard=shard).values("status").annotate(n=Count("id")).order_by())
    return _by_status(rows, JobStatus.ALL)
