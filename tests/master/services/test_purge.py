"""`manage.py purge` on the master: what goes, what stays, in batches, and a dry run that changes nothing."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from common.constants import HQEStatus, JobStatus
from common.models import Host, HostQueueEntry, Job, Shard
from master.models import AuditRecord, AuditTarget
from master.notify.models import Delivery, NotificationEvent, Subscription
from master.results.models import TestEntry, TestRun
from master.services.purge import purge
from master.timeline.models import Interval, IntervalKind
from tests.fuzz.checksum import database_checksum

NOW = timezone.now()


def ago(days: float):
    return NOW - timedelta(days=days)


def finished_job(name: str, days: float, *, hqes: int = 1, status: str = HQEStatus.COMPLETED, hqe_days=None) -> Job:
    """A job created `days` ago whose HQEs ran on a1 and ended `hqe_days` (default: the same) ago,
    each with its run interval."""
    host = Host.objects.get(hostname="a1")
    job_status = JobStatus.RUNNING if status in HQEStatus.ACTIVE else status
    job = Job.objects.create(name=name, owner="ana", command="true", shard=host.shard, status=job_status)
    Job.objects.filter(id=job.id).update(created_on=ago(days))
    end = ago(hqe_days if hqe_days is not None else days)
    for _ in range(hqes):
        active = status in HQEStatus.ACTIVE
        hqe = HostQueueEntry.objects.create(
            job=job, host=host, status=status, started_on=end, finished_on=None if active else end
        )
        Interval.objects.create(
            kind=IntervalKind.RUN, host=host, shard=host.shard, job=job, hqe=hqe, start=end, end=None if active else end
        )
    return job


def result_run(job: Job | None, days: float, test: str = "bench") -> TestRun:
    run = TestRun.objects.create(test=test, start=ago(days), format="tensorflow", digest=f"{test}{days}", job=job)
    TestRun.objects.filter(id=run.id).update(created_on=ago(days))
    TestEntry.objects.bulk_create(
        [TestEntry(run=run, test=test, entry=f"e{i}", start=ago(days), wall_time_s=1.0) for i in range(3)]
    )
    return run


def notifications() -> dict[str, list[int]]:
    """Deliveries ended long ago (delivered, given up), one ended lately, one still pending beside an
    old delivered one of the same event, and an old event not fanned out yet: the purge takes the first
    three deliveries and the two events left with none."""
    sub = Subscription.objects.create(url="https://hooks.example.org/x", events=["job.ended"], secret="s")

    def event(days: float, fanned_out: bool = True) -> NotificationEvent:
        return NotificationEvent.objects.create(kind="job.ended", created_on=ago(days), fanned_out=fanned_out)

    def delivery(e: NotificationEvent, status: str, days: float | None) -> Delivery:
        finished = ago(days) if days is not None else None
        return Delivery.objects.create(
            subscription=sub, event=e, status=status, created_on=e.created_on, finished_on=finished
        )

    old, failed, mixed, new = event(120), event(100), event(110), event(2)
    gone = [delivery(old, "delivered", 120), delivery(failed, "failed", 99), delivery(mixed, "delivered", 110)]
    kept = [delivery(mixed, "pending", None), delivery(new, "delivered", 1)]
    unfanned = event(130, fanned_out=False)
    return {
        "gone deliveries": [d.id for d in gone],
        "kept deliveries": [d.id for d in kept],
        "gone events": [old.id, failed.id],
        "kept events": [mixed.id, new.id, unfanned.id],
    }


@pytest.fixture
def history(fleet):
    """Old and new, finished and not: three old finished jobs are the only ones a 90-day purge takes."""
    AuditRecord.objects.update(at=ago(200))  # the fleet's own set-up records
    old = [finished_job("old-ok", 120, hqes=2), finished_job("old-fail", 100, status=HQEStatus.FAILED)]
    old.append(finished_job("old-aborted", 95, status=HQEStatus.ABORTED))
    kept = [
        finished_job("new", 10),
        finished_job("old-but-running", 120, status=HQEStatus.RUNNING),
        finished_job("old-ended-lately", 120, hqe_days=5),
    ]
    parent = finished_job("old-parent-of-running", 120)
    Job.objects.filter(id=kept[1].id).update(parent=parent)
    kept.append(parent)
    host = Host.objects.get(hostname="a2")
    Interval.objects.create(kind=IntervalKind.REPAIRING, host=host, start=ago(150), end=ago(149))
    Interval.objects.create(kind=IntervalKind.REPAIR_FAILED, host=host, start=ago(149), end=None)
    Interval.objects.create(kind=IntervalKind.CLEANING, host=host, start=ago(1), end=ago(1))
    runs = {"old-job": result_run(old[0], 120), "old-alone": result_run(None, 100, "solo"), "new": result_run(None, 1)}
    return {"old": old, "kept": kept, "runs": runs, "notifications": notifications()}


def run_purge(*args: str) -> str:
    out = StringIO()
    call_command("purge", *args, stdout=out)
    return out.getvalue()


def test_purge_deletes_old_finished_jobs_with_their_hqes_intervals_and_audit(history):
    audit_before = AuditRecord.objects.count()
    out = run_purge("--older-than", "90d")
    assert Job.objects.filter(id__in=[j.id for j in history["old"]]).count() == 0
    assert set(Job.objects.values_list("name", flat=True)) == {
        "new",
        "old-but-running",
        "old-ended-lately",
        "old-parent-of-running",
    }
    assert HostQueueEntry.objects.filter(job__name__startswith="old-").count() == 3
    assert not Interval.objects.filter(kind=IntervalKind.REPAIRING).exists()
    assert Interval.objects.filter(kind=IntervalKind.REPAIR_FAILED).exists(), "an open interval is never purged"
    assert Interval.objects.filter(kind=IntervalKind.CLEANING).exists()
    assert Interval.objects.filter(kind=IntervalKind.RUN).count() == 4
    # Only the purge's own record is left of the old trail, saying what it deleted.
    [record] = AuditRecord.objects.all()
    assert record.action == "database.purge" and record.details["deleted"]["jobs"] == 3
    assert audit_before > 1 and not AuditTarget.objects.exclude(record=record).exists()
    assert (
        "deleted 3 jobs, 4 HQEs, 4 job intervals, 1 host intervals, 3 notification deliveries, 2 notification events"
        in out
    )
    sent = history["notifications"]
    assert sorted(Delivery.objects.values_list("id", flat=True)) == sent["kept deliveries"]
    assert sorted(NotificationEvent.objects.values_list("id", flat=True)) == sorted(sent["kept events"])
    # Benchmark results are kept, only unlinked from the purged job.
    kept = TestRun.objects.get(id=history["runs"]["old-job"].id)
    assert kept.job_id is None and kept.entries.count() == 3


def test_a_suite_parent_stays_while_a_child_is_kept_and_goes_with_its_children(history):
    """A suite whose parent ended long ago while a child ran on: the child, kept, keeps its parent."""
    parent = finished_job("old-suite", 120)
    late = finished_job("child-ended-lately", 119, hqe_days=5)
    early = finished_job("child-ended-early", 119)
    Job.objects.filter(id__in=[late.id, early.id]).update(parent=parent)
    run_purge("--older-than", "90d")
    assert Job.objects.get(id=late.id).parent_id == parent.id
    assert not Job.objects.filter(id=early.id).exists()
    Shard.objects.update(last_heartbeat=NOW)  # heard from since: no results of theirs still on the way
    run_purge("--older-than", "4d")
    assert not Job.objects.filter(id__in=[parent.id, late.id]).exists()


def test_purge_with_results_deletes_old_benchmark_results_too(history):
    out = run_purge("--older-than", "90d", "--results")
    assert list(TestRun.objects.values_list("id", flat=True)) == [history["runs"]["new"].id]
    assert TestEntry.objects.count() == 3
    assert "2 results, 6 result entries" in out


def test_dry_run_counts_what_a_purge_deletes_and_changes_nothing(history, django_db_blocker):
    before = database_checksum()
    dry = run_purge("--older-than", "90d", "--results", "--dry-run")
    assert database_checksum() == before
    real = run_purge("--older-than", "90d", "--results")
    counts = real.split(": deleted ", 1)[1].split(" in ")[0]
    assert dry.split(": would delete ", 1)[1].strip() == counts


def test_purge_works_in_batches_each_its_own_transaction(history):
    seen: list[tuple[str, list[int]]] = []

    def stop_after_first(kind: str, ids: list[int]) -> None:
        seen.append((kind, ids))
        raise RuntimeError("killed after the first batch")

    with pytest.raises(RuntimeError):
        purge(ago(90), batch_size=1, on_batch=stop_after_first)
    [(kind, [first])] = seen
    assert kind == "jobs" and first == history["old"][0].id
    assert not Job.objects.filter(id=first).exists(), "the first batch was committed on its own"
    assert Job.objects.filter(id__in=[j.id for j in history["old"][1:]]).count() == 2
    report = purge(ago(90), batch_size=2)
    assert report.batches["jobs"] == 1 and report.deleted["jobs"] == 2
    assert report.batches["audit records"] >= 1


def test_purge_prints_each_batch_when_asked(history):
    out = run_purge("--older-than", "90d", "--batch-size", "1", "-v", "2")
    assert out.count("jobs: deleted a batch of 1") == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--older-than", "90"], "--older-than must be a positive whole number and a unit"),
        (["--older-than", "0d"], "not '0d'"),
        (["--older-than=-5d"], "not '-5d'"),
        (["--older-than", "3 months"], "not '3 months'"),
        (["--older-than", "999999w"], "--older-than must be at most 100 years, not '999999w'"),
        (["--older-than", "90d", "--batch-size", "0"], "--batch-size must be between 1 and 10000, not 0"),
        (["--older-than", "90d", "--batch-size", "10001"], "--batch-size must be between 1 and 10000, not 10001"),
    ],
)
def test_bad_input_is_refused_by_name_and_changes_nothing(history, args, message):
    before = database_checksum()
    with pytest.raises(CommandError, match=message):
        call_command("purge", *args)
    assert database_checksum() == before


def test_purge_of_an_empty_history_deletes_nothing(db):
    assert "deleted nothing in 0 batches" in run_purge("--older-than", "1d")


def test_a_batch_of_notification_rows_costs_a_fixed_number_of_queries(history, django_assert_num_queries):
    from master.services.purge import delete_deliveries, delete_events, old_deliveries, old_events

    cutoff = ago(90)
    ids = list(old_deliveries(cutoff).values_list("id", flat=True))
    # SAVEPOINT, the DELETE of the batch (still old and ended), RELEASE.
    with django_assert_num_queries(3):
        assert delete_deliveries(ids, cutoff) == {"notification deliveries": 3}
    ids = list(old_events(cutoff).values_list("id", flat=True))
    # SAVEPOINT, the events still old and left with no delivery, their deliveries (none), the DELETE, RELEASE.
    with django_assert_num_queries(5):
        assert delete_events(ids, cutoff) == {"notification events": 2}
