"""`fleetshard shard ...` against a live server."""

import json
import os

import pytest
import requests

from common.constants import PROTOCOL_VERSION
from common.models import Host, Job, Label, Shard
from tests.cli.conftest import fails, ok, run_process
from tests.fleet_state import snapshot
from tests.support import assert_status

pytestmark = pytest.mark.django_db(transaction=True)

SHARD_FIELDS = {"id", "hostname", "labels", "status", "last_heartbeat", "hosts"}


def test_shard_create_prints_a_token_that_heartbeats(cli, server, fleet):
    out = ok(cli("shard", "create", "-l", "board:c,pool:x", "lab3.example.com")).stdout.splitlines()
    assert out[0] == "Created shard lab3.example.com (labels: board:c, pool:x; hosts: c1)."
    assert "shown only this once" in out[1]
    token = out[2]
    assert Host.objects.get(hostname="c1").shard.hostname == "lab3.example.com"
    body = {
        "protocol": PROTOCOL_VERSION,
        "shard": "lab3.example.com",
        "instance": "5f0c7a2e-8d1b-4c3e-9a77-2b6f1d0e4c11",
        "client_version": "test",
        "known_hosts": [],
        "known_jobs": [],
        "updates": [],
    }
    resp = requests.post(f"{server.url}/api/v1/heartbeat", json=body, headers={"Authorization": f"Bearer {token}"})
    assert_status(resp, 200)
    assert [h["hostname"] for h in resp.json()["hosts"]] == ["c1"]
    assert ok(cli("shard", "list", "--json")).stdout.count('"online"') == 1


def test_shard_create_json_has_the_token(cli, fleet):
    obj = json.loads(ok(cli("shard", "create", "lab3", "--json")).stdout)
    assert set(obj) >= SHARD_FIELDS | {"token"}
    assert obj["token"].startswith("fs_") and obj["labels"] == [] and obj["status"] == "offline"


@pytest.mark.parametrize(
    "args, message",
    [
        (("-l", "board:a", "lab3"), "Error: label board:a already belongs to shard lab1"),
        (("-l", "nosuch", "lab3"), "Error: unknown label nosuch"),
        (("lab1",), "Error: shard lab1 already exists"),
        (("bad name",), "Error: invalid shard name 'bad name'"),
    ],
)
def test_shard_create_errors_change_nothing(cli, fleet, args, message):
    before = snapshot()
    fails(cli("shard", "create", *args), message)
    assert snapshot() == before


def test_shard_list(cli, fleet):
    lines = ok(cli("shard", "list")).stdout.splitlines()
    assert lines[0].split() == ["Hostname", "Status", "Last", "Heartbeat", "Hosts", "Labels"]
    assert lines[1].split() == ["lab1", "offline", "-", "3", "board:a"]
    shards = json.loads(ok(cli("shard", "list", "--json")).stdout)
    assert [s["hostname"] for s in shards] == ["lab1", "lab2"]
    assert all(set(s) >= SHARD_FIELDS and "token" not in s for s in shards)
    assert shards[0]["hosts"] == ["a1", "a2", "a3"]


def test_shard_add_label_and_remove_label(cli, fleet):
    assert ok(cli("shard", "add-label", "-l", "board:c", "lab2")).stdout == (
        "Added label board:c to shard lab2 (labels: board:b, board:c; hosts: b1, c1); host c1 joined shard lab2\n"
    )
    assert Host.objects.get(hostname="c1").shard == fleet.lab2
    obj = json.loads(ok(cli("shard", "remove-label", "-l", "board:b", "lab2", "--json")).stdout)
    assert obj["labels"] == ["board:c"] and obj["hosts"] == ["c1"]
    assert obj["hosts_moved"] == [{"hostname": "b1", "from_shard": "lab2", "to_shard": None}]
    assert ok(cli("shard", "remove_board", "-l", "board:c", "lab2")).stdout == (
        "Removed label board:c from shard lab2 (labels: none; hosts: none); host c1 left shard lab2\n"
    )
    assert Host.objects.get(hostname="b1").shard is None
    assert Label.objects.get(name="board:b").shard is None  # the old name above (remove_board) still works
    assert ok(cli("shard", "add_boards", "-l", "board:b,board:c", "lab2")).stdout.startswith(
        "Added labels board:b, board:c to shard lab2"
    )
    shown = ok(cli("shard", "--help")).stdout
    assert "add-label" in shown and "remove-label" in shown
    assert "add_boards" not in shown and "remove_board" not in shown


