"""`fleetshard host ...` against a live server."""

import json

import pytest

from common.constants import HQEStatus
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry
from tests.cli.conftest import fails, ok
from tests.fleet_state import snapshot

pytestmark = pytest.mark.django_db(transaction=True)

HOST_FIELDS = {
    "id", "hostname", "status", "shard", "labels", "locked", "lock_reason", "attributes",
    "origin", "discovered_by", "last_seen",
}  # fmt: skip


def test_host_create_with_labels_attributes_and_a_lock(cli, fleet):
    result = ok(
        cli(
            "host", "create", "-b", "board:a,wifi", "-i", "serial=X1", "-i", "rack=r 3",
            "--lock", "-r", "not wired yet", "n1", "n2", "--json",
        )
    )  # fmt: skip
    hosts = json.loads(result.stdout)["hosts"]
    assert [h["hostname"] for h in hosts] == ["n1", "n2"]
    assert all(set(h) == HOST_FIELDS for h in hosts)
    assert hosts[0] | {"id": 0} == {
        "id": 0,
        "hostname": "n1",
        "status": "Ready",
        "shard": "lab1",
        "labels": ["board:a", "wifi"],
        "locked": True,
        "lock_reason": "not wired yet",
        "attributes": {"serial": "X1", "rack": "r 3"},
        "origin": "declared",
        "discovered_by": None,
        "last_seen": None,
    }
    assert Host.objects.get(hostname="n2").shard == fleet.lab1


def test_host_create_prints_where_hosts_went(cli, fleet, tmp_path):
    assert ok(cli("host", "create", "-b", "board:b", "n1")).stdout == "Created hosts: n1 (shard lab2)\n"
    listing = tmp_path / "hosts"
    listing.write_text("n2\nn3\n")
    labels = tmp_path / "labels"
    labels.write_text("pool:x\n")
    assert ok(cli("host", "create", "-M", str(listing), "-B", str(labels))).stdout == (
        "Created hosts: n2 (shard none), n3 (shard none)\n"
    )
    assert list(Host.objects.get(hostname="n3").labels.values_list("name", flat=True)) == ["pool:x"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("-b", "board:a,board:b", "n1"),
            "Error: host n1 would have labels of two shards: board:a (shard lab1) and board:b (shard lab2)",
        ),
        (("-b", "nosuch", "n1"), "Error: unknown label nosuch"),
        (("n1", "a1"), "Error: host a1 already exists"),
        (("-r", "why", "n1"), "Error: a lock reason needs --lock"),
        (("-i", "bad name=1", "n1"), "Error: invalid attribute name 'bad name'"),
    ],
)
def test_host_create_errors_change_nothing(cli, fleet, args, message):
    before = snapshot()
    fails(cli("host", "create", *args), message)
    assert snapshot() == before


def test_host_create_bad_usage(cli, fleet):
    fails(cli("host", "create", "-i", "novalue", "n1"), "'novalue' is not NAME=VALUE", code=2)
    fails(cli("host", "create"), "give at least one HOSTNAME", code=2)


def test_host_list_and_filters(cli, fleet):
    Host.objects.filter(hostname="a3").update(status="Repairing")
    lines = ok(cli("host", "list")).stdout.splitlines()
    assert lines[0].split() == ["Hostname", "Status", "Shard", "Locked", "Lock", "Reason", "Labels"]
    assert lines[1].split() == ["a1", "Ready", "lab1", "no", "-", "board:a,", "wifi"]
    assert len(lines) == 6

    def hostnames(*args: str) -> list[str]:
        return [h["hostname"] for h in json.loads(ok(cli("host", "list", "--json", *args)).stdout)]

    assert hostnames("--label", "wifi") == ["a1", "a2", "b1"]
    assert hostnames("--shard", "lab1") == ["a1", "a2", "a3"]
    assert hostnames("--status", "repairing") == ["a3"]
    assert hostnames("--label", "wifi", "--shard", "lab2") == ["b1"]
    fails(cli("host", "list", "--label", "nosuch"), "Error: unknown label nosuch")
    fails(cli("host", "list", "--shard", "nosuch"), "Error: unknown shard nosuch")
    fails(cli("host", "list", "--status", "Sleeping"), "Invalid value for '--status'", code=2)


def test_host_stat(cli, fleet):
    out = ok(cli("host", "stat", "a1")).stdout
    assert "Host:         a1\n" in out and "Shard:        lab1\n" in out and "Labels:       board:a, wifi\n" in out
    host = json.loads(ok(cli("host", "stat", "b1", "--json")).stdout)
    assert set(host) == HOST_FIELDS | {"running", "recent_runs"} and host["shard"] == "lab2"
    fails(cli("host", "stat", "nosuch"), "Error: unknown host nosuch")


def test_host_mod_locks_and_unlocks(cli, fleet):
    assert ok(cli("host", "mod", "--lock", "-r", "flaky usb", "a1", "a2")).stdout == (
        "Locked hosts (flaky usb): a1, a2\n"
    )
    assert set(Host.objects.filter(locked=True).values_list("hostname", "lock_reason")) == {
        ("a1", "flaky usb"),
        ("a2", "flaky usb"),
    }
    out = json.loads(ok(cli("host", "mod", "--unlock", "a1", "--json")).stdout)
    assert out["hosts"][0]["hostname"] == "a1" and out["hosts"][0]["locked"] is False
    assert list(Host.objects.filter(locked=True).values_list("hostname", flat=True)) == ["a2"]


def test_host_mod_errors(cli, fleet):
    before = snapshot()
    fails(cli("host", "mod", "--lock", "a1", "zz"), "Error: unknown host zz")
    fails(cli("host", "mod", "a1"), "give --lock, --unlock, --attribute KEY=VALUE or --remove-attribute KEY", code=2)
    fails(cli("host", "mod", "--lock", "--unlock", "a1"), "give one of --lock and --unlock, not both", code=2)
    assert snapshot() == before


def test_host_delete(cli, fleet):
    assert ok(cli("host", "delete", "c1", "b1")).stdout == "Deleted hosts: c1, b1\n"
    assert not Host.objects.filter(hostname__in=["b1", "c1"]).exists()


def test_host_delete_refuses_unknown_and_busy_hosts(cli, fleet):
    job = fleet.job(meta_hosts=[], hosts=["a1"])
    HostQueueEntry.objects.filter(job=job).update(status=HQEStatus.RUNNING)
    refresh_job_statuses([job.id])
    before = snapshot()
    fails(cli("host", "delete", "c1", "nosuch"), "Error: unknown host nosuch")
    fails(cli("host", "delete", "c1", "a1"), f"Error: host a1 has active job {job.id}; abort it first")
    assert snapshot() == before
