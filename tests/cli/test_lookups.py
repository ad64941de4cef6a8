"""What people look up: whoami, host stat's current and last runs, shard stat, and tokens for admins."""

import json
import re

import pytest
from django.utils import timezone

from common.constants import HQEStatus
from common.models import HostQueueEntry, Shard
from master.models import Token
from tests.cli.conftest import fails, ok

pytestmark = pytest.mark.django_db(transaction=True)


def test_whoami(cli, server, fleet):
    text = ok(cli("whoami")).stdout
    assert "User:       boss\nRoles:      staff, superuser\n" in text
    obj = json.loads(ok(cli("whoami", "--json", token=server.user_token)).stdout)
    assert (obj["username"], obj["is_staff"], obj["tokens"][0]["kind"]) == ("ana", False, "personal")
    assert server.user_token.startswith(obj["tokens"][0]["prefix"])


def test_host_stat_shows_the_current_job_and_the_last_runs(cli, fleet):
    done, running = fleet.job("done", hosts=["a1"], meta_hosts=[]), fleet.job("now", hosts=["a1"], meta_hosts=[])
    HostQueueEntry.objects.filter(job=done).update(
        status=HQEStatus.FAILED, failure="test", exit_code=3, started_on=timezone.now(), finished_on=timezone.now()
    )
    HostQueueEntry.objects.filter(job=running).update(status=HQEStatus.RUNNING, started_on=timezone.now())
    text = ok(cli("host", "stat", "a1")).stdout
    entry = HostQueueEntry.objects.get(job=running).id
    assert f"Running:      job {running.id} (now), entry {entry}, Running" in text
    assert "Last 1 runs:" in text
    assert re.search(rf"^{done.id}\s+done\s+\d+\s+Failed\s+test\s+3\s", text, re.M), text
    obj = json.loads(ok(cli("host", "stat", "a1", "--json")).stdout)
    assert [r["job"] for r in obj["running"]] == [running.id]
    assert [(r["job"], r["status"], r["exit_code"]) for r in obj["recent_runs"]] == [(done.id, "Failed", 3)]
    assert "Running:      nothing" in ok(cli("host", "stat", "a2")).stdout
    assert "No runs yet." in ok(cli("host", "stat", "a2")).stdout


def test_shard_stat(cli, fleet):
    fleet.job()
    Shard.objects.filter(hostname="lab1").update(last_heartbeat=timezone.now(), client_version="9.9", outbox_depth=4)
    text = ok(cli("shard", "stat", "lab1")).stdout
    for line in ("Status:          online", "Client version:  9.9", "Outbox:          4 updates waiting",
                 "Hosts:           3 Ready", "Jobs:            1 Queued"):  # fmt: skip
        assert line in text, text
    text = ok(cli("shard", "stat", "lab2")).stdout
    assert "Last heartbeat:  never" in text and "Outbox:          unknown" in text and "Jobs:            none" in text
    fails(cli("shard", "stat", "nosuch"), "Error: unknown shard nosuch")


def test_tokens_for_admins(cli, server, fleet):
    created = json.loads(ok(cli("token", "create", "-d", "ci", "--json")).stdout)
    assert (created["kind"], created["user"], created["description"]) == ("personal", "boss", "ci")
    ok(cli("whoami", token=created["token"]))
    text = ok(cli("token", "create", "--shard", "lab1")).stdout
    assert text.startswith("Created token ") and "for shard lab1 (FLEETSHARD_SHARD_TOKEN)" in text
    listed = json.loads(ok(cli("token", "list", "--json")).stdout)
    assert created["id"] in {t["id"] for t in listed} and all("token" not in t for t in listed)
    assert "shard lab1" in ok(cli("token", "list")).stdout
    assert ok(cli("token", "revoke", str(created["id"]))).stdout == f"Revoked tokens: {created['id']}\n"
    assert not Token.objects.filter(id=created["id"]).exists()
    fails(cli("whoami", token=created["token"]), "refused the token (unknown or revoked token)")
    fails(cli("token", "revoke", str(created["id"])), f"Error: unknown token {created['id']}")


def test_tokens_are_refused_to_others(cli, server, fleet):
    before = Token.objects.count()
    fails(cli("token", "list", token=server.user_token), "permission denied: only staff with the master.view_token")
    fails(cli("token", "create", token=server.user_token), "permission denied: only staff with the master.add_token")
    fails(cli("token", "create", "--shard", "lab1", token=server.user_token), "permission denied")
    mine = Token.objects.filter(user__username="ana").get().id
    fails(cli("token", "revoke", str(mine), token=server.user_token), "master.change_token")
    assert Token.objects.count() == before
