"""The shard's admin (server/urls/shard.py): the local queue, running HQEs and their logs, hosts, dead letters.

The shard's database is built the way a shard builds it: by applying heartbeat responses and by
HQE transitions, which queue their updates in the outbox.
"""

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from common.constants import HQEStatus
from common.models import Host, HostQueueEntry, Job
from shard.models import DeadLetter, DiscoveryState, HostState, OutboxEntry, Run
from shard.services import finish_hqe, transition_hqe
from shard.sync.discovery import record_set
from tests.shard.world import apply_wire
from tests.support import assert_status

pytestmark = pytest.mark.urls("server.urls.shard")


def host_data(i: int, **kw: Any) -> dict[str, Any]:
    return {
        "id": i,
        "version": 1,
        "hostname": f"dut{i}",
        "labels": ["board:pixel7"],
        "locked": False,
        "lock_reason": "",
        "attributes": {},
        **kw,
    }


def job_data(i: int, hqe_ids: list[int], **kw: Any) -> dict[str, Any]:
    return {
        "id": i,
        "version": 1,
        "name": f"job{i}",
        "owner": "ana",
        "priority": 40,
        "command": "./run.sh",
        "timeout_mins": 60,
        "max_runtime_mins": 30,
        "dependency_labels": [],
        "keyvals": {},
        "parent_id": None,
        "aborted": False,
        "created_on": "2026-11-22T09:59:00Z",
        "hqes": [{"id": h, "host_id": None, "meta_host": "board:pixel7"} for h in hqe_ids],
        **kw,
    }


@pytest.fixture
def lab(db: None, tmp_path: Path) -> dict[str, Any]:
    apply_wire(
        {
            "hosts": [host_data(1), host_data(2, locked=True, lock_reason="cable swap"), host_data(3)],
            "jobs": [job_data(10, [100]), job_data(11, [110]), job_data(12, [120, 121])],
        }
    )
    results = tmp_path / "results-100"
    results.mkdir()
    (results / "job.log").write_text("".join(f"step {i}\n" for i in range(50)) + "still flashing the build\n")
    transition_hqe(100, HQEStatus.RUNNING, host_id=1)
    Run.objects.create(hqe_id=100, runner="lab1:1:1", pid=4242, results_dir=str(results))
    Host.objects.filter(id=1).update(status="Running")
    transition_hqe(110, HQEStatus.RUNNING, host_id=3)
    finish_hqe(110, HQEStatus.FAILED, failure="test", exit_code=3, log_tail="assertion failed: screen is off\n")
    Host.objects.filter(id=3).update(status="Repairing")
    rejected = OutboxEntry.objects.filter(hqe_id=110).order_by("seq").first()
    apply_wire({"acks": [{"seq": rejected.seq, "result": "rejected", "error": "job 11 is not assigned to lab1"}]})
    return {"results": results}


@pytest.fixture
def operator(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("labop", "l@example.com", "pw"))
    return client


def test_index_summarises_the_shard(lab, operator):
    with override_settings(FLEETSHARD_SHARD_HOSTNAME="lab1.example.com"):
        page = operator.get("/admin/").content.decode()
    assert "fleetshard shard lab1.example.com" in page
    assert ">1 Ready</span>" in page and ">1 Running</span>" in page and ">1 Repairing</span>" in page
    assert "2 queued, 0 starting, 1 running" in page
    assert "1 update the master rejected" in page
    assert f"{OutboxEntry.objects.count()} updates waiting" in page


def test_running_hqes_show_their_live_log_tail(lab, operator):
    page = operator.get("/admin/common/hostqueueentry/?activity=active").content.decode()
    assert "still flashing the build" in page and "step 49" in page
    assert "step 40" not in page  # the list keeps the last lines only
    detail = operator.get("/admin/common/hostqueueentry/100/change/").content.decode()
    assert "step 0\n" in detail and "still flashing the build" in detail


def test_finished_hqes_show_the_uploaded_tail(lab, operator):
    page = operator.get("/admin/common/hostqueueentry/?status__exact=Failed").content.decode()
    assert "assertion failed: screen is off" in page and ">Failed</span>" in page
    job = operator.get("/admin/common/job/11/change/").content.decode()
    assert "assertion failed: screen is off" in job


def test_local_queue_lists_jobs_by_priority(lab, operator):
    Job.objects.filter(id=12).update(priority=70)
    resp = operator.get("/admin/common/job/")
    assert [j.id for j in resp.context["cl"].result_list] == [12, 10, 11]
    assert ">Running</span>" in resp.content.decode()


def test_hosts_show_statuses_and_locks(lab, operator):
    page = operator.get("/admin/common/host/").content.decode()
    assert ">Running</span>" in page and ">Repairing</span>" in page and "cable swap" in page
    assert [h.hostname for h in operator.get("/admin/common/host/?locked__exact=1").context["cl"].result_list] == [
        "dut2"
    ]


