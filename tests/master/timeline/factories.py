"""Intervals made directly, for tests of what is read from them (export, totals, admin)."""

from datetime import UTC, datetime, timedelta

from common.constants import FailureClass, HQEStatus
from common.models import Host, HostQueueEntry, Job
from master.timeline.models import Interval, IntervalKind

T0 = datetime(2026, 11, 23, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def host(name: str) -> Host:
    return Host.objects.get(hostname=name)


def add_run(
    hostname: str,
    start: float,
    end: float | None,
    *,
    created: float | None = None,
    name: str = "smoke",
    status: str = HQEStatus.COMPLETED,
    exit_code: int | None = 0,
) -> Interval:
    """A job with one HQE that ran on `hostname` from `start` to `end` (seconds after T0)."""
    h = host(hostname)
    job = Job.objects.create(name=name, owner="ana", command="true", shard=h.shard, created_on=at(created or start))
    hqe = HostQueueEntry.objects.create(
        job=job,
        host=h,
        status=HQEStatus.RUNNING if end is None else status,
        failure=FailureClass.TEST if status == HQEStatus.FAILED else "",
        exit_code=None if end is None else exit_code,
        started_on=at(start),
        finished_on=None if end is None else at(end),
    )
    return Interval.objects.create(
        kind=IntervalKind.RUN,
        host=h,
        shard=h.shard,
        job=job,
        hqe=hqe,
        start=at(start),
        end=None if end is None else at(end),
    )


def add_state(hostname: str, kind: str, start: float, end: float | None) -> Interval:
    h = host(hostname)
    return Interval.objects.create(
        kind=kind, host=h, shard=h.shard, start=at(start), end=None if end is None else at(end)
    )
