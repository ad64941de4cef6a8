"""The results' admin pages: runs with their entries, rejected files, and regressions whose status
actions go through the audited service."""

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.test import Client

from common.models import HostQueueEntry
from common.result_formats import ResultFormatError
from master.admin.results import ADMIN_ENTRIES_SHOWN
from master.models import AuditRecord, Regression, RejectedResult, TestRun
from master.results.detection import drain
from master.results.ingest import record_rejection, store_result_file
from tests.master.results.factories import hour, stepped, tf_file
from tests.master.results.test_formats import raw
from tests.master.results.test_upload import many_entries
from tests.support import assert_status


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
    assert_status(operator.get(f"/admin/master/rejectedresult/{RejectedResult.objects.get().id}/change/"), 200)


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


def test_a_run_with_ten_thousand_entries_lists_only_the_first_ones(fleet, operator):
    """Issue 23: all 10,000 entries inline made a 39 MB page in 11.7 s."""
    run = store_result_file(raw(many_entries(10_000)), "big.json", acting_user=None).run
    page = operator.get(f"/admin/master/testrun/{run.id}/change/")
    assert_status(page, 200)
    text = page.content.decode()
    assert text.count('<td class="field-entry">') == ADMIN_ENTRIES_SHOWN
    assert f"this run has 10000 entries: the first {ADMIN_ENTRIES_SHOWN} by name are listed below" in text
    assert len(page.content) < 1_000_000


def test_the_compare_page_sorts_by_change_and_is_linked_from_the_job_and_the_chart(fleet, operator):
    from tests.master.results.test_compare import _ab_job

    hqe = _ab_job(fleet, repeats=6, slow={"slow_path": 1.15})
    job_page = operator.get(f"/admin/common/job/{hqe.job_id}/change/").content.decode()
    link = f"/admin/benchmarks/compare/?base={hqe.job_id}%3Abase&amp;new={hqe.job_id}%3Anew"
    assert f'id="fs-job-compare" href="{link}"' in job_page and "Compare new against base" in job_page
    page = operator.get(link.replace("&amp;", "&"))
    assert_status(page, 200)
    html = page.content.decode()
    assert html.index("slow_path") < html.index("fast_path")
    assert '<td class="fs-slower">slower</td>' in html and "1 no change, 1 slower." in html
    chart = operator.get("/admin/benchmarks/chart/?test=suite&entry=slow_path").content.decode()
    assert 'id="fs-chart-compare" href="/admin/benchmarks/compare/?test=suite"' in chart


def test_the_compare_page_shows_a_bad_side_as_one_error_and_escapes_names(fleet, operator):
    page = operator.get("/admin/benchmarks/compare/?base=<b>x&new=2").content.decode()
    assert 'class="errornote">base: &#x27;&lt;b&gt;x&#x27; is not a side' in page
    assert_status(operator.get("/admin/benchmarks/compare/"), 200)


def test_the_compare_page_takes_hostile_names_and_parameters_without_a_500(fleet, operator):
    from datetime import timedelta

    from common.ab import make_plan
    from tests.master.results.factories import T0
    from tests.master.results.test_compare import _hqe

    hqe = _hqe(fleet, ab=make_plan(["base", "new"], 6))
    evil = "<script>alert(1)</script>"
    for r in range(1, 7):
        for variant, wall in (("base", 1e-300), ("new", 1e300)):
            data = tf_file(evil, T0 + timedelta(minutes=2 * r + (variant == "new")), {evil + "&x": wall})
            store_result_file(data, f"{variant}-{r}.json", hqe=hqe, shard=fleet.lab1, acting_user=None,
                              variant=variant, repeat=r)  # fmt: skip
    page = operator.get("/admin/benchmarks/compare/", {"base": f"{hqe.job_id}:base", "new": f"{hqe.job_id}:new"})
    assert_status(page, 200)
    html = page.content.decode()
    assert evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;&amp;x" in html
    assert '<td class="fs-slower">slower</td>' in html
    for params in (
        {"base": f"{hqe.job_id}:base", "new": f"{hqe.job_id}:new", "test": "a\x00"},
        {"base": f"{hqe.job_id}:base", "new": f"{hqe.job_id}:new", "label": "\x00"},
        {"base": f"{hqe.job_id}:<script>", "new": "rev:\u202e<b>"},
        {"base": "1", "new": "2", "min_change": "1e999"},
    ):
        answer = operator.get("/admin/benchmarks/compare/", params)
        assert answer.status_code in (200, 400), params
        assert "<script>" not in answer.content.decode() and "<b>" not in answer.content.decode()