def test_a_run_shows_its_process_and_results_and_a_host_who_holds_it(lab, operator):
    detail = operator.get("/admin/common/hostqueueentry/100/change/").content.decode()
    assert str(lab["results"]) in detail and "4242" in detail
    HostState.objects.filter(host_id=1).update(runner="lab1:1:1")
    HostState.objects.filter(host_id=3).update(retired=True)
    assert "lab1:1:1" in operator.get("/admin/common/host/1/change/").content.decode()
    retired = operator.get("/admin/common/host/?state__retired__exact=1").context["cl"].result_list
    assert [h.hostname for h in retired] == ["dut3"]


@pytest.mark.parametrize(
    "path, queries",
    [
        ("/admin/", 10),
        ("/admin/common/hostqueueentry/", 5),
        ("/admin/common/hostqueueentry/100/change/", 3),
        ("/admin/common/host/", 7),
        ("/admin/common/host/1/change/", 4),
        ("/admin/common/job/12/change/", 4),
    ],
)
def test_page_query_counts_are_pinned_whatever_the_rows(lab, operator, django_assert_num_queries, path, queries):
    operator.get(path)
    with django_assert_num_queries(queries):
        assert_status(operator.get(path), 200)
    apply_wire(
        {
            "hosts": [host_data(i) for i in range(20, 40)],
            "jobs": [job_data(1000 + i, [5000 + 2 * i, 5001 + 2 * i]) for i in range(20)],
        }
    )
    for i in range(20):
        transition_hqe(5000 + 2 * i, HQEStatus.RUNNING, host_id=20 + i)
        Run.objects.create(hqe_id=5000 + 2 * i, runner="lab1:1:1", results_dir=str(lab["results"]))
    with django_assert_num_queries(queries):
        assert_status(operator.get(path), 200)


def test_dead_letters_show_their_reasons(lab, operator):
    assert DeadLetter.objects.count() == 1
    page = operator.get("/admin/shard/deadletter/").content.decode()
    assert "job 11 is not assigned to lab1" in page
    page = operator.get("/admin/shard/outboxentry/").content.decode()
    assert ">Running</span>" in page


@pytest.mark.parametrize(
    "model",
    ["common/host", "common/job", "common/hostqueueentry", "common/label", "shard/outboxentry", "shard/deadletter"],
)
def test_everything_is_read_only(lab, operator, model):
    page = operator.get(f"/admin/{model}/").content.decode()
    assert f'href="/admin/{model}/add/"' not in page and 'name="action"' not in page
    assert_status(operator.get(f"/admin/{model}/add/"), 403)
    obj_id = {"common/host": 1, "common/job": 10, "common/hostqueueentry": 100}.get(model)
    if obj_id:
        assert_status(operator.post(f"/admin/{model}/{obj_id}/change/", {"status": "Ready"}), 403)
        assert_status(operator.post(f"/admin/{model}/{obj_id}/delete/", {"post": "yes"}), 403)
    assert HostQueueEntry.objects.get(id=100).status == "Running" and Host.objects.count() == 3


def test_master_only_pages_are_not_served_on_a_shard(lab, operator):
    assert_status(operator.get("/admin/fleet/"), 404)
    assert_status(operator.get("/admin/master/token/"), 404)
    assert_status(operator.get("/admin/common/shard/"), 404)
    assert_status(operator.get("/api/v1/heartbeat"), 404)


def test_needs_login(lab):
    resp = Client().get("/admin/common/hostqueueentry/")
    assert_status(resp, 302)
    assert resp["Location"].startswith("/admin/login/")


def test_hqe_list_queries_do_not_grow(lab, operator):
    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert_status(operator.get("/admin/common/hostqueueentry/"), 200)
        return len(ctx.captured_queries)

    operator.get("/admin/common/hostqueueentry/")
    few = count()
    apply_wire({"jobs": [job_data(1000 + i, [5000 + i]) for i in range(80)]})
    assert count() == few


def test_the_index_shows_discovery_sources_and_what_the_master_refused(lab, operator):

    record_set([], {"adb": {"at": "2026-11-25T10:00:00+00:00", "ok": False, "hosts": 2, "error": "no adb on PATH"}})
    DiscoveryState.objects.update(rejected=[{"hostname": "x<1>", "reason": "label board:b belongs to shard lab2"}])
    page = operator.get("/admin/").content.decode()
    assert "failed at 2026-11-25T10:00:00+00:00: no adb on PATH (keeping its last good set, 2 hosts)" in page
    assert "refused: x&lt;1&gt;" in page and "label board:b belongs to shard lab2" in page
