"""Two reports of one run's outputs at once (a shard that sends again before the first answer came)
and a report racing a purge of its job: neither fails with an IntegrityError (a 500)."""

import pytest

from common.models import HostQueueEntry, Job, Shard
from master.blobs.artifacts import OutputFile, record_artifacts
from master.blobs.models import Artifact
from master.services.purge import purge
from tests.master.services.test_purge import NOW, ago, finished_job
from tests.support import assert_waits_for

REPORT = [OutputFile("a.txt", 0, "", "a symbolic link: not followed"), OutputFile("b.txt", 0, "", "a fifo")]


@pytest.mark.postgres_only(reason="two transactions at once: SQLite has one writer")
def test_the_same_report_twice_at_once_is_recorded_once(fleet_committed):
    hqe = fleet_committed.job().hqes.get()
    assert_waits_for(
        lambda: record_artifacts(hqe.id, REPORT),
        lambda: record_artifacts(hqe.id, REPORT),
        "the second report waits for the first",
    )
    assert sorted(Artifact.objects.filter(hqe=hqe).values_list("path", flat=True)) == ["a.txt", "b.txt"]


@pytest.mark.postgres_only(reason="two transactions at once: SQLite has one writer")
def test_a_report_racing_a_purge_of_its_job_makes_the_purge_wait(fleet_committed):
    job = finished_job("old", 120)
    Shard.objects.filter(id=job.shard_id).update(last_heartbeat=NOW)
    hqe = HostQueueEntry.objects.get(job=job)
    assert_waits_for(
        lambda: record_artifacts(hqe.id, REPORT),
        lambda: purge(ago(90), batch_size=100),
        "the purge waits for the report holding the HQE",
    )
    assert not Job.objects.filter(id=job.id).exists() and not Artifact.objects.exists()