@pytest.mark.parametrize(
    "args, message",
    [
        (("add_boards", "-l", "board:b", "lab1"), "Error: label board:b already belongs to shard lab2"),
        (("add_boards", "-l", "board:c,nosuch", "lab1"), "Error: unknown label nosuch"),
        (("add_boards", "-l", "board:c", "nosuch"), "Error: unknown shard nosuch"),
        (("remove_board", "-l", "board:b", "lab1"), "Error: label board:b does not belong to shard lab1"),
        (("remove_board", "-l", "nosuch", "lab1"), "Error: unknown label nosuch"),
    ],
)
def test_shard_label_errors_change_nothing(cli, fleet, args, message):
    before = snapshot()
    fails(cli("shard", *args), message)
    assert snapshot() == before


def test_shard_add_boards_needs_labels(cli, fleet):
    fails(cli("shard", "add_boards", "lab1"), "give at least one label", code=2)


def test_shard_delete_with_no_confirmation(cli, fleet):
    job = fleet.job(meta_hosts=[("board:b", 1)])
    assert ok(cli("shard", "delete", "--no-confirmation", "lab2")).stdout == (
        f"Deleted shards: lab2; host b1 left shard lab2; aborted job {job.id}\n"
    )
    assert list(Shard.objects.values_list("hostname", flat=True)) == ["lab1"]
    assert Host.objects.get(hostname="b1").shard is None
    assert Job.objects.get(id=job.id).status == "Aborted"


def test_shard_delete_asks_first(cli, fleet):
    before = snapshot()
    result = fails(cli("shard", "delete", "lab2", input="n\n"), "Error: nothing deleted", after_prompt=True)
    assert "Delete shards lab2?" in result.stderr
    assert snapshot() == before
    ok(cli("shard", "delete", "lab2", input="y\n"))
    assert not Shard.objects.filter(hostname="lab2").exists()


def test_shard_delete_without_stdin_refuses(cli, server, fleet):
    before = snapshot()
    fails(
        cli("shard", "delete", "lab2"), "no confirmation on standard input: pass --no-confirmation", after_prompt=True
    )
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token}
    proc = run_process("shard", "delete", "lab1", env=env, input="")
    assert proc.returncode == 1
    assert "Error: no confirmation on standard input: pass --no-confirmation to delete anyway" in proc.stderr
    assert snapshot() == before


def test_shard_delete_unknown_changes_nothing(cli, fleet):
    before = snapshot()
    fails(cli("shard", "delete", "--no-confirmation", "lab1", "nosuch"), "Error: unknown shard nosuch")
    assert snapshot() == before


def test_shard_stat_shows_what_discovery_found_and_what_the_master_refused(cli, fleet):
    Shard.objects.filter(id=fleet.lab1.id).update(
        discovered_generation=3,
        discovered_count=2,
        discovered_rejected=[{"hostname": "x2", "reason": "label board:b belongs to shard lab2, not lab1"}],
        pools=[{"labels": ["pool:gpu"], "max_hosts": 6}],
    )
    out = ok(cli("shard", "stat", "lab1")).stdout
    assert "Discovered:      2 hosts (generation 3)" in out
    assert "Refused:         x2: label board:b belongs to shard lab2, not lab1" in out
    assert "Pools:           pool:gpu (at most 6 hosts)" in out
    data = json.loads(ok(cli("shard", "stat", "lab1", "--json")).stdout)
    assert data["discovered_rejected"] == [
        {"hostname": "x2", "reason": "label board:b belongs to shard lab2, not lab1"}
    ]
