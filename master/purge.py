"""The master's purge: finished jobs older than a cutoff with their HQEs and intervals, old host
intervals and audit records, and (only when asked) old benchmark results. `manage.py purge` runs it.

A job is old when it was created before the cutoff, is no longer active and none of its HQEs ended
after the cutoff. Benchmark results outlive their jobs (a run only loses its link to the job and
HQE); with `results`, runs stored before the cutoff go too, with their entries (regressions stay,
without their run).
"""

from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet

from common.constants import HQEStatus, JobStatus
from common.models import HostQueueEntry, Job
from common.purge import BatchHook, PurgeReport, purge_in_batches
from master import audit
from master.models import AuditRecord, AuditTarget
from master.results.models import TestEntry, TestRun
from master.timeline.models import Interval


def old_jobs(cutoff: datetime) -> QuerySet[Job]:
    return (
        Job.objects.filter(created_on__lt=cutoff)
        .exclude(status__in=JobStatus.ACTIVE)
        .exclude(hqes__status__in=HQEStatus.ACTIVE)
        .exclude(hqes__finished_on__gte=cutoff)
        # A suite's children still running read their parent's keyvals (the heartbeat's suite_keyvals),
        # and a child kept keeps its link: the parent goes with (or after) its last child.
        .exclude(children__status__in=JobStatus.ACTIVE)
        .exclude(children__created_on__gte=cutoff)
        .exclude(children__hqes__finished_on__gte=cutoff)
    )


def old_host_intervals(cutoff: datetime) -> QuerySet[Interval]:
    """Cleaning, repair and Repair Failed stretches (no job) that ended before the cutoff."""
    return Interval.objects.filter(job__isnull=True, end__lt=cutoff)


def _job_rows(jobs: QuerySet[Job]) -> dict[str, int]:
    return {
        "jobs": jobs.count(),
        "HQEs": HostQueueEntry.objects.filter(job__in=jobs).count(),
        "job intervals": Interval.objects.filter(job__in=jobs).count(),
    }


@transaction.atomic
def delete_jobs(ids: list[int], cutoff: datetime) -> dict[str, int]:
    """One batch: the jobs among `ids` still old and finished, their HQEs and intervals. Their
    benchmark results stay (unlinked); `--results` removes results by their own age."""
    ids = list(old_jobs(cutoff).filter(id__in=ids).values_list("id", flat=True))
    intervals = Interval.objects.filter(job_id__in=ids).delete()[0]
    _, by_model = Job.objects.filter(id__in=ids).delete()
    return {
        "jobs": by_model.get(Job._meta.label, 0),
        "HQEs": by_model.get(HostQueueEntry._meta.label, 0),
        "job intervals": intervals,
    }


@transaction.atomic
def delete_host_intervals(ids: list[int], cutoff: datetime) -> dict[str, int]:
    return {"host intervals": old_host_intervals(cutoff).filter(id__in=ids).delete()[0]}


@transaction.atomic
def delete_audit(ids: list[int], cutoff: datetime) -> dict[str, int]:
    _, by_model = AuditRecord.objects.filter(id__in=ids, at__lt=cutoff).delete()
    return {
        "audit records": by_model.get(AuditRecord._meta.label, 0),
        "audit targets": by_model.get(AuditTarget._meta.label, 0),
    }


@transaction.atomic
def delete_results(ids: list[int], cutoff: datetime) -> dict[str, int]:
    _, by_model = TestRun.objects.filter(id__in=ids, created_on__lt=cutoff).delete()
    return {"results": by_model.get(TestRun._meta.label, 0), "result entries": by_model.get(TestEntry._meta.label, 0)}


def purge(
    cutoff: datetime,
    *,
    results: bool = False,
    dry_run: bool = False,
    batch_size: int,
    on_batch: BatchHook | None = None,
) -> PurgeReport:
    """Deletes (or counts, on a dry run) the master's history older than `cutoff`, batch by batch;
    a real purge ends with one audit record of what it deleted."""
    report = PurgeReport(dry_run=dry_run)
    purge_in_batches(
        report,
        "jobs",
        lambda: old_jobs(cutoff),
        lambda ids: delete_jobs(ids, cutoff),
        lambda: _job_rows(old_jobs(cutoff)),
        batch_size=batch_size,
        on_batch=on_batch,
    )
    purge_in_batches(
        report,
        "host intervals",
        lambda: old_host_intervals(cutoff),
        lambda ids: delete_host_intervals(ids, cutoff),
        lambda: {"host intervals": old_host_intervals(cutoff).count()},
        batch_size=batch_size,
        on_batch=on_batch,
    )
    if results:
        old_runs = TestRun.objects.filter(created_on__lt=cutoff)
        purge_in_batches(
            report,
            "results",
            lambda: old_runs,
            lambda ids: delete_results(ids, cutoff),
            lambda: {"results": old_runs.count(), "result entries": TestEntry.objects.filter(run__in=old_runs).count()},
            batch_size=batch_size,
            on_batch=on_batch,
        )
    old_audit = AuditRecord.objects.filter(at__lt=cutoff)
    purge_in_batches(
        report,
        "audit records",
        lambda: old_audit,
        lambda ids: delete_audit(ids, cutoff),
        lambda: {
            "audit records": old_audit.count(),
            "audit targets": AuditTarget.objects.filter(record__in=old_audit).count(),
        },
        batch_size=batch_size,
        on_batch=on_batch,
    )
    if not dry_run:
        with transaction.atomic():
            audit.record(
                "database.purge",
                acting_user=None,
                details={"older_than": cutoff.isoformat(), "results": results, "deleted": dict(report.deleted)},
            )
    return report
