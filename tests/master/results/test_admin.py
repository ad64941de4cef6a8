"""The results' admin pages: runs with their entries, rejected files, and regressions whose status
actions go through the audited service."""

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.test import Client

from common.models import HostQueueEntry
from master.models import AuditRecord, Regression, RejectedResult, TestRun
from master.results.detection import drain
from master.results.formats import ResultFormatError
from master.results.ingest import record_rejection, store_result_file
from tests.master.results.factories import hour, stepped, tf_file


@pytest.fixture
def operator(db):
    client = Client()
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def test_pages_render_runs_with_entries_and_rejected_files(fleet, operator):
    run = store_result_file(tf_file("t", hour(0), {"BM_one": 1.0, "BM_two": 2.0}), "a.json", acting_user=None).run
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    record_rejection(hqe, "broken.json", b"{", ResultFormatError("broken.json", "", "not JSON"))
    page = operator.get("/admin/master/testrun/").content.decode()
    assert "t" in page and "2026" in page
    detail = operator.get(f"/admin/master/testrun/{run.id}/change/").content.decode()
    assert "BM_one" in detail and "BM_two" in detail
    rejected = operator.get("/admin/master/rejectedresult/").content.decode()
    assert "broken.json" in rejected and "not JSON" in rejected
    assert operator.get(f"/admin/master/rejectedresult/{RejectedResult.objects.get().id}/change/").status_code == 200


def test_regression_status_actions_and_filter(fleet, operator):
    for i, value in enumerate(stepped(30, 10)):
        store_result_file(tf_file("t", hour(i), {"e": value}), f"{i}.json", acting_user=None)
    drain()
    reg = Regression.objects.get()
    assert "+3" in operator.get("/admin/master/regression/?status__exact=new").content.decode()
    data = {"action": "mark_acknowledged", ACTION_CHECKBOX_NAME: [str(reg.id)], "index": "0"}
    resp = operator.post("/admin/master/regression/", data, follow=True)
    assert "1 regression(s) now acknowledged" in resp.content.decode()
    reg.refresh_from_db()
    assert reg.status == "acknowledged"
    record = AuditRecord.objects.get(action="regression.set_status")
    assert (record.actor, record.details["to"]) == ("op", "acknowledged")
    assert "regression.set_status" in operator.get(f"/admin/master/regression/{reg.id}/history/").content.decode()
    assert operator.get("/admin/master/regression/?status__exact=new").context["cl"].result_count == 0
    assert TestRun.objects.count() == 40
