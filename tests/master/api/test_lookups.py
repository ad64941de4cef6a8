"""What people look up through the REST API: a host's current and last runs, a shard's counts and
outbox, who a token speaks for, and the tokens (for those the admin lets manage them)."""

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from common.constants import HQEStatus
from common.models import HostQueueEntry, Shard
from master import services
from master.models import AuditRecord, Token
from master.services.lookups import RECENT_RUNS
from tests.fleet_state import snapshot
from tests.master.api.conftest import client_for
from tests.support import assert_status, tokens_just_used


def finished(job, status=HQEStatus.COMPLETED, **more):
    now = timezone.now()
    HostQueueEntry.objects.filter(job=job).update(status=status, started_on=now, finished_on=now, **more)


def test_host_detail_shows_the_current_run_and_the_last_ones_newest_first(fleet, staff):
    jobs = [fleet.job(f"j{i}", hosts=["a1"], meta_hosts=[]) for i in range(RECENT_RUNS + 2)]
    for job in jobs[:-1]:
        finished(job)
    finished(jobs[0], HQEStatus.FAILED, failure="test", exit_code=2)
    HostQueueEntry.objects.filter(job=jobs[-1]).update(status=HQEStatus.RUNNING)
    body = staff.get("/api/v1/hosts/a1/").json()
    (now,) = body["running"]
    assert (now["job"], now["job_name"], now["status"]) == (jobs[-1].id, f"j{RECENT_RUNS + 1}", "Running")
    assert len(body["recent_runs"]) == RECENT_RUNS
    assert [r["job"] for r in body["recent_runs"]] == [jobs[0].id, *(j.id for j in reversed(jobs[1:-1]))][:RECENT_RUNS]
    assert staff.get("/api/v1/hosts/a2/").json()["running"] == []


@pytest.mark.parametrize("runs", [0, 30])
def test_host_detail_query_count_is_pinned(fleet, staff, django_assert_num_queries, runs):
    for i in range(runs):
        finished(fleet.job(f"j{i}", hosts=["a1"], meta_hosts=[]))
    tokens_just_used()
    with django_assert_num_queries(8):  # as many for 30 runs as for none
        assert_status(staff.get("/api/v1/hosts/a1/"), 200)


def test_shard_detail_counts_hosts_and_jobs_by_status_and_shows_the_outbox(fleet, staff, django_assert_num_queries):
    fleet.job()
    finished(fleet.job("done"))
    Shard.objects.filter(id=fleet.lab1.id).update(outbox_depth=7)
    tokens_just_used()
    with django_assert_num_queries(7):  # token, shard check, shard, labels, hosts, hosts by status, jobs by status
        body = staff.get("/api/v1/shards/lab1/").json()
    assert body["outbox_depth"] == 7 and body["hosts_by_status"] == {"Ready": 3}
    assert sum(body["jobs_by_status"].values()) == 2
    assert staff.get("/api/v1/shards/lab2/").json()["outbox_depth"] is None


def test_whoami(fleet, user):
    body = user.get("/api/v1/whoami/").json()
    assert (body["username"], body["is_staff"], body["is_superuser"]) == ("ana", False, False)
    assert [t["user"] for t in body["tokens"]] == ["ana"]


def test_tokens_create_list_and_revoke_for_admins(fleet, staff):
    mine = staff.post("/api/v1/tokens/", {"description": "ci"}, format="json")
    assert_status(mine, 201)
    assert mine.json()["token"].startswith(mine.json()["prefix"])
    shard = staff.post("/api/v1/tokens/", {"shard": "lab1"}, format="json").json()
    assert (shard["kind"], shard["shard"], shard["user"]) == ("shard", "lab1", None)
    listed = staff.get("/api/v1/tokens/").json()["results"]
    assert {mine.json()["id"], shard["id"]} <= {t["id"] for t in listed}
    assert all("token" not in t for t in listed)
    assert_status(staff.delete(f"/api/v1/tokens/{shard['id']}/"), 204)
    assert not Token.objects.filter(id=shard["id"]).exists()
    assert AuditRecord.objects.filter(action="token.revoke").count() == 1
    assert staff.delete(f"/api/v1/tokens/{shard['id']}/").json()["error"] == f"unknown token {shard['id']}"
    assert_status(staff.delete("/api/v1/tokens/x/"), 404)
    assert staff.post("/api/v1/tokens/", {"shard": "nosuch"}, format="json").json()["error"] == "unknown shard nosuch"


def test_tokens_need_the_admins_permissions(fleet, user):
    before = snapshot(), Token.objects.count()
    assert_status(user.get("/api/v1/tokens/"), 403)
    assert_status(user.post("/api/v1/tokens/", {}, format="json"), 403)
    ana = User.objects.get(username="ana")
    ana.is_staff = True
    ana.save()
    ana.user_permissions.add(Permission.objects.get(codename="add_token"))
    refused = user.post("/api/v1/tokens/", {"shard": "lab1"}, format="json")
    assert_status(refused, 403)
    assert "common.change_shard" in refused.json()["error"]
    assert (snapshot(), Token.objects.count()) == before
    assert_status(user.post("/api/v1/tokens/", {}, format="json"), 201)


def test_a_shard_token_cannot_list_tokens(fleet):
    _, raw = services.create_shard_token("lab1", acting_user=None)
    assert_status(client_for(raw).get("/api/v1/tokens/"), 401)
