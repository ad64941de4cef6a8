"""`fleetshard label ...` against a live server."""

import json

import pytest

from common.models import Host, Job, Label
from master import services
from master.models import AuditRecord
from tests.cli.conftest import fails, ok
from tests.fleet_state import snapshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_label_create_and_list(cli, fleet):
    assert ok(cli("label", "create", "os:android", "os:linux")).stdout == "Created labels: os:android, os:linux\n"
    assert set(Label.objects.values_list("name", flat=True)) >= {"os:android", "os:linux"}
    out = ok(cli("label", "list")).stdout.splitlines()
    assert out[0].split() == ["Id", "Name", "Shard"]
    assert any(line.split()[1:] == ["board:a", "lab1"] for line in out[1:])
    assert any(line.split()[1:] == ["os:linux", "-"] for line in out[1:])


def test_label_list_json_is_an_array_with_the_design_fields(cli, fleet):
    labels = json.loads(ok(cli("label", "list", "--json")).stdout)
    assert isinstance(labels, list) and len(labels) == Label.objects.count()
    assert {"id": Label.objects.get(name="board:b").id, "name": "board:b", "shard": "lab2"} in labels
    assert all(set(x) == {"id", "name", "shard"} for x in labels)


def test_label_list_of_a_shard(cli, fleet):
    assert [x["name"] for x in json.loads(ok(cli("label", "list", "--shard", "lab1", "--json")).stdout)] == ["board:a"]
    fails(cli("label", "list", "--shard", "nosuch"), "Error: unknown shard nosuch")


def test_label_create_json_is_one_object(cli, fleet):
    out = json.loads(ok(cli("label", "create", "x1", "--json")).stdout)
    assert out == {"labels": [{"id": Label.objects.get(name="x1").id, "name": "x1", "shard": None}]}


def test_label_create_reads_a_file(cli, fleet, tmp_path):
    listing = tmp_path / "labels.txt"
    listing.write_text("# new boards\nboard:x board:y\nboard:z,pool:y\n")
    ok(cli("label", "create", "-B", str(listing)))
    assert Label.objects.filter(name__in=["board:x", "board:y", "board:z", "pool:y"]).count() == 4


def test_label_create_refuses_existing_and_invalid_names_changing_nothing(cli, fleet):
    before = snapshot()
    fails(cli("label", "create", "new1", "board:a"), "Error: label board:a already exists")
    fails(cli("label", "create", "bad name"), "invalid label name 'bad name'")
    fails(cli("label", "create", "-B", "/nonexistent/file"), "cannot read /nonexistent/file")
    assert snapshot() == before


def test_label_create_without_names_is_bad_usage(cli, fleet):
    fails(cli("label", "create"), "give at least one label NAME", code=2)


def test_label_delete(cli, fleet):
    assert ok(cli("label", "delete", "pool:x", "wifi")).stdout == "Deleted labels pool:x, wifi\n"
    assert not Label.objects.filter(name__in=["pool:x", "wifi"]).exists()
    out = json.loads(ok(cli("label", "delete", "board:c", "--json")).stdout)
    assert out == {"deleted": ["board:c"], "hosts_moved": []}


def test_label_delete_says_which_hosts_left_which_shard(cli, fleet):
    services.create_labels(["board:x"], acting_user=None)
    services.add_labels_to_shard("lab1", ["board:x"], acting_user=None)
    services.create_hosts(["dut3"], labels=["board:x"], acting_user=None)
    job = fleet.job(meta_hosts=[], hosts=["dut3"])  # queued for dut3 on lab1: it stays there
    assert ok(cli("label", "delete", "board:x")).stdout == "Deleted label board:x; host dut3 left shard lab1\n"
    assert Host.objects.get(hostname="dut3").shard is None
    assert Job.objects.get(id=job.id).shard == fleet.lab1
    services.create_labels(["board:y"], acting_user=None)
    services.add_labels_to_shard("lab2", ["board:y"], acting_user=None)
    services.create_hosts(["dut4", "dut5"], labels=["board:y"], acting_user=None)
    out = json.loads(ok(cli("label", "delete", "board:y", "pool:x", "--json")).stdout)
    assert out == {
        "deleted": ["board:y", "pool:x"],
        "hosts_moved": [
            {"hostname": "dut4", "from_shard": "lab2", "to_shard": None},
            {"hostname": "dut5", "from_shard": "lab2", "to_shard": None},
        ],
    }


