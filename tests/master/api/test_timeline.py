"""GET /api/v1/timeline/export (a streamed trace, gzipped on request) and /timeline/stats."""

import gzip
import json

import pytest

from common.models import Host
from tests.master.timeline.factories import add_run, add_state, at
from tests.master.timeline.validate import validate
from tests.support import assert_status


@pytest.fixture
def hour(fleet):
    Host.objects.update(created_on=at(-86400))  # made now, their history is older: they existed then
    add_run("a1", 0, 600, created=0, name="ok")
    add_state("a1", "Cleaning", 600, 660)
    return add_run("b1", 100, 200, created=50, name="other")


def _body(resp):
    assert_status(resp, 200)
    return b"".join(resp.streaming_content)


def test_export_streams_a_valid_trace_with_its_filters(user, hour):
    resp = user.get("/api/v1/timeline/export", {"since": "2026-11-22T00:00:00Z"})
    assert resp["Content-Type"] == "application/json" and resp.streaming
    assert resp["Content-Disposition"].startswith('attachment; filename="timeline-')
    trace = json.loads(_body(resp))
    assert validate(trace).slices == 3
    only = json.loads(_body(user.get(f"/api/v1/timeline/export?shard=lab2&job={hour.job_id}")))
    assert [e["name"] for e in only["traceEvents"] if e["ph"] == "X"] == ["other"]


def test_export_gzipped_on_request(user, hour):
    resp = user.get("/api/v1/timeline/export", {"gzip": "true", "label": "board:a"})
    assert resp["Content-Type"] == "application/gzip"
    trace = json.loads(gzip.decompress(_body(resp)))
    assert sorted(e["name"] for e in trace["traceEvents"] if e["ph"] == "X") == ["Cleaning", "ok"]


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("shard=nowhere", 404, "unknown shard nowhere"),
        ("label=board:zz", 404, "unknown label"),
        ("job=0", 400, "invalid job id '0'"),
        ("job=99999", 404, "unknown job 99999"),
        ("since=yesterday", 400, "invalid since 'yesterday'"),
        ("until=soon", 400, "invalid until 'soon'"),
        ("since=2h&until=3h", 400, "must be after since"),
        ("since=2999-01-01T00:00:00Z", 400, "is after the master's clock"),
        ("label=%00", 400, "null characters"),
    ],
)
def test_bad_filters_are_named(user, fleet, query, status, message):
    for path in ("export", "stats"):
        resp = user.get(f"/api/v1/timeline/{path}?{query}")
        assert_status(resp, status)
        assert message in resp.json()["error"]


def test_stats_by_host_and_shard(user, hour):
    rows = user.get("/api/v1/timeline/stats", {"since": "2026-11-23T00:00:00Z", "until": "2026-11-23T01:00:00Z"})
    assert_status(rows, 200)
    a1 = next(r for r in rows.json() if r["key"] == "a1")
    assert (a1["running_s"], a1["cleaning_s"], a1["runs"], a1["idle_s"]) == (600.0, 60.0, 1, 2940.0)
    shards = user.get("/api/v1/timeline/stats?by=shard&since=2026-11-23T00:00:00Z&until=2026-11-23T01:00:00Z")
    assert [(r["key"], r["runs"], r["hosts"]) for r in shards.json()] == [("lab1", 1, 3), ("lab2", 1, 1)]
    bad = user.get("/api/v1/timeline/stats?by=job")
    assert_status(bad, 400)
    assert "invalid by 'job'" in bad.json()["error"]


def test_a_token_is_needed(anonymous, fleet):
    assert_status(anonymous.get("/api/v1/timeline/export"), 401)
    assert_status(anonymous.get("/api/v1/timeline/stats"), 401)
