"""What writes events to the outbox, and what it costs: the detector's confirmed regressions, a
heartbeat's failed repairs and ended jobs, host discovery's Missing hosts (docs/notifications.md)."""

import pytest

from common.models import Host
from master.notify import events
from master.notify.models import NotificationEvent
from master.results.changepoint import NOTIFY_SCORE
from master.results.models import Regression
from master.results.regressions import set_regression_status
from tests.master.results.factories import stepped
from tests.master.results.test_regressions import brief_slowdown, upload_series

pytestmark = pytest.mark.django_db


def kinds() -> list[str]:
    return list(NotificationEvent.objects.order_by("id").values_list("kind", flat=True))


def test_a_clear_regression_is_notified_once_and_its_fix_too():
    upload_series(stepped(30, 10))
    reg = Regression.objects.get()
    assert reg.notified_on is not None and kinds() == ["regression.new"]
    (event,) = NotificationEvent.objects.all()
    assert event.data["regression"] == reg.id and event.data["test"] == "t" and event.data["change_pct"] > 25
    upload_series(stepped(0, 5, before=1.3), offset=40)  # still slow: nothing more to say
    assert kinds() == ["regression.new"]
    upload_series(stepped(12, 0), offset=45)  # back down: fixed
    assert Regression.objects.get().status == "fixed"
    assert kinds() == ["regression.new", "regression.fixed"]


def test_a_regression_the_detector_withdraws_is_never_notified():
    first, rest = brief_slowdown()
    upload_series(first)
    assert Regression.objects.get().notified_on is None  # raised, not confirmed
    upload_series(rest, offset=len(first))
    assert not Regression.objects.exists() and kinds() == []
    assert NOTIFY_SCORE > 3.3


def test_fixing_by_hand_sends_fixed_only_for_a_notified_regression():
    first, _ = brief_slowdown()
    upload_series(first)
    quiet = Regression.objects.get()
    set_regression_status(quiet.id, "fixed", acting_user=None)
    assert kinds() == []
    upload_series(stepped(30, 10), entry="loud")
    loud = Regression.objects.get(entry="loud")
    set_regression_status(loud.id, "fixed", acting_user=None)
    assert kinds() == ["regression.new", "regression.fixed"]


def test_a_host_entering_repair_failed_is_one_event(fleet, heartbeat):
    a1 = Host.objects.get(hostname="a1")
    report = {"known_hosts": [{"id": a1.id, "version": a1.version, "status": "Repair Failed"}]}
    heartbeat(fleet.lab1, fleet.token1, **report)
    heartbeat(fleet.lab1, fleet.token1, **report)  # still failed: said once
    (event,) = NotificationEvent.objects.all()
    assert event.kind == "host.repair_failed" and event.data["host"] == "a1" and event.data["shard"] == "lab1"
    assert sorted(event.labels) == ["board:a", "wifi"]


def test_a_job_ends_when_its_last_hqe_does(fleet, heartbeat):
    job = fleet.job("pair", meta_hosts=[("board:a", 2)])
    first, second = job.hqes.order_by("id")
    hosts = {h["hostname"]: h["id"] for h in heartbeat(fleet.lab1, fleet.token1)["hosts"]}
    heartbeat(
        fleet.lab1,
        fleet.token1,
        updates=[
            {"seq": 1, "hqe": first.id, "job": job.id, "status": "Running", "host": hosts["a1"]},
            {"seq": 2, "hqe": first.id, "job": job.id, "status": "Completed", "exit_code": 0},
        ],
    )
    assert kinds() == []
    heartbeat(
        fleet.lab1,
        fleet.token1,
        updates=[
            {"seq": 3, "hqe": second.id, "job": job.id, "status": "Running", "host": hosts["a2"]},
            {"seq": 4, "hqe": second.id, "job": job.id, "status": "Failed", "failure": "test", "exit_code": 1},
        ],
    )
    (event,) = NotificationEvent.objects.all()
    assert (event.kind, event.owner, event.labels) == ("job.ended", "ana", ["board:a"])
    assert (event.data["job"], event.data["status"], event.data["shard"]) == (job.id, "Failed", "lab1")


def test_the_cost_of_an_event_is_pinned(fleet, django_assert_num_queries):
    job = fleet.job()
    with django_assert_num_queries(1):
        events.jobs_ended([job.id])  # still queued: one read, nothing written
    with django_assert_num_queries(0):
        events.jobs_ended([])
        events.host_statuses([(1, "Ready", "Ready"), (2, "Ready", "Running")])
    host = Host.objects.get(hostname="a1")
    with django_assert_num_queries(3):  # the host's labels, the host, the INSERT
        events.host_missing([host.id])
    assert kinds() == ["host.missing"]
    assert NotificationEvent.objects.get().data["status"] == "Missing"
