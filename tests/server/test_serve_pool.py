"""serve's default pool stays within a stated budget of database connections (issue 23: 2 workers per
core + 1, 4 threads each, exceeded PostgreSQL's default 100 connections from 16 cores on)."""

import pytest

from server.management.commands import serve
from server.management.commands.serve import DEFAULT_DB_CONNECTIONS, connections_per_worker, default_workers


@pytest.mark.parametrize("cores", [1, 2, 4, 8, 16, 32, 64, 128])
def test_the_default_workers_fit_the_budget_whatever_the_cores(monkeypatch, settings, cores):
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    monkeypatch.delenv("FLEETSHARD_SERVE_DB_CONNECTIONS", raising=False)
    workers = default_workers(4, cores=cores)
    assert 1 <= workers <= 2 * cores + 1
    assert workers * connections_per_worker(4) <= DEFAULT_DB_CONNECTIONS < 100
    assert workers * 4 <= 100


def test_the_master_counts_its_background_threads_and_exports(monkeypatch, settings):
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    settings.FLEETSHARD_SERVE_BACKGROUND = ["a", "b"]
    settings.FLEETSHARD_EXPORTS_PER_PROCESS = 4
    assert connections_per_worker(4) == 10
    assert default_workers(4, cores=16) == 8  # was 33: 132 connections for the threads alone
    monkeypatch.setenv("FLEETSHARD_SERVE_DB_CONNECTIONS", "400")
    assert default_workers(4, cores=16) == 33
    monkeypatch.setenv("WEB_CONCURRENCY", "40")  # an operator's choice stands; serve says if it is too many
    assert default_workers(4, cores=16) == 40


def test_max_connections_is_read_from_postgresql(db, db_vendor):
    limit = serve._max_connections()
    if db_vendor == "postgresql":
        assert isinstance(limit, int) and limit > 0
    else:
        assert limit is None


def test_serve_says_its_connections_at_start(own_master, db_vendor):
    port = own_master.url.rsplit(":", 1)[1]
    log = (own_master.role.data_dir / f"master-{port}.log").read_text()
    [line] = [x for x in log.splitlines() if "serve: 1 workers x " in x]
    assert "database connections = " in line
    assert ("PostgreSQL's max_connections: " in line) == (db_vendor == "postgresql")
