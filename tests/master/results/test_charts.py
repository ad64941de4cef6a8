"""The admin's Benchmarks pages: tests, a test's entries, one entry's chart data; for staff with the
results' view right only, names escaped everywhere, and a fixed number of queries per page."""

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils.http import urlencode

from common.models import HostQueueEntry
from master.models import Regression, TestRun
from master.results.charts import seconds
from master.results.detection import drain
from master.results.ingest import store_result_file
from tests.master.results.factories import hour, stepped, tf_file
from tests.support import assert_status

HOSTILE = "<script>alert('x')</script>&\"q\" /../?a=1#f"


@pytest.fixture
def operator(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def hqe_on(fleet: Any, host: str) -> HostQueueEntry:
    job = fleet.job(f"bench-{host}", hosts=[host], meta_hosts=[])
    return HostQueueEntry.objects.get(job=job)


@pytest.fixture
def two_boards(fleet: Any) -> dict[str, Any]:
    """Test `nightly`, entry `BM_copy` on two boards: board:a steps up 30% after 30 runs, board:b stays."""
    on_a, on_b = hqe_on(fleet, "a1"), hqe_on(fleet, "b1")
    for i, value in enumerate(stepped(30, 10)):
        store_result_file(
            tf_file("nightly", hour(2 * i), {"BM_copy": value, "BM_sort": 2.0}), "a.json", hqe=on_a, acting_user=None
        )
    for i, value in enumerate(stepped(20, 0)):
        store_result_file(tf_file("nightly", hour(2 * i + 1), {"BM_copy": value}), "b.json", hqe=on_b, acting_user=None)
    drain()
    return {"a_job": on_a.job_id, "b_job": on_b.job_id}


def chart_data(page: str) -> dict[str, Any]:
    found = re.search(r'<script id="fs-chart-data" type="application/json">(.*?)</script>', page, re.S)
    assert found, page[:2000]
    return json.loads(found.group(1))


def test_tests_then_entries_then_a_chart_with_two_boards_and_the_regression(two_boards, operator):
    tests = operator.get("/admin/benchmarks/").content.decode()
    assert '<a href="/admin/benchmarks/entries/?test=nightly">nightly</a>' in tests
    row = re.search(r'<tr class="fs-test">(.*?)</tr>', tests, re.S).group(1)
    assert re.findall(r"<td>(.*?)</td>", row)[1:] == ["60", f"{hour(78):%Y-%m-%d %H:%M:%S}", "<strong>1</strong>"]

    entries = operator.get("/admin/benchmarks/entries/?test=nightly").content.decode()
    rows = re.findall(r'<tr class="fs-entry">(.*?)</tr>', entries, re.S)
    assert len(rows) == 2
    copy = re.findall(r"<td>(.*?)</td>", rows[0], re.S)
    assert copy[0] == '<a href="/admin/benchmarks/chart/?test=nightly&amp;entry=BM_copy">BM_copy</a>'
    assert copy[1:] == ["60", "2", f"{hour(78):%Y-%m-%d %H:%M:%S}", "<strong>1</strong>"]
    assert re.findall(r"<td>(.*?)</td>", rows[1], re.S)[1:] == ["40", "1", f"{hour(78):%Y-%m-%d %H:%M:%S}", "0"]

    page = operator.get("/admin/benchmarks/chart/?test=nightly&entry=BM_copy").content.decode()
    data = chart_data(page)
    assert [s["label"] for s in data["series"]] == ["board:a", "board:b"]
    board_a, board_b = (s["points"] for s in data["series"])
    assert len(board_a) == 40 and len(board_b) == 20
    assert [p[0] for p in board_a] == [hour(2 * i).timestamp() for i in range(40)]  # oldest first
    assert board_a[0][1:] == [stepped(30, 10)[0], f"/admin/common/job/{two_boards['a_job']}/change/", "a1"]
    assert board_b[-1][2:] == [f"/admin/common/job/{two_boards['b_job']}/change/", "b1"]
    reg = Regression.objects.get()
    assert data["regressions"] == [
        {
            "label": "board:a",
            "start": hour(60).timestamp(),
            "change_pct": round(reg.change_pct, 2),
            "status": "new",
            "url": f"/admin/master/regression/{reg.id}/change/",
        }
    ]
    assert "60 timings on 2 board labels." in page
    assert f'<a href="/admin/master/regression/{reg.id}/change/">{hour(60):%Y-%m-%d %H:%M:%S}</a>' in page
    assert "/static/master/vendor/uplot/uPlot.iife.min.js" in page and "/static/master/benchmarks.js" in page


def test_the_vendored_chart_library_is_served_by_the_static_files(operator, live_server):
    import requests

    js = requests.get(live_server.url + "/static/master/vendor/uplot/uPlot.iife.min.js", timeout=60)
    assert_status(js, 200)
    assert js.text.startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert_status(requests.get(live_server.url + "/static/master/vendor/uplot/uPlot.min.css", timeout=60), 200)


def test_an_upload_without_a_job_has_no_link_and_no_board(operator):
    store_result_file(tf_file("solo", hour(0), {"e": 1.0}), "s.json", acting_user=None)
    data = chart_data(operator.get("/admin/benchmarks/chart/?test=solo&entry=e").content.decode())
    assert data["series"] == [{"label": "", "points": [[hour(0).timestamp(), 1.0, None, None]]}]


def test_hostile_names_are_escaped_on_every_page(operator):
    store_result_file(tf_file(HOSTILE, hour(0), {HOSTILE: 1.0}), "h.json", acting_user=None)
    query = urlencode({"test": HOSTILE, "entry": HOSTILE})
    pages = [
        operator.get("/admin/benchmarks/").content.decode(),
        operator.get("/admin/benchmarks/entries/?" + urlencode({"test": HOSTILE})).content.decode(),
        operator.get("/admin/benchmarks/chart/?" + query).content.decode(),
        operator.get(f"/admin/master/testrun/{TestRun.objects.get().id}/change/").content.decode(),
    ]
    for page in pages:
        assert "<script>alert" not in page
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;q&quot;" in page
    # Links carry the names percent-encoded, so they come back whole.
    assert f'href="/admin/benchmarks/chart/?{query.replace("&", "&amp;")}"' in pages[3]
    data = chart_data(pages[2])
    assert (data["test"], data["entry"]) == (HOSTILE, HOSTILE)
    assert "\\u003Cscript\\u003E" in pages[2]


def test_missing_names_are_400_and_unknown_ones_404(operator):
    store_result_file(tf_file("t", hour(0), {"e": 1.0}), "t.json", acting_user=None)
    assert_status(operator.get("/admin/benchmarks/entries/"), 400)
    missing = operator.get("/admin/benchmarks/chart/?test=t")
    assert (missing.status_code, missing.content.decode()) == (
        400,
        "missing query parameter entry: name the test (and entry) to show",
    )
    assert_status(operator.get("/admin/benchmarks/entries/?test=nope"), 404)
    assert_status(operator.get("/admin/benchmarks/chart/?test=t&entry=nope"), 404)


@pytest.mark.parametrize(
    "path", ["/admin/benchmarks/", "/admin/benchmarks/entries/?test=t", "/admin/benchmarks/chart/?test=t&entry=e"]
)
def test_pages_are_for_staff_with_the_results_view_right(db, path):
    store_result_file(tf_file("t", hour(0), {"e": 1.0}), "t.json", acting_user=None)
    anonymous = Client()
    assert_status(anonymous.get(path), 302)
    person = Client()
    person.force_login(User.objects.create_user("ana", "ana@example.com", "pw"))
    resp = person.get(path)
    assert (resp.status_code, resp["Location"].split("?")[0]) == (302, "/admin/login/")
    staff = Client()
    clerk = User.objects.create_user("clerk", "clerk@example.com", "pw", is_staff=True)
    staff.force_login(clerk)
    assert_status(staff.get(path), 403)
    assert "fs-benchmarks-link" not in staff.get("/admin/").content.decode()
    clerk.user_permissions.add(Permission.objects.get(codename="view_testrun"))
    assert_status(staff.get(path), 200)
    assert "fs-benchmarks-link" in staff.get("/admin/").content.decode()


def test_run_and_regression_pages_link_to_the_charts(two_boards, operator):
    run = TestRun.objects.filter(label="board:a").first()
    page = operator.get(f"/admin/master/testrun/{run.id}/change/").content.decode()
    assert '<a href="/admin/benchmarks/entries/?test=nightly">' in page
    assert '<a href="/admin/benchmarks/chart/?test=nightly&amp;entry=BM_copy">chart</a>' in page
    reg = Regression.objects.get()
    page = operator.get(f"/admin/master/regression/{reg.id}/change/").content.decode()
    assert '<a href="/admin/benchmarks/chart/?test=nightly&amp;entry=BM_copy">' in page
    assert '<a href="/admin/benchmarks/">' in operator.get("/admin/").content.decode()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # session and user, then: tests and open regressions; entries and open regressions;
        # timings and regressions.
        ("/admin/benchmarks/", 4),
        ("/admin/benchmarks/entries/?test=nightly", 4),
        ("/admin/benchmarks/chart/?test=nightly&entry=BM_copy", 4),
    ],
)
def test_query_counts_are_pinned(fleet, two_boards, operator, django_assert_num_queries, path, expected):
    operator.get(path)  # warm the content types and permissions caches
    with django_assert_num_queries(expected):
        assert_status(operator.get(path), 200)
    # More runs and regressions cost nothing more.
    on_a2 = hqe_on(fleet, "a2")
    for i in range(5):
        store_result_file(tf_file("nightly", hour(100 + i), {"BM_copy": 1.0}), "c.json", hqe=on_a2, acting_user=None)
    Regression.objects.create(
        test="nightly", entry="BM_copy", label="board:b", start=hour(7), before_s=1, after_s=2, change_pct=100
    )
    with django_assert_num_queries(expected):
        assert_status(operator.get(path), 200)


@pytest.mark.parametrize(
    ("value", "shown"),
    [(2.5, "2.5 s"), (0.0125, "12.5 ms"), (2.4e-6, "2.4 µs"), (3.25e-9, "3.25 ns"), (0.0, "0 s")],
)
def test_times_show_in_the_unit_that_fits(value, shown):
    assert seconds(value) == shown
