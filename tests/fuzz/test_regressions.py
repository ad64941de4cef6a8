"""Defects the fuzz suites found, each pinned by the smallest request that showed it."""

import json

import pytest

from common.models import Host
from tests.conftest import Fleet, Heartbeat
from tests.fuzz.checksum import database_checksum


@pytest.mark.parametrize("key", ["known_hosts", "known_jobs"])
def test_a_host_or_job_listed_twice_is_a_400_that_changes_nothing(fleet: Fleet, heartbeat: Heartbeat, key: str) -> None:
    """Found by the heartbeat fuzz suite: `known_hosts` naming host a1 twice, as Cleaning and as Running,
    set either status (the bulk UPDATE joined both rows) and the same request sent again set the other,
    so a retried heartbeat changed the database. Now the body is refused, naming the second entry."""
    a1 = Host.objects.get(hostname="a1")
    job = fleet.job()
    entries = {
        "known_hosts": [
            {"id": a1.id, "version": 1, "status": "Cleaning"},
            {"id": a1.id, "version": 1, "status": "Running"},
        ],
        "known_jobs": [{"id": job.id, "version": 1}, {"id": job.id, "version": 2}],
    }
    before = database_checksum()
    resp = heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1, **{key: entries[key]})), fleet.token1)
    assert resp.status_code == 400
    assert resp.json()["detail"]["field"] == f"{key}[1].id"
    assert "listed twice" in resp.json()["error"]
    assert database_checksum() == before
