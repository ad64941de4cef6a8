"""The audit trail through the REST API: changes record the signed-in user; GET /api/v1/audit/ reads them."""

from datetime import timedelta

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from common.models import Host
from master import services
from master.models import AuditRecord
from tests.support import assert_status


def test_a_change_through_the_api_records_the_signed_in_user(fleet, staff):
    resp = staff.post("/api/v1/hosts/lock/", {"hostnames": ["a1"], "reason": "bad battery"}, format="json")
    assert_status(resp, 200)
    entry = AuditRecord.objects.order_by("-id").first()
    assert (entry.user.username, entry.actor, entry.action, entry.reason) == (
        "boss",
        "boss",
        "host.lock",
        "bad battery",
    )
    assert [(t.kind, t.object_id, t.name) for t in entry.targets.all()] == [
        ("host", Host.objects.get(hostname="a1").id, "a1")
    ]


def test_a_job_submitted_by_a_user_is_recorded_as_theirs(fleet, user):
    resp = user.post(
        "/api/v1/jobs/",
        {"name": "x", "command": "true", "meta_hosts": ["board:a*2"], "priority": "high"},
        format="json",
    )
    assert_status(resp, 201)
    entry = AuditRecord.objects.get(action="job.create")
    assert entry.actor == "ana" and entry.details["priority"] == 70 and entry.details["meta_hosts"] == [["board:a", 2]]


def test_a_refused_change_through_the_api_writes_no_record(fleet, staff):
    before = AuditRecord.objects.count()
    resp = staff.post("/api/v1/shards/lab1/add_labels/", {"labels": ["wifi", "board:b"]}, format="json")
    assert_status(resp, 409)
    assert resp.json()["error"] == "label board:b already belongs to shard lab2"
    resp = staff.post("/api/v1/hosts/lock/", {"hostnames": ["a1", "nope"], "reason": "x"}, format="json")
    assert_status(resp, 404)
    assert AuditRecord.objects.count() == before


def _list(client, **params):
    resp = client.get("/api/v1/audit/", params)
    assert_status(resp, 200)
    return resp.json()


def test_the_list_is_newest_first_with_the_cli_fields(fleet, staff, user):
    services.lock_hosts(["a1"], "r1", acting_user=None)
    services.unlock_hosts(["a1"], acting_user=None)
    page = _list(user, limit=2)
    assert page["count"] == AuditRecord.objects.count() and page["next"]
    first = page["results"][0]
    assert set(first) == {"id", "at", "user", "action", "targets", "reason", "details"}
    assert (first["action"], first["user"], first["targets"]) == (
        "host.unlock",
        "system",
        [{"kind": "host", "id": Host.objects.get(hostname="a1").id, "name": "a1"}],
    )
    assert page["results"][1]["action"] == "host.lock" and page["results"][1]["reason"] == "r1"


def test_filters_by_host_job_user_and_since(fleet, staff, user):
    boss = User.objects.get(username="boss")
    services.lock_hosts(["a2"], "old", acting_user=boss)
    AuditRecord.objects.filter(action="host.lock").update(at=timezone.now() - timedelta(days=3))
    services.lock_hosts(["a1", "a2"], "new", acting_user=boss)
    job = fleet.job()
    services.abort_jobs([job.id], acting_user=None)

    def actions(**params):
        return [(r["action"], r["reason"]) for r in _list(user, **params)["results"]]

    assert actions(host="a2") == [("host.lock", "new"), ("host.create", ""), ("host.lock", "old")]
    assert actions(host="a2", since="24h") == [("host.lock", "new"), ("host.create", "")]
    assert actions(host="a2", since=(timezone.now() - timedelta(days=4)).isoformat()) == actions(host="a2")
    assert actions(job=str(job.id)) == [("job.abort", ""), ("job.create", "")]
    assert actions(user="boss") == [("host.lock", "new"), ("host.lock", "old")]
    assert actions(user="nobody") == []
    assert actions(host="gone-host") == []


def test_a_deleted_hosts_changes_stay_findable_by_name(fleet, staff):
    assert_status(staff.delete("/api/v1/hosts/c1/"), 204)
    assert [r["action"] for r in _list(staff, host="c1")["results"]] == ["host.delete", "host.create"]


def test_bad_filters_are_named(fleet, staff):
    for params, message in [
        ({"since": "yesterday"}, "invalid since 'yesterday': use an ISO time"),
        ({"job": "abc"}, "invalid job id 'abc': use a positive integer"),
        ({"job": "0"}, "invalid job id '0'"),
        ({"since": "999999w"}, "invalid since '999999w': it is before year 1"),
        ({"since": "9999-12-31T23:59:59-14:00"}, "invalid since '9999-12-31T23:59:59-14:00': it is before year 1"),
    ]:
        resp = staff.get("/api/v1/audit/", params)
        assert_status(resp, 400)
        assert resp.json()["error"].startswith(message), resp.json()


def test_the_trail_is_read_only_and_needs_a_sign_in(fleet, staff, anonymous):
    assert_status(anonymous.get("/api/v1/audit/"), 401)
    unchecked = APIClient()  # the schema has no POST here, which is the point
    unchecked.credentials(**staff._credentials)
    resp = unchecked.post("/api/v1/audit/", {}, format="json")
    assert_status(resp, 403)
    assert resp.json()["error"] == "this change is not allowed through the API"
    assert_status(unchecked.get("/api/v1/audit/1/"), 404)


def test_the_list_costs_a_fixed_number_of_queries(fleet, staff, django_assert_num_queries):
    services.lock_hosts(["a1", "a2", "a3"], "x", acting_user=None)
    _list(staff)  # the token's first use is written once; later requests only read it
    # The token with its user (none when cached: tests/master/access/test_token_cache.py); the count;
    # the page; the targets of the page's records.
    with django_assert_num_queries(4):
        small = _list(staff, limit=2)
    for _ in range(20):
        services.unlock_hosts(["a1", "a2"], acting_user=None)
    with django_assert_num_queries(4):
        big = _list(staff, limit=20)
    assert len(small["results"]) == 2 and len(big["results"]) == 20


def test_a_host_that_changed_shard_finds_the_change_that_moved_it(fleet, staff):
    """`audit list --host c1` answers "why is c1 on this shard?": the shard change that moved it names it."""
    services.create_shard("lab3", ["board:c"], acting_user=None)
    services.remove_label_from_shard("lab3", "board:c", acting_user=None)
    services.add_labels_to_shard("lab3", ["board:c"], acting_user=None)
    services.add_labels_to_shard("lab3", ["pool:x"], acting_user=None)  # c1 has no pool:x: not named
    assert [r["action"] for r in _list(staff, host="c1")["results"]] == [
        "shard.add_labels",
        "shard.remove_label",
        "shard.create",
        "host.create",
    ]
