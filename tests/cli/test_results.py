"""`fleetshard results ...` against a live server: tests, runs, timings (with a sparkline on a
terminal), regressions and their status."""

import json
import os
import pty
import subprocess
import sys

import pytest

from cli.results import sparkline
from common.models import HostQueueEntry
from master import services
from master.models import AuditRecord, Regression
from master.results.detection import drain
from master.results.ingest import store_result_file
from tests.cli.conftest import fails, ok
from tests.master.results.factories import hour, stepped, tf_file
from tests.support import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stored(fleet):
    """Test `t`: 40 runs of entry `e` stepping up at run 30, the last from lab1's job on a1."""
    values = stepped(30, 10)
    for i, value in enumerate(values[:-1]):
        store_result_file(tf_file("t", hour(i), {"e": value}), f"{i}.json", acting_user=None)
    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    hqe.host = services.get_hosts(["a1"])[0]
    hqe.save(update_fields=["host"])
    store_result_file(tf_file("t", hour(39), {"e": values[-1]}), "39.json", hqe=hqe, shard=fleet.lab1, acting_user=None)
    drain()
    return job


def test_results_tests_and_runs(cli, stored):
    tests = json.loads(ok(cli("results", "tests", "--json")).stdout)
    assert tests == [{"test": "t", "runs": 40, "latest_start": "2026-01-02T15:00:00Z"}]
    runs = json.loads(ok(cli("results", "runs", "t", "--limit", "2", "--json")).stdout)
    assert [set(r) >= {"id", "test", "start", "job", "hqe", "host", "shard", "entries"} for r in runs] == [True, True]
    assert (runs[0]["job"], runs[0]["host"], runs[0]["shard"]) == (stored.id, "a1", "lab1")
    table = ok(cli("results", "runs", "t", "--since", "2026-01-02T14:00:00Z")).stdout
    assert table.splitlines()[0].split() == ["Id", "Start", "Entries", "Job", "HQE", "Host", "Shard"]
    assert len(table.splitlines()) == 3 and "a1" in table


def test_results_timings_json_and_table(cli, stored):
    rows = json.loads(ok(cli("results", "timings", "t", "e", "--limit", "3", "--json")).stdout)
    assert [r["start"] for r in rows] == ["2026-01-02T13:00:00Z", "2026-01-02T14:00:00Z", "2026-01-02T15:00:00Z"]
    assert set(rows[0]) >= {"test", "entry", "start", "wall_time_s", "cpu_time_s", "iterations", "host", "job"}
    assert (rows[-1]["host"], rows[-1]["job"]) == ("a1", stored.id)
    labelled = json.loads(ok(cli("results", "timings", "t", "e", "--label", "board:a", "--json")).stdout)
    assert len(labelled) == 1
    text = ok(cli("results", "timings", "t", "e", "--limit", "0")).stdout
    assert len(text.splitlines()) == 41 and "▁" not in text  # not a terminal: no sparkline


def test_results_timings_draws_a_sparkline_on_a_terminal(server, stored):
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token, "COLUMNS": "200"}
    leader, follower = pty.openpty()
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "results", "timings", "t", "e", "--limit", "0"],
        cwd=ROOT,
        env=env,
        stdout=follower,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.returncode == 0, proc.stderr
    last = out.decode().splitlines()[-1]
    assert len(last) == 40 and set(last[:30]) <= set("▁▂") and set(last[30:]) <= set("▇█"), last


def test_sparkline_scales_from_lowest_to_highest():
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([2.0, 2.0]) == "▁▁" and sparkline([]) == ""


def test_results_regressions_and_set_status(cli, stored):
    reg = Regression.objects.get()
    rows = json.loads(ok(cli("results", "regressions", "--status", "new", "--json")).stdout)
    assert [(r["id"], r["test"], r["entry"], r["status"]) for r in rows] == [(reg.id, "t", "e", "new")]
    assert set(rows[0]) >= {"id", "test", "entry", "label", "start", "before_s", "after_s", "change_pct", "status"}
    assert "+3" in ok(cli("results", "regressions", "--test", "t")).stdout
    out = ok(cli("results", "set-status", str(reg.id), "acknowledged")).stdout
    assert out.strip() == f"regression {reg.id} (t / e) is acknowledged"
    record = AuditRecord.objects.get(action="regression.set_status")
    assert (record.actor, record.details["to"]) == ("boss", "acknowledged")
    assert json.loads(ok(cli("results", "regressions", "--status", "new", "--json")).stdout) == []


def test_results_errors(cli, server, stored):
    reg = Regression.objects.get()
    fails(cli("results", "set-status", str(reg.id), "invalid", token=server.user_token), "master.change_regression")
    fails(cli("results", "set-status", "999999", "fixed"), "unknown regression 999999")
    fails(cli("results", "set-status", str(reg.id), "gone"), "'gone' is not one of", code=2)
    fails(cli("results", "tests", "--since", "yesterday"), "invalid since 'yesterday'")
    assert Regression.objects.get().status == "new"


def test_job_stat_shows_quarantined_result_files(cli, fleet):
    from master.results.formats import ResultFormatError
    from master.results.ingest import record_rejection

    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    record_rejection(hqe, "broken.json", b"{", ResultFormatError("broken.json", "startTime", "not a number"))
    out = ok(cli("job", "stat", str(job.id))).stdout
    assert f"Quarantined result files:\n  entry {hqe.id} (-): broken.json: broken.json: startTime: not a number" in out
    (shown,) = json.loads(ok(cli("job", "stat", str(job.id), "--json")).stdout)["hqes"]
    assert shown["quarantined"] == [{"name": "broken.json", "reason": "broken.json: startTime: not a number"}]
    assert shown["results"] == 0
