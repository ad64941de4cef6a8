"""`fleetshard audit list` against a live server, and the records the CLI's own changes write."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from common.models import Host, Label
from master import services
from master.models import AuditRecord
from tests.cli.conftest import fails, ok

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_change_from_the_cli_records_its_user(cli, server, fleet):
    ok(cli("host", "mod", "a1", "--lock", "-r", "fan noise"))
    entry = AuditRecord.objects.order_by("-id").first()
    assert (entry.actor, entry.user.username, entry.action, entry.reason) == ("boss", "boss", "host.lock", "fan noise")
    assert [(t.kind, t.name) for t in entry.targets.all()] == [("host", "a1")]


def test_a_refused_change_from_the_cli_writes_no_record(cli, server, fleet):
    before = AuditRecord.objects.count()
    fails(cli("shard", "add_boards", "lab1", "-l", "wifi,board:b"), "label board:b already belongs to shard lab2")
    assert AuditRecord.objects.count() == before and Label.objects.get(name="wifi").shard is None


def test_audit_list_json_is_an_array_of_records(cli, server, fleet):
    ok(cli("host", "mod", "a1", "--lock", "-r", "fan noise"))
    records = json.loads(ok(cli("audit", "list", "--json")).stdout)
    assert isinstance(records, list) and len(records) == AuditRecord.objects.count()
    assert all(set(r) == {"id", "at", "user", "action", "targets", "reason", "details"} for r in records)
    assert records[0]["user"] == "boss" and records[0]["action"] == "host.lock" and records[0]["reason"] == "fan noise"
    assert records[0]["targets"] == [{"kind": "host", "id": Host.objects.get(hostname="a1").id, "name": "a1"}]


def test_audit_list_table(cli, server, fleet):
    ok(cli("host", "mod", "a1", "--lock", "-r", "fan noise"))
    lines = ok(cli("audit", "list", "--host", "a1")).stdout.splitlines()
    assert lines[0].split() == ["At", "User", "Action", "Objects", "Reason"]
    assert lines[1].split()[2:] == ["boss", "host.lock", "host", "a1", "fan", "noise"]
    assert lines[2].split()[2:] == [
        "system",
        "host.create",
        "host",
        "a1,",
        "host",
        "a2,",
        "label",
        "board:a,",
        "label",
        "wifi",
        "-",
    ]
    assert len(lines) == 3


def test_audit_list_filters(cli, server, fleet):
    job = fleet.job()
    ok(cli("job", "abort", str(job.id)))
    services.lock_hosts(["a2"], "old", acting_user=None)
    AuditRecord.objects.filter(reason="old").update(at=timezone.now() - timedelta(days=2))

    def actions(*args):
        return [r["action"] for r in json.loads(ok(cli("audit", "list", "--json", *args)).stdout)]

    assert actions("--job", str(job.id)) == ["job.abort", "job.create"]
    assert actions("--user", "boss") == ["job.abort"]
    assert actions("--host", "a2") == ["host.create", "host.lock"]
    assert actions("--host", "a2", "--since", "24h") == ["host.create"]
    assert actions("--host", "a2", "--since", (timezone.now() - timedelta(days=3)).isoformat()) == [
        "host.create",
        "host.lock",
    ]


def test_audit_list_bad_since_is_named(cli, server, fleet):
    fails(cli("audit", "list", "--since", "last week"), "invalid since 'last week': use an ISO time")
    fails(cli("audit", "list", "--job", "0"), "Invalid value for '--job'", code=2)