def test_label_remove_says_which_hosts_left_which_shard(cli, fleet):
    out = ok(cli("label", "remove", "board:a", "-m", "a3")).stdout
    assert out == "Removed label board:a from hosts: a3; host a3 left shard lab1\n"
    out = json.loads(ok(cli("label", "add", "board:a", "-m", "a3", "--json")).stdout)
    assert out["hosts_moved"] == [{"hostname": "a3", "from_shard": None, "to_shard": "lab1"}]


def test_label_delete_unknown_changes_nothing(cli, fleet):
    before = snapshot()
    fails(cli("label", "delete", "wifi", "nosuch"), "Error: unknown label nosuch")
    assert snapshot() == before


def test_label_add_and_remove_on_hosts(cli, fleet, tmp_path):
    assert ok(cli("label", "add", "pool:x", "-m", "a1,a2")).stdout == "Added label pool:x to hosts: a1, a2\n"
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("a3\n")
    out = json.loads(ok(cli("label", "add", "pool:x", "-M", str(hosts_file), "--json")).stdout)
    assert out["label"] == "pool:x" and [h["hostname"] for h in out["hosts"]] == ["a3"]
    assert "pool:x" in out["hosts"][0]["labels"]
    assert set(Host.objects.filter(labels__name="pool:x").values_list("hostname", flat=True)) == {"a1", "a2", "a3"}
    assert ok(cli("label", "remove", "pool:x", "-m", "a1", "-m", "a2")).stdout == (
        "Removed label pool:x from hosts: a1, a2\n"
    )
    assert list(Host.objects.filter(labels__name="pool:x").values_list("hostname", flat=True)) == ["a3"]


def test_label_add_on_hosts_that_have_it_says_so_and_records_nothing(cli, fleet):
    ok(cli("label", "add", "pool:x", "-m", "a1"))
    records = AuditRecord.objects.count()
    assert ok(cli("label", "add", "pool:x", "-m", "a1")).stdout == "host a1 already had label pool:x: nothing to do\n"
    assert AuditRecord.objects.count() == records
    assert ok(cli("label", "add", "pool:x", "-m", "a1,a2")).stdout == (
        "Added label pool:x to hosts: a2; host a1 already had label pool:x: nothing to do\n"
    )
    (record,) = AuditRecord.objects.filter(action="host.add_label").order_by("-id")[:1]
    assert sorted(t.name for t in record.targets.all() if t.kind == "host") == ["a2"]


def test_label_add_moves_a_host_to_the_labels_shard(cli, fleet):
    ok(cli("label", "add", "board:b", "-m", "c1"))
    assert Host.objects.get(hostname="c1").shard == fleet.lab2


@pytest.mark.parametrize(
    "args, message",
    [
        (("label", "add", "nosuch", "-m", "a1"), "Error: unknown label nosuch"),
        (("label", "add", "wifi", "-m", "a3,zz,yy"), "Error: unknown hosts yy, zz"),
        (
            ("label", "add", "board:b", "-m", "a1"),
            "Error: host a1 would have labels of two shards: board:a (shard lab1) and board:b (shard lab2)",
        ),
        (("label", "remove", "wifi", "-m", "a1,a3"), "Error: label wifi is not on host a3"),
        (("label", "remove", "nosuch", "-m", "a1"), "Error: unknown label nosuch"),
    ],
)
def test_label_add_and_remove_errors_change_nothing(cli, fleet, args, message):
    before = snapshot()
    fails(cli(*args), message)
    assert snapshot() == before


def test_label_add_without_hosts_is_bad_usage(cli, fleet):
    fails(cli("label", "add", "wifi"), "give at least one host", code=2)
