"""Shared model behaviour: derived job status and the offline rule."""

from datetime import timedelta

import pytest
from django.utils import timezone

from common.constants import derive_job_status
from common.models import Shard


@pytest.mark.parametrize(
    "statuses, expected",
    [
        (["Queued", "Queued"], "Queued"),
        (["Queued", "Running"], "Running"),
        (["Completed", "Starting"], "Running"),
        (["Completed", "Completed"], "Completed"),
        (["Completed", "Failed"], "Failed"),
        (["Aborted", "Completed"], "Aborted"),
        (["Expired"], "Expired"),
    ],
)
def test_job_status_is_derived_from_its_hqes(statuses, expected):
    assert derive_job_status(statuses) == expected


def test_shard_silent_for_three_intervals_is_offline(settings):
    settings.FLEETSHARD_HEARTBEAT_INTERVAL_S = 10
    now = timezone.now()
    shard = Shard(hostname="lab", last_heartbeat=now - timedelta(seconds=29))
    assert shard.is_online(now)
    shard.last_heartbeat = now - timedelta(seconds=31)
    assert not shard.is_online(now) and shard.status == "offline"
    assert Shard(hostname="new").status == "offline"
