"""Issue 23, low findings: the master's purge keeps a job whose results may still be on their way
(its shard not heard from since the run ended), and a purge racing a result upload or a log append
fails neither with an IntegrityError: the upload's hold on the HQE (master/services/hqe_guard.py) makes the
purge wait, and what the upload wrote is unlinked or deleted with the job."""

from datetime import timedelta

import pytest

from common.models import HostQueueEntry, Job, Shard
from master.logs.models import RunLog
from master.logs.store import append_log
from master.results.ingest import store_result_file
from master.results.models import TestRun
from master.services.purge import RESULTS_SETTLE, purge
from tests.master.results.factories import tf_file
from tests.master.services.test_purge import NOW, ago, finished_job, run_purge
from tests.support import assert_waits_for


def test_a_job_whose_shard_was_not_heard_from_since_it_ended_is_kept_until_it_is(fleet, settings):
    settings.FLEETSHARD_RESULTS_UPLOAD_HORIZON_DAYS = 60
    job = finished_job("ended-5d", 6, hqe_days=5)
    ended = HostQueueEntry.objects.get(job=job).finished_on
    for heard, kept in [
        (None, True),  # never heard from: its uploader may hold the results
        (ended + RESULTS_SETTLE - timedelta(minutes=1), True),  # heard from, but too soon after
        (ended + RESULTS_SETTLE, False),  # heard from long enough after: settled
    ]:
        Shard.objects.filter(id=job.shard_id).update(last_heartbeat=heard)
        run_purge("--older-than", "4d")
        assert Job.objects.filter(id=job.id).exists() is kept, heard


def test_a_silent_shards_job_goes_past_the_upload_horizon_and_a_deleted_shards_at_once(fleet, settings):
    settings.FLEETSHARD_RESULTS_UPLOAD_HORIZON_DAYS = 60
    past = finished_job("ended-70d", 71, hqe_days=70)
    orphan = finished_job("ended-5d", 6, hqe_days=5)
    Job.objects.filter(id=orphan.id).update(shard=None)
    run_purge("--older-than", "4d")
    assert not Job.objects.filter(id__in=[past.id, orphan.id]).exists()


@pytest.mark.postgres_only
@pytest.mark.parametrize("what", ["result", "log"])
def test_a_purge_racing_an_upload_or_a_log_append_waits_and_fails_neither(fleet_committed, what):
    job = finished_job("old", 120)
    Shard.objects.filter(id=job.shard_id).update(last_heartbeat=NOW)
    hqe = HostQueueEntry.objects.select_related("host", "job").get(job=job)

    def upload() -> None:
        if what == "log":
            append_log(hqe.id, 0, b"line\n")
        else:
            store_result_file(tf_file("raced", ago(120), {"e": 1.0}), "r.json", hqe=hqe, acting_user=None)

    assert_waits_for(upload, lambda: purge(ago(90), batch_size=100), "the purge waits for the upload holding the HQE")
    assert not Job.objects.filter(id=job.id).exists() and not RunLog.objects.exists()
    if what == "result":
        (run,) = TestRun.objects.filter(test="raced")
        assert (run.hqe_id, run.job_id) == (None, None)
