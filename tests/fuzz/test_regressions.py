"""Defects the fuzz suites found, each pinned by the smallest request that showed it."""

import json

import pytest

from common.models import Host
from master import services
from tests.conftest import Fleet, Heartbeat
from tests.fuzz.checksum import database_checksum
from tests.master.api.conftest import client_for
from tests.support import assert_status


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
    assert_status(resp, 400)
    assert resp.json()["detail"]["field"] == f"{key}[1].id"
    assert "listed twice" in resp.json()["error"]
    assert database_checksum() == before


@pytest.mark.parametrize(
    "priority",
    ["99999_99999_99999_99999_99999", "-2_147_483_649", "2147483648", "٣", "²", "1_0", "9" * 5000],
)
def test_a_priority_out_of_range_or_not_in_ascii_digits_is_a_400(fleet: Fleet, priority: str) -> None:
    """Found by probing what the REST fuzzing's generator rarely draws (integers spelt with '_'): int()
    takes '1_0' and '٣', and '99999_99999_...' went to the database as is, a 500 (SQLite: "Python int
    too large"; PostgreSQL: "integer out of range"); '²' and 5000 nines made the serializer's int() raise,
    a 500. master/services/ and master/api/serializers.py (input rules, another branch)."""
    staff = client_for(services.create_personal_token("boss", admin=True, acting_user=None)[1])
    before = database_checksum()
    resp = staff.post(
        "/api/v1/jobs/",
        {"name": "x", "command": "true", "meta_hosts": ["board:a"], "priority": priority},
        format="json",
    )
    assert_status(resp, 400)
    assert "priority" in json.dumps(resp.json())
    assert database_checksum() == before


@pytest.mark.parametrize("meta_host", ["board:a*100000", "board:a*" + "9" * 290, "board:a*1_0", "board:a*٣"])
def test_a_meta_host_count_too_large_or_not_in_ascii_digits_is_a_400(fleet: Fleet, meta_host: str) -> None:
    """Found by probing the job-create bodies of the REST fuzzing: `board:a*100000` made a job of 100,000
    HQEs (90 s of inserts for one request; 290 nines would never end), and '1_0' or '٣' were counts.
    master/services/ (input rules, another branch: max HQEs per job, counts in digits only)."""
    staff = client_for(services.create_personal_token("boss", admin=True, acting_user=None)[1])
    before = database_checksum()
    resp = staff.post("/api/v1/jobs/", {"name": "x", "command": "true", "meta_hosts": [meta_host]}, format="json")
    assert_status(resp, 400)
    assert resp.json()["detail"]["field"] == "meta_hosts"
    assert database_checksum() == before


@pytest.mark.parametrize("method, path", [("get", "/api/v1/jobs/³/"), ("post", "/api/v1/jobs/³/abort/")])
def test_a_job_id_in_other_digits_is_a_404(fleet: Fleet, method: str, path: str) -> None:
    """Found by `make fuzz` (schemathesis, POST /api/v1/jobs/{id}/abort/): '³'.isdigit() is true but int('³')
    raises, so the id '³' was a 500. master/api/views.py (JobViewSet.get_object; REST, another branch)."""
    staff = client_for(services.create_personal_token("boss", admin=True, acting_user=None)[1])
    resp = getattr(staff, method)(path)
    assert_status(resp, 404)
