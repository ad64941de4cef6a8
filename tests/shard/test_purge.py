"""`manage.py purge` on a shard: its own finished jobs and dead letters, never what the master has not acked."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from common.constants import HQEStatus
from common.models import HostQueueEntry, Job
from shard.metrics import ShardCollector
from shard.models import DeadLetter, OutboxEntry, Run
from shard.sync.client import HeartbeatClient
from tests.fuzz.checksum import database_checksum

NOW = timezone.now()


def ago(days: float):
    return NOW - timedelta(days=days)


def shard_job(name: str, days: float, status: str = HQEStatus.COMPLETED, ended_days: float | None = None) -> Job:
    job = Job.objects.create(name=name, owner="ana", command="true")
    Job.objects.filter(id=job.id).update(created_on=ago(days))
    active = status in HQEStatus.ACTIVE
    end = None if active else ago(ended_days if ended_days is not None else days)
    hqe = HostQueueEntry.objects.create(job=job, status=status, finished_on=end)
    Run.objects.create(hqe=hqe, runner="r", results_dir="/x")
    return job


@pytest.fixture
def shard_history(db, settings):
    settings.ROLE = "shard"
    old = shard_job("old", 100)
    unacked = shard_job("old-unacked", 100, HQEStatus.FAILED)
    OutboxEntry.objects.create(seq=1, hqe_id=unacked.hqes.get().id, job_id=unacked.id, payload={})
    running = shard_job("old-running", 100, HQEStatus.RUNNING)
    lately = shard_job("old-ended-lately", 100, ended_days=1)
    new = shard_job("new", 1)
    for days in (100, 1):
        letter = DeadLetter.objects.create(seq=1, hqe_id=1, job_id=1, payload={}, error="no")
        DeadLetter.objects.filter(id=letter.id).update(created_on=ago(days))
    return {"old": old, "kept": [unacked, running, lately, new]}


def run_purge(*args: str) -> str:
    out = StringIO()
    call_command("purge", *args, stdout=out)
    return out.getvalue()


def test_shard_purge_keeps_active_unacked_and_recent_jobs(shard_history):
    out = run_purge("--older-than", "90d")
    assert "purge on the shard" in out and "deleted 1 jobs, 1 HQEs, 1 dead letters in 2 batches" in out
    assert not Job.objects.filter(id=shard_history["old"].id).exists()
    assert not Run.objects.filter(hqe__job_id=shard_history["old"].id).exists()
    assert set(Job.objects.values_list("id", flat=True)) == {j.id for j in shard_history["kept"]}
    assert DeadLetter.objects.count() == 1 and OutboxEntry.objects.count() == 1


def test_shard_dry_run_changes_nothing_and_counts_the_same(shard_history):
    before = database_checksum()
    assert "would delete 1 jobs, 1 HQEs, 1 dead letters" in run_purge("--older-than", "90d", "--dry-run")
    assert database_checksum() == before


def test_shard_purge_goes_batch_by_batch(shard_history):
    for n in range(4):
        shard_job(f"more-{n}", 120)
    out = run_purge("--older-than", "90d", "--batch-size", "2", "-v", "2")
    assert out.count("jobs: deleted a batch of 2") == 2 and out.count("jobs: deleted a batch of 1") == 1
    assert "deleted 5 jobs, 5 HQEs, 1 dead letters in 4 batches" in out


def test_a_short_age_keeps_jobs_whose_results_may_still_be_uploaded(shard_history, settings):
    """A restarted uploader finds runs with files to send by their records, retention + grace back."""
    settings.FLEETSHARD_RESULTS_RETENTION_DAYS = 5
    settings.FLEETSHARD_RESULTS_UPLOAD_GRACE_DAYS = 5
    within = shard_job("ended-9-days-ago", 20, ended_days=9)
    beyond = shard_job("ended-11-days-ago", 20, ended_days=11)
    out = run_purge("--older-than", "3d")
    assert Job.objects.filter(id=within.id).exists() and Run.objects.filter(hqe__job=within).exists()
    assert not Job.objects.filter(id__in=[beyond.id, shard_history["old"].id]).exists()
    assert "deleted 2 jobs, 2 HQEs, 1 dead letters" in out


def run_counters() -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ShardCollector(HeartbeatClient("http://127.0.0.1:1", "lab", "t"), "lab"))
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name in ("fleetshard_shard_runs_started_total", "fleetshard_shard_runs_ended_total")
    }


def test_the_metrics_run_counters_never_drop_when_the_purge_deletes_history(shard_history):
    """Prometheus reads a counter that went down as a restart from zero: a spike of every run kept."""
    HostQueueEntry.objects.update(started_on=ago(100))
    for n in range(3):
        shard_job(f"failed-{n}", 120, HQEStatus.FAILED)
    HostQueueEntry.objects.filter(job__name="failed-0").update(failure="infra", started_on=ago(120))
    before = run_counters()
    assert before[("fleetshard_shard_runs_ended_total", (("outcome", "Failed"), ("shard", "lab")))] == 3
    run_purge("--older-than", "90d", "--batch-size", "2")
    assert Job.objects.filter(name__startswith="failed-").count() == 0
    assert run_counters() == before
    run_purge("--older-than", "90d")  # nothing left to delete: nothing counted twice
    assert run_counters() == before


def test_results_are_a_master_option(shard_history):
    before = database_checksum()
    with pytest.raises(CommandError, match="--results is for the master"):
        call_command("purge", "--older-than", "90d", "--results")
    assert database_checksum() == before
