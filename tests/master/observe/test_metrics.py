"""Prometheus metrics at /metrics: read from the database, for signed-in people only."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from master import services
from tests.support import assert_status


def scrape(client, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert_status(resp, 200)
    assert resp["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.content.decode())
        for s in family.samples
    }


def test_metrics_show_shards_hosts_and_jobs(fleet, heartbeat, client):
    _, token = services.create_personal_token("watcher", acting_user=None)
    hqe = fleet.job().hqes.get()
    services.lock_hosts(["a2"], "usb", acting_user=None)
    heartbeat(fleet.lab1, fleet.token1, updates=[{"seq": 1, "hqe": hqe.id, "job": hqe.job_id, "status": "Running"}])
    m = scrape(client, token)
    assert m[("fleetshard_shard_up", (("shard", "lab1"),))] == 1
    assert m[("fleetshard_shard_up", (("shard", "lab2"),))] == 0
    assert m[("fleetshard_shard_updates_applied_total", (("shard", "lab1"),))] == 1
    assert m[("fleetshard_hosts", (("locked", "false"), ("shard", "lab1"), ("status", "Ready")))] == 2
    assert m[("fleetshard_hosts", (("locked", "true"), ("shard", "lab1"), ("status", "Ready")))] == 1
    assert m[("fleetshard_hosts", (("locked", "false"), ("shard", ""), ("status", "Ready")))] == 1
    assert m[("fleetshard_jobs", (("shard", "lab1"), ("status", "Running")))] == 1


def test_metrics_need_a_person(fleet, client):
    assert client.get("/metrics").status_code in (401, 403)
    resp = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {fleet.token1}")
    assert_status(resp, 401)
    assert b"shard token" in resp.content


def test_metrics_cost_does_not_grow_with_the_fleet(fleet, client):
    _, token = services.create_personal_token("watcher", acting_user=None)
    scrape(client, token)  # the first use of a token records it (Token.last_used), once in 5 minutes
    counts = []
    for n in (1, 100):
        services.create_hosts([f"m{n}-{i}" for i in range(n)], labels=["board:b"], acting_user=None)
        for i in range(n):
            fleet.job(f"m{n}-{i}", meta_hosts=[("board:b", 1)])
        with CaptureQueriesContext(connection) as ctx:
            scrape(client, token)
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1], counts
