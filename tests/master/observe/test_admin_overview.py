"""The fleet overview and the shard list: online state, heartbeat age, hosts by status, job counts."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone

from common.models import Host, HostQueueEntry, Job, Shard
from common.wire import format_time
from master.observe.overview import PAGE_SIZE, fleet_snapshot
from tests.master.rows import add_rows
from tests.support import assert_status


@pytest.fixture
def staff(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def hid(name: str) -> int:
    return Host.objects.get(hostname=name).id


def shard_line(page: str, shard: str) -> str:
    """A shard's line in the overview's shard list."""
    return page.split('<tr class="fs-line', 1)[1].split(f'data-shard="{shard}"')[1].split("</tr>")[0]


def cell(row: str, name: str) -> str:
    """The text of a line's cell of this class (its link's text when it has one)."""
    inner = row.split(f'<td class="{name}')[1].split("</td>")[0]
    return inner.split(">", 1)[1].replace("</a>", "").rsplit(">", 1)[-1]


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
    lab1, lab2 = shard_line(page, "lab1"), shard_line(page, "lab2")
    assert ">online</span>" in lab1 and ">offline</span>" in lab2
    assert "1 Ready" in lab1 and "1 Running" in lab1 and "1 Repairing" in lab1 and "3 hosts" in lab1
    assert [cell(lab1, c) for c in ("queued", "running", "failed")] == ["1", "1", "1"]
    assert f'href="/admin/common/shard/{fleet.lab1.id}/change/"' in lab1
    assert f'href="/admin/common/host/?shard__id__exact={fleet.lab1.id}"' in lab1
    assert f'href="/admin/common/job/?shard__id__exact={fleet.lab1.id}&amp;status__exact=Failed"' in lab1
    assert cell(lab2, "fs-age") == "never" and "1 Ready" in lab2
    assert [cell(lab2, c) for c in ("queued", "running", "failed")] == ["0", "0", "0"]
    # The fleet's totals above the list: shards by state, hosts by status, jobs.
    totals = page.split('id="fs-totals"')[1].split("<h2>")[0]
    assert "1 online" in totals and ">1 late<" not in totals and "1 never seen" in totals
    assert ">3 Ready<" in totals and ">1 Running<" in totals and ">1 Repairing<" in totals
    assert "<b>1</b>jobs queued" in totals and "<b>1</b>running" in totals and "<b>1</b>failed (24 h)" in totals
    # Never heard from comes before online (worst first).
    assert page.index('data-shard="lab2"') < page.index('data-shard="lab1"')
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
        assert [(x.online, x.state) for x in fleet_snapshot(sort="name").lines] == [(True, "online"), (False, "never")]
        Shard.objects.filter(id=fleet.lab1.id).update(last_heartbeat=timezone.now() - timedelta(seconds=31))
        assert [(x.online, x.state) for x in fleet_snapshot(sort="name").lines] == [(False, "late"), (False, "never")]
        assert fleet_snapshot().shards == {"total": 2, "online": 0, "late": 1, "never": 1}


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
    lab1 = shard_line(staff.get("/admin/fleet/").content.decode(), "lab1")
    assert "1 Missing" in lab1 and "4 hosts" in lab1


def test_the_shard_list_is_paged_worst_first_sortable_and_searchable(staff):
    add_rows(0, 120)
    now = timezone.now()
    Shard.objects.update(last_heartbeat=now)
    Shard.objects.filter(hostname="lab077").update(last_heartbeat=now - timedelta(hours=1))  # late
    Shard.objects.filter(hostname="lab100").update(last_heartbeat=None)  # never seen
    Host.objects.filter(hostname="dut050").update(status="Repair Failed")  # trouble

    def shown(url: str) -> list[str]:
        resp = staff.get(url)
        assert_status(resp, 200)
        return [x.shard.hostname for x in resp.context["snapshot"].lines]

    first = shown("/admin/fleet/")
    assert len(first) == PAGE_SIZE and first[:4] == ["lab077", "lab100", "lab050", "lab000"]
    page = staff.get("/admin/fleet/").content.decode()
    assert "Page 1 of 3" in page and "shards 1&ndash;50 of 120" in page and 'rel="next"' in page
    assert "118 online" in page and ">1 late<" in page and "1 never seen" in page
    assert len(shown("/admin/fleet/?page=2")) == PAGE_SIZE and len(shown("/admin/fleet/?page=3")) == 20
    everyone = [name for p in (1, 2, 3) for name in shown(f"/admin/fleet/?page={p}&sort=name")]
    assert everyone == sorted(f"lab{i:03}" for i in range(120))
    assert shown("/admin/fleet/?sort=heartbeat")[:2] == ["lab100", "lab077"]
    assert shown("/admin/fleet/?q=LAB11") == [f"lab11{i}" for i in range(10)]
    assert shown("/admin/fleet/?q=+lab119+&sort=name") == ["lab119"]
    # The utilisation table and the labels follow the page: its shards' rows, not the fleet's.
    snapshot = staff.get("/admin/fleet/?q=lab11").context["snapshot"]
    assert [row["key"] for row in snapshot.utilisation] == [f"lab11{i}" for i in range(10)]
    assert [label.name for label in snapshot.labels] == [f"board:11{i}" for i in range(10)]


@pytest.mark.parametrize(
    "query, status, message",
    [
        ("page=-1", 400, "page must be a whole number from 1 to 999999999, not '-1'"),
        ("page=0", 400, "page must be a whole number from 1 to 999999999, not '0'"),
        ("page=abc", 400, "page must be a whole number from 1 to 999999999, not 'abc'"),
        ("page=1.5", 400, "page must be a whole number from 1 to 999999999, not '1.5'"),
        ("page=%D9%A3", 400, "page must be a whole number from 1"),  # an Arabic-Indic three
        ("page=99999999999999999999999", 400, "from 1 to 999999999, not '99999999999999999999999'"),
        ("page=2", 404, "page 2 does not exist: there is 1"),
        ("page=100000", 404, "page 100000 does not exist: there is 1"),
        ("sort=size", 400, "sort must be one of worst, name, heartbeat, hosts, not 'size'"),
        ("sort=-name", 400, "sort must be one of worst, name, heartbeat, hosts"),
        ("q=" + "x" * 256, 400, "q (a part of a shard's name) must be at most 255 characters"),
        ("q=a%00b", 400, "without NUL"),
    ],
)
def test_a_bad_parameter_gets_a_clear_answer(fleet, staff, query, status, message):
    resp = staff.get(f"/admin/fleet/?{query}")
    assert_status(resp, status)
    assert message in resp.content.decode() and resp["Content-Type"].startswith("text/plain")


def test_an_empty_fleet_and_an_empty_page(staff):
    page = staff.get("/admin/fleet/").content.decode()
    assert "No shards yet" in page and "0 of 0 shards online" in page
    assert_status(staff.get("/admin/fleet/?page=1&q=nothing"), 200)
