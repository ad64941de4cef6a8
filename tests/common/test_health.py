"""/healthz and /readyz: no token, nothing secret, and readiness that follows the database."""

import json

import pytest
import requests
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

from tests.support import Role, assert_status, free_port, stop, wait_until


@pytest.mark.django_db
def test_healthz_answers_without_a_token(client):
    resp = client.get("/healthz")
    assert_status(resp, 200)
    assert resp.json() == {"status": "ok"}
    assert "no-cache" in resp["Cache-Control"]


@pytest.mark.django_db
def test_readyz_is_ready_on_a_migrated_database(client):
    resp = client.get("/readyz")
    assert_status(resp, 200)
    assert resp.json() == {"status": "ready", "database": "ok", "migrations": "ok"}


@pytest.mark.django_db
def test_readyz_is_not_ready_while_a_migration_is_pending(client):
    leaf = next(node for node in MigrationLoader(connection).graph.leaf_nodes() if node[0] == "master")
    MigrationRecorder.Migration.objects.filter(app=leaf[0], name=leaf[1]).delete()
    resp = client.get("/readyz")
    assert_status(resp, 503)
    assert resp.json()["status"] == "not ready" and resp.json()["migrations"].endswith("pending")


@pytest.mark.django_db
def test_probes_refuse_anything_but_get(client):
    assert_status(client.post("/healthz"), 405)
    assert_status(client.post("/readyz"), 405)


@pytest.mark.django_db
@pytest.mark.urls("server.urls.shard")
def test_the_shards_own_admin_has_the_probes_too(client):
    assert_status(client.get("/healthz"), 200)
    assert_status(client.get("/readyz"), 200)


def test_readyz_says_unreachable_and_leaks_nothing_when_the_database_is_gone(tmp_path):
    """A served master whose PostgreSQL is down: alive, not ready, and no URL, host or error text."""
    dead = free_port()
    secret = "s3cr3t-password"
    role = Role("master", f"postgres://fleet:{secret}@127.0.0.1:{dead}/fleetdb", tmp_path)
    port = free_port()
    proc = role.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "1", log_name="serve.log")
    base = f"http://127.0.0.1:{port}"

    def healthz() -> requests.Response | None:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            return requests.get(base + "/healthz", timeout=5)
        except requests.RequestException:
            return None

    try:
        assert_status(wait_until(healthz, timeout=60, what="the master to serve"), 200)
        resp = requests.get(base + "/readyz", timeout=30)
        assert_status(resp, 503)
        assert resp.json() == {"status": "not ready", "database": "unreachable", "migrations": "unknown"}
        body = json.dumps(resp.json())
        assert secret not in body and str(dead) not in body and "fleetdb" not in body
    finally:
        stop(proc)
