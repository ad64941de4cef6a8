"""The fleet overview and the shard list: online state, heartbeat age, hosts by status, job counts."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone

from common.models import Host, HostQueueEntry, Job, Shard
from common.wire import format_time
from master.observe.overview import fleet_snapshot
from tests.support import assert_status


@pytest.fixture
def staff(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def hid(name: str) -> int:
    return Host.objects.get(hostname=name).id


def card(page: str, shard: str) -> str:
    return page.split(f'data-shard="{shard}"')[1].split('class="fs-card')[0]


def test_overview_is_for_staff_only(fleet):
    assert_status(Client().get("/admin/fleet/"), 302)
    assert Client().get("/admin/fleet/")["Location"].startswith("/admin/login/")


def test_overview_shows_each_shard_online_or_offline_with_counts(fleet, staff, heartbeat):
    queued = fleet.job("queued")
    running = fleet.job("running", meta_hosts=[("board:a", 2)])
    failed = fleet.job("failed")
    old_failure = fleet.job("old-failure")
    heartbeat(fleet.lab1, fleet.token1)
    hqe_r = HostQueueEntry.objects.filter(job=running).first()
    hqe_f = HostQueueEntry.objects.get(job=failed)
    hqe_o = HostQueueEntry.objects.get(job=old_failure)
    now = timezone.now()
    at = format_time(now)
    updates = [
        {"seq": 1, "hqe": hqe_r.id, "job": running.id, "status": "Running", "host": hid("a1"), "started_on": at},
        {"seq": 2, "hqe": hqe_f.id, "job": failed.id, "status": "Failed", "failure": "test", "finished_on": at},
        {"seq": 3, "hqe": hqe_o.id, "job": old_failure.id, "status": "Failed", "failure": "infra", "finished_on": at},
    ]
    known = [
        {"id": hid("a1"), "version": 1, "status": "Running"},
        {"id": hid("a3"), "version": 1, "status": "Repairing"},
    ]
    resp = heartbeat(fleet.lab1, fleet.token1, updates=updates, known_hosts=known)
    assert [a["result"] for a in resp["acks"]] == ["accepted"] * 3, resp
    HostQueueEntry.objects.filter(id=hqe_o.id).update(finished_on=now - timedelta(days=2))

    page = staff.get("/admin/fleet/").content.decode()
    lab1, lab2 = card(page, "lab1"), card(page, "lab2")
    assert ">online</span>" in lab1 and ">offline</span>" in lab2
    assert "1 Ready" in lab1 and "1 Running" in lab1 and "1 Repairing" in lab1 and "3 hosts" in lab1
    assert "<b>1</b>queued" in lab1 and "<b>1</b>running" in lab1 and "<b>1</b>failed (24 h)" in lab1
    assert "last heartbeat never" in lab2 and "1 Ready" in lab2
    assert queued.id and Job.objects.get(id=old_failure.id).status == "Failed"
    assert "1 of 2 shards online" in page
    assert '<meta http-equiv="refresh"' in page
    # One line per label: Ready (and unlocked) hosts of all hosts with it.
    assert 'data-label="board:a"' in page
    line = page.split('data-label="board:a"')[1].split("</tr>")[0]
    assert "1 of 3" in line
    line = page.split('data-label="wifi"')[1].split("</tr>")[0]
    assert "2 of 3" in line  # a1 Running, a2 and b1 Ready
    # c1 has no shard.
    assert "1 of 1 host without a shard are Ready" in page


def test_a_shard_silent_for_three_intervals_is_offline(fleet, heartbeat):
    heartbeat(fleet.lab1, fleet.token1)
    with override_settings(FLEETSHARD_HEARTBEAT_INTERVAL_S=10):
        Shard.objects.filter(id=fleet.lab1.id).update(last_heartbeat=timezone.now() - timedelta(seconds=29))
        assert [c.online for c in fleet_snapshot().cards] == [True, False]
        Shard.objects.filter(id=fleet.lab1.id).update(last_heartbeat=timezone.now() - timedelta(seconds=31))
        assert [c.online for c in fleet_snapshot().cards] == [False, False]


def test_shard_list_shows_state_age_version_hosts_and_jobs(fleet, staff, heartbeat):
    fleet.job()
    heartbeat(fleet.lab1, fleet.token1, known_hosts=[{"id": hid("a2"), "version": 1, "status": "Repair Failed"}])
    resp = staff.get("/admin/common/shard/")
    page = resp.content.decode()
    rows = {s.hostname: s for s in resp.context["cl"].result_list}
    assert rows["lab1"].hosts_total == 3 and rows["lab1"].hosts_repair_failed == 1 and rows["lab1"].jobs_queued == 1
    assert rows["lab2"].hosts_total == 1 and rows["lab2"].jobs_queued == 0
    assert ">online</span>" in page and ">offline</span>" in page
    assert "s ago" in page and "never" in page and ">test<" in page  # client_version "test"
    assert ">1 Repair Failed</span>" in page and ">3 total</span>" in page
    online = staff.get("/admin/common/shard/?state=online").context["cl"].result_list
    offline = staff.get("/admin/common/shard/?state=offline").context["cl"].result_list
    assert [s.hostname for s in online] == ["lab1"] and [s.hostname for s in offline] == ["lab2"]


def test_shard_page_is_read_only_and_shows_counts(fleet, staff):
    page = staff.get(f"/admin/common/shard/{fleet.lab1.id}/change/").content.decode()
    assert "board:a" in page and ">3 total</span>" in page and 'name="_save"' not in page


def test_index_links_to_the_overview(staff):
    assert 'href="/admin/fleet/"' in staff.get("/admin/").content.decode()


def test_the_overview_counts_missing_hosts(fleet, staff, heartbeat):
    heartbeat(
        fleet.lab1,
        fleet.token1,
        discovered={"generation": 1, "hosts": [{"hostname": "d1", "labels": ["board:a"]}]},
    )
    heartbeat(fleet.lab1, fleet.token1, discovered={"generation": 2, "hosts": []})
    lab1 = card(staff.get("/admin/fleet/").content.decode(), "lab1")
    assert "1 Missing" in lab1 and "4 hosts" in lab1
