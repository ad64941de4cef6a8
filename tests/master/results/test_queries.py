"""GET /api/v1/results/...: tests, runs, timings and regressions, their filters and query counts."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from common.models import HostQueueEntry
from master import services
from master.models import AuditRecord, Regression, RegressionStatus, TestEntry
from master.results.changepoint import MAX_CHANGE_PCT
from master.results.detection import drain
from master.results.ingest import store_result_file
from tests.master.results.factories import hour, stepped, tf_file
from tests.support import assert_status, tokens_just_used


def store(test, start, timings, **kwargs):
    return store_result_file(tf_file(test, start, timings), "r.json", acting_user=None, **kwargs).run


def results(resp):
    assert_status(resp, 200)
    return resp.json()["results"]


@pytest.fixture
def history(fleet):
    """Test `t` with 3 runs (the last from lab1's job on a1), test `u` with one."""
    for i in range(2):
        store("t", hour(i), {"e": 1.0 + i, "f": 2.0})
    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    hqe.host = services.get_hosts(["a1"])[0]
    hqe.save(update_fields=["host"])
    store("t", hour(2), {"e": 3.0}, hqe=hqe, shard=fleet.lab1)
    store("u", hour(5), {"x": 0.5})
    return job


def test_tests_with_their_run_counts_and_latest_start(history, staff):
    assert results(staff.get("/api/v1/results/tests/")) == [
        {"test": "t", "runs": 3, "latest_start": "2026-01-01T02:00:00Z"},
        {"test": "u", "runs": 1, "latest_start": "2026-01-01T05:00:00Z"},
    ]
    since = results(staff.get("/api/v1/results/tests/?since=2026-01-01T02:00:00Z"))
    assert [(r["test"], r["runs"]) for r in since] == [("t", 1), ("u", 1)]


def test_runs_of_a_test_newest_first(history, staff):
    runs = results(staff.get("/api/v1/results/runs/?test=t"))
    assert [r["start"] for r in runs] == ["2026-01-01T02:00:00Z", "2026-01-01T01:00:00Z", "2026-01-01T00:00:00Z"]
    assert {k: runs[0][k] for k in ("job", "host", "shard", "entries", "label")} == {
        "job": history.id,
        "host": "a1",
        "shard": "lab1",
        "entries": 1,
        "label": "board:a",
    }
    assert runs[1]["entries"] == 2 and runs[1]["host"] is None
    assert len(results(staff.get("/api/v1/results/runs/?test=t&limit=1"))) == 1
    assert results(staff.get("/api/v1/results/runs/?test=nothing")) == []


def test_timings_of_one_entry_with_filters(history, staff):
    rows = results(staff.get("/api/v1/results/timings/?test=t&entry=e"))
    assert [(r["start"], r["wall_time_s"], r["host"], r["job"]) for r in rows] == [
        ("2026-01-01T02:00:00Z", 3.0, "a1", history.id),
        ("2026-01-01T01:00:00Z", 2.0, None, None),
        ("2026-01-01T00:00:00Z", 1.0, None, None),
    ]
    assert {"test", "entry", "start", "wall_time_s", "cpu_time_s", "iterations", "host", "job"} <= set(rows[0])
    by_label = results(staff.get("/api/v1/results/timings/?test=t&entry=e&label=board:a"))
    assert [r["wall_time_s"] for r in by_label] == [3.0]
    since = results(staff.get("/api/v1/results/timings/?test=t&entry=e&since=2026-01-01T01:00:00"))
    assert [r["wall_time_s"] for r in since] == [3.0, 2.0]


def test_since_takes_an_age(fleet, staff):
    now = timezone.now().replace(microsecond=0)
    store("t", now - timedelta(hours=30), {"e": 1.0})
    store("t", now - timedelta(minutes=30), {"e": 2.0})
    assert [r["runs"] for r in results(staff.get("/api/v1/results/tests/?since=24h"))] == [1]
    assert len(results(staff.get("/api/v1/results/runs/?test=t&since=2d"))) == 2


@pytest.mark.parametrize(
    "url, message",
    [
        ("/api/v1/results/runs/", "the test query parameter is required"),
        ("/api/v1/results/timings/?test=t", "the entry query parameter is required"),
        ("/api/v1/results/tests/?since=yesterday", "invalid since 'yesterday'"),
        ("/api/v1/results/regressions/?status=gone", "invalid regression status 'gone'"),
    ],
)
def test_bad_query_parameters_are_400_naming_them(fleet, staff, url, message):
    resp = staff.get(url)
    assert_status(resp, 400)
    assert message in resp.json()["error"], resp.content


def make_regression():
    for i, value in enumerate(stepped(30, 10)):
        store("t", hour(i), {"e": value})
    drain()
    return Regression.objects.get()


def test_a_regression_from_a_zero_timing_is_listed_with_a_finite_change(fleet, staff):
    """A benchmark that took 0 s (google-benchmark rounds to it) and then some time is a regression of
    no finite percentage; the JSON renderer refuses infinity, so listing regressions failed with a 500."""
    for i, value in enumerate([0.0] * 20 + [1.0] * 10):
        store("t", hour(i), {"e": value})
    drain()
    (row,) = results(staff.get("/api/v1/results/regressions/?test=t"))
    assert (row["before_s"], row["after_s"], row["change_pct"]) == (0.0, 1.0, MAX_CHANGE_PCT)


def test_regressions_list_filters_and_status_change(fleet, staff):
    reg = make_regression()
    (row,) = results(staff.get("/api/v1/results/regressions/?test=t&status=new"))
    assert {k: row[k] for k in ("id", "test", "entry", "label", "start", "status")} == {
        "id": reg.id,
        "test": "t",
        "entry": "e",
        "label": "",
        "start": "2026-01-02T06:00:00Z",
        "status": "new",
    }
    assert set(row) >= {"before_s", "after_s", "change_pct"}
    assert results(staff.get("/api/v1/results/regressions/?status=fixed")) == []
    assert results(staff.get("/api/v1/results/regressions/?test=u")) == []
    resp = staff.patch(f"/api/v1/results/regressions/{reg.id}/", {"status": "acknowledged"}, format="json")
    assert_status(resp, 200)
    assert resp.json()["status"] == "acknowledged"
    record = AuditRecord.objects.get(action="regression.set_status")
    assert (record.actor, record.details["to"]) == ("boss", "acknowledged")


def test_a_regressions_status_needs_the_change_permission(fleet, user, staff):
    reg = make_regression()
    resp = user.patch(f"/api/v1/results/regressions/{reg.id}/", {"status": "invalid"}, format="json")
    assert_status(resp, 403)
    assert "master.change_regression" in resp.json()["error"]
    bad = staff.patch(f"/api/v1/results/regressions/{reg.id}/", {"status": "gone"}, format="json")
    assert_status(bad, 400)
    assert_status(staff.patch("/api/v1/results/regressions/999999/", {"status": "new"}, format="json"), 404)
    reg.refresh_from_db()
    assert reg.status == "new"


ACK = RegressionStatus.ACKNOWLEDGED


@pytest.mark.parametrize(
    "url, expected",
    [
        # token, count, page
        ("/api/v1/results/tests/", 3),
        ("/api/v1/results/runs/?test=t", 3),
        ("/api/v1/results/timings/?test=t&entry=e", 3),
        ("/api/v1/results/regressions/", 3),
    ],
)
def test_query_counts_are_pinned_for_one_row_and_many(fleet, staff, django_assert_num_queries, url, expected):
    store("t", hour(0), {"e": 1.0})
    # acknowledged: the detector after each upload withdraws a new one the flat series does not show
    Regression.objects.create(test="t", entry="e", start=hour(0), before_s=1, after_s=2, change_pct=100, status=ACK)
    tokens_just_used()
    with django_assert_num_queries(expected):
        one = results(staff.get(url))
    for i in range(1, 30):
        store("t", hour(i), {"e": 1.0})
        Regression.objects.create(test="t", entry="e", start=hour(i), before_s=1, after_s=2, change_pct=100, status=ACK)
    tokens_just_used()
    with django_assert_num_queries(expected):
        many = results(staff.get(url))
    assert len(one) == 1 and len(many) == (1 if "tests" in url else 30)


def test_the_timings_query_reads_the_series_index(fleet):
    for i in range(40):
        store("t", hour(i), {f"e{j}": 1.0 for j in range(20)})
    for test in ("a", "b", "c"):
        store(test, hour(0), {"e1": 1.0})
    from master.results.queries import timings

    sql, params = timings("t", "e3").values_list("start", "wall_time_s")[:50].query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE master_testentry")
            cursor.execute("SET LOCAL enable_seqscan = off")  # a small table: which index would it use?
            cursor.execute("EXPLAIN " + sql, params)
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = "\n".join(str(row) for row in cursor.fetchall())
    assert "testentry_series_idx" in plan, plan
    assert TestEntry.objects.count() == 803
