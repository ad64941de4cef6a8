"""The shard's purge: its own finished jobs older than a cutoff (with their HQEs and run records), and
old dead letters. `manage.py purge` runs it on a shard's database.

A job goes only when none of its HQEs is active or ended after the cutoff and no update of it waits
in the outbox: the master no longer sends a finished job, so nothing brings it back, and nothing
the master has not acknowledged is lost. Nor while its runs may have result files still to send:
a restarted uploader finds them by their run records, as far back as the retention plus the upload
grace (shard/uploads/results.py), so a shorter --older-than keeps those jobs that long.

Each batch takes the shard's write lock (shard.locks), so a purge beside a running `run_shard` keeps
the one lock order. Run directories on disk have their own retention (FLEETSHARD_RESULTS_RETENTION_DAYS).
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, QuerySet
from django.utils import timezone

from common.constants import HQEStatus
from common.models import HostQueueEntry, Job
from common.purge import BatchHook, PurgeReport, purge_in_batches
from shard.locks import shard_write
from shard.metrics import outcome
from shard.models import DeadLetter, OutboxEntry, ShardState


def upload_horizon() -> datetime:
    """Runs that ended after this may still have result files to upload (ResultsUploader.find_ended)."""
    days = settings.FLEETSHARD_RESULTS_RETENTION_DAYS + settings.FLEETSHARD_RESULTS_UPLOAD_GRACE_DAYS
    return timezone.now() - timedelta(days=days)


def old_jobs(cutoff: datetime) -> QuerySet[Job]:
    return (
        Job.objects.filter(created_on__lt=cutoff)
        .exclude(hqes__status__in=HQEStatus.ACTIVE)
        .exclude(hqes__finished_on__gte=min(cutoff, upload_horizon()))
        .exclude(id__in=OutboxEntry.objects.values("job_id"))
    )


def delete_jobs(ids: list[int], cutoff: datetime) -> dict[str, int]:
    """One batch, under the write lock: the jobs among `ids` still old, with their HQEs and runs; what
    their runs were goes into the shard's tallies first (tally_purged_runs)."""
    with shard_write():
        jobs = old_jobs(cutoff).filter(id__in=ids)
        tally_purged_runs(HostQueueEntry.objects.filter(job__in=jobs))
        _, by_model = jobs.delete()
    return {"jobs": by_model.get(Job._meta.label, 0), "HQEs": by_model.get(HostQueueEntry._meta.label, 0)}


def tally_purged_runs(hqes: QuerySet[HostQueueEntry]) -> None:
    """Adds the ended HQEs about to be deleted to ShardState's tallies, so /metrics' run counters
    never drop (Prometheus takes a drop for a restart from zero: a spike of every run still kept)."""
    rows = hqes.values("status", "failure").annotate(n=Count("id"), s=Count("started_on")).order_by()
    state = ShardState.objects.get(id=1)
    ended = dict(state.purged_ended or {})
    for row in rows:
        state.purged_started += row["s"]
        key = outcome(row["status"], row["failure"])
        ended[key] = ended.get(key, 0) + row["n"]
    state.purged_ended = ended
    state.save(update_fields=["purged_started", "purged_ended"])


def delete_dead_letters(ids: list[int], cutoff: datetime) -> dict[str, int]:
    with shard_write():
        return {"dead letters": DeadLetter.objects.filter(id__in=ids, created_on__lt=cutoff).delete()[0]}


def purge(
    cutoff: datetime, *, dry_run: bool = False, batch_size: int, on_batch: BatchHook | None = None
) -> PurgeReport:
    report = PurgeReport(dry_run=dry_run)
    purge_in_batches(
        report,
        "jobs",
        lambda: old_jobs(cutoff),
        lambda ids: delete_jobs(ids, cutoff),
        lambda: {
            "jobs": old_jobs(cutoff).count(),
            "HQEs": HostQueueEntry.objects.filter(job__in=old_jobs(cutoff)).count(),
        },
        batch_size=batch_size,
        on_batch=on_batch,
    )
    old_letters = DeadLetter.objects.filter(created_on__lt=cutoff)
    purge_in_batches(
        report,
        "dead letters",
        lambda: old_letters,
        lambda ids: delete_dead_letters(ids, cutoff),
        lambda: {"dead letters": old_letters.count()},
        batch_size=batch_size,
        on_batch=on_batch,
    )
    return report
