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
from common.units import duration
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
    # Times in the unit the chart uses, not 3.2e-06 seconds.
    assert text.splitlines()[0].split()[:3] == ["Start", "Wall", "CPU"]
    wall = rows[-1]["wall_time_s"]
    assert f" {duration(wall)} " in text.splitlines()[-1]


def test_results_timings_of_microseconds_read_as_microseconds(cli, fleet):
    store_result_file(tf_file("tiny", hour(0), {"e": 3.2e-6}), "0.json", acting_user=None)
    text = ok(cli("results", "timings", "tiny", "e")).stdout
    assert "3.2 µs" in text.splitlines()[1] and "e-06" not in text


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
    from common.result_formats import ResultFormatError
    from master.results.ingest import record_rejection

    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    record_rejection(hqe, "broken.json", b"{", ResultFormatError("broken.json", "startTime", "not a number"))
    out = ok(cli("job", "stat", str(job.id))).stdout
    # The file named once, not `broken.json: broken.json: ...`.
    assert f"Quarantined result files:\n  entry {hqe.id} (-): broken.json: startTime: not a number\n" in out
    (shown,) = json.loads(ok(cli("job", "stat", str(job.id), "--json")).stdout)["hqes"]
    assert shown["quarantined"] == [{"name": "broken.json", "reason": "broken.json: startTime: not a number"}]
    assert shown["results"] == 0


def test_results_compare_of_an_ab_job_says_slower_on_the_slow_entry(cli, fleet):
    from tests.master.results.test_compare import _ab_job

    hqe = _ab_job(fleet, repeats=6, slow={"slow_path": 1.15})
    side = f"{hqe.job_id}"
    rows = json.loads(ok(cli("results", "compare", "--base", f"{side}:base", "--new", f"{side}:new", "--json")).stdout)
    assert [(r["entry"], r["verdict"]) for r in rows] == [("slow_path", "slower"), ("fast_path", "no change")]
    text = ok(cli("results", "compare", "--base", f"{side}:base", "--new", f"{side}:new")).stdout
    header, slow, fast = text.splitlines()
    assert header.split()[:4] == ["Test", "Entry", "Base", "s"]
    assert "slower" in slow and "+14.8%" in slow and "6/6" in slow
    assert "no change" in fast


def test_results_compare_refusals_are_one_line(cli, fleet):
    fails(cli("results", "compare", "--base", "nope", "--new", "2"), "is not a side")
    fails(cli("results", "compare", "--base", "7", "--new", "8"), "base: 7 has no results")
    result = cli("results", "compare", "--base", "1", "--new", "2", "--min-change", "-3")
    assert result.exit_code == 2 and "-3" in result.stderr


def test_job_stat_keeps_each_quarantined_file_on_its_line(cli, fleet):
    """A job names its result files: a newline (or tab) in a name must not print a line of the job's
    choosing under `Quarantined result files`, such as another entry's file; U+202E shows escaped."""
    from common.result_formats import ResultFormatError
    from master.results.ingest import record_rejection, record_shard_quarantine

    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    fake = "x.json\n  entry 999 (a1): ok.json: all good\t\u202e"
    record_shard_quarantine(hqe, fake, "not sent: a symbolic link")
    record_rejection(hqe, "b\nc.json", b"{", ResultFormatError("b\nc.json", "", "not valid JSON"))
    out = ok(cli("job", "stat", str(job.id))).stdout
    section = out.split("Quarantined result files:\n")[1].split("\n\n")[0].splitlines()
    assert sorted(section) == [
        f"  entry {hqe.id} (-): b\\nc.json: not valid JSON",
        f"  entry {hqe.id} (-): x.json\\n  entry 999 (a1): ok.json: all good\\t\\u202e: not sent: a symbolic link",
    ]
    (shown_hqe,) = json.loads(ok(cli("job", "stat", str(job.id), "--json")).stdout)["hqes"]
    shown = shown_hqe["quarantined"]
    assert sorted(item["name"] for item in shown) == sorted([fake, "b\nc.json"])
