"""`fleetshard job ...` against a live server; job progress comes from real heartbeats."""

import contextlib
import json
import os
import pty
import subprocess
import sys
import threading
from itertools import count
from typing import Any

import pytest

from common.models import Host, HostQueueEntry, Job
from master import services
from master.models import AuditRecord
from tests.cli.conftest import fails, ok, syntax_or_refusal
from tests.fleet_state import snapshot
from tests.support import ROOT, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

JOB_FIELDS = {"id", "name", "owner", "priority", "status", "shard", "created_on", "hqes"}
HQE_FIELDS = {"id", "host", "meta_host", "status", "failure", "exit_code", "started_on", "finished_on"}
SEQ = count(1)


def report(heartbeat: Any, fleet: Any, job: Job, status: str, **extra: Any) -> None:
    """What the job's shard would send: one update per HQE, through the real heartbeat endpoint."""
    shard, token = (fleet.lab1, fleet.token1) if job.shard_id == fleet.lab1.id else (fleet.lab2, fleet.token2)
    # A job never uses a host twice: its HQEs run on the shard's hosts in turn.
    hosts = list(Host.objects.filter(shard=shard).order_by("id"))
    stamp = "started_on" if status == "Running" else "finished_on"
    updates = [
        {"seq": next(SEQ), "hqe": hqe.id, "job": job.id, "status": status, "host": hosts[i].id,
         stamp: "2026-11-22T10:00:00Z", **extra}
        for i, hqe in enumerate(HostQueueEntry.objects.filter(job=job).order_by("id"))
    ]  # fmt: skip
    acks = heartbeat(shard, token, updates=updates)["acks"]
    assert all(a["result"] == "accepted" for a in acks), acks


def test_job_create_routes_and_prints(cli, fleet):
    out = ok(cli("job", "create", "-c", "./run.sh", "-m", "board:a*2", "-p", "high", "smoke")).stdout
    job = Job.objects.get()
    assert out == f"Created job {job.id} (smoke) on shard lab1: 2 host queue entries, priority 70\n"
    assert (job.owner, job.priority, job.command, job.shard) == ("boss", 70, "./run.sh", fleet.lab1)


def test_job_create_json_with_every_option(cli, fleet, tmp_path):
    parent = fleet.job("suite")
    hosts = tmp_path / "hosts"
    hosts.write_text("a2\n")
    result = cli(
        "job", "create", "-c", "echo hi", "--hosts", "a1", "-M", str(hosts), "-d", "wifi", "-p", "55",
        "--timeout-mins", "30", "--max-runtime-mins", "5", "-k", "build=R120", "-k", "suite=bvt",
        "--parent", str(parent.id), "perf", "--json",
    )  # fmt: skip
    job = json.loads(ok(result).stdout)
    assert set(job) >= JOB_FIELDS and all(set(h) >= HQE_FIELDS for h in job["hqes"])
    assert (job["name"], job["owner"], job["priority"], job["shard"], job["status"]) == (
        "perf", "boss", 55, "lab1", "Queued"
    )  # fmt: skip
    assert [h["host"] for h in job["hqes"]] == ["a1", "a2"]
    assert (job["keyvals"], job["parent"], job["timeout_mins"], job["max_runtime_mins"]) == (
        {"build": "R120", "suite": "bvt"}, parent.id, 30, 5
    )  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("-m", "board:a,board:b"),
            "Error: job spans shards: meta-host board:a is served by lab1; meta-host board:b is served by lab2",
        ),
        (
            ("-m", "board:a", "-p", "urgent"),
            "Error: invalid priority 'urgent': use an integer or one of low=10, default=40, high=70, super=80",
        ),
        (("-m", "nosuch"), "Error: unknown label nosuch"),
        (("--hosts", "a1,zz"), "Error: unknown host zz"),
        (("-m", "board:a", "-d", "pool:x"), "Error: no shard can serve this job: on shard lab1, no host for"),
        (("-m", "board:a*x"), "Error: invalid meta-host 'board:a*x'"),
        (("-m", "board:a", "--parent", "4242"), "Error: unknown parent job 4242"),
    ],
)
def test_job_create_errors_change_nothing(cli, fleet, args, message):
    before = snapshot()
    fails(*syntax_or_refusal(cli("job", "create", "-c", "true", *args, "smoke"), message))
    assert snapshot() == before


AB = ("-c", "true", "-m", "board:a")


@pytest.mark.parametrize(
    "args, message",
    [
        (("-c", "true", "smoke"), "give either -m LABEL[*N] or --hosts HOST"),
        (("-c", "true", "-m", "board:a", "--hosts", "a1", "smoke"), "give either -m LABEL[*N] or --hosts HOST"),
        (("-m", "board:a", "smoke"), "Missing option '-c'"),
        (("-c", "true", "-m", "board:a", "--timeout-mins", "0", "smoke"), "Invalid value for '--timeout-mins'"),
        (("-c", "true", "-m", "board:a", "-k", "novalue", "smoke"), "'novalue' is not NAME=VALUE"),
        (
            AB + ("--variant", "c=/no/such/build", "--variant", "t", "smoke"),
            "--variant c=/no/such/build: /no/such/build",
        ),
        # A path too long to look up was a traceback (Path.exists raises ENAMETOOLONG).
        (AB + ("--variant", "c=" + "x" * 5000, "--variant", "t", "smoke"), "x... does not exist"),
        (AB + ("--variant", "a", "--variant", "b", "--variant", "c", "smoke"), "exactly 2 variants"),
        (AB + ("--variant", "a", "smoke"), "exactly 2 variants (the baseline first), not 1"),
        (AB + ("--variant", "a", "--variant", "a", "smoke"), "different names"),
        (AB + ("--variant", "../x", "--variant", "b", "smoke"), "invalid variant name '../x'"),
        (AB + ("--variant", "a", "--variant", "b", "--repeat", "0", "smoke"), "repeat: 0 repeats: use 1 to 1000"),
        (AB + ("--variant", "a", "--variant", "b", "--repeat", "10000", "smoke"), "10000 repeats: use 1 to 1000"),
        (AB + ("--variant", "a", "--variant", "b", "--repeat", "auto:2", "smoke"), "pairs for --repeat auto"),
        (AB + ("--variant", "a", "--variant", "b", "--repeat", "lots", "smoke"), "use a number, auto or auto:MAX"),
        (AB + ("--repeat", "3", "smoke"), "--repeat needs --variant"),
    ],
)
def test_job_create_bad_usage(cli, fleet, args, message):
    before = snapshot()
    fails(cli("job", "create", *args), message, code=2)
    assert snapshot() == before


def test_job_list_and_filters(cli, server, fleet):
    a = fleet.job("a")
    b = fleet.job("b", meta_hosts=[("board:b", 1)])
    ok(cli("job", "create", "-c", "true", "-m", "board:b", "c", token=server.user_token))
    lines = ok(cli("job", "list")).stdout.splitlines()
    assert lines[0].split() == ["Id", "Name", "Owner", "Priority", "Status", "Shard", "Created"]
    assert [line.split()[1] for line in lines[1:]] == ["c", "b", "a"]

    def listed(*args: str) -> list[str]:
        jobs = json.loads(ok(cli("job", "list", "--json", *args)).stdout)
        assert all(set(j) >= JOB_FIELDS for j in jobs)
        return [j["name"] for j in jobs]

    Job.objects.filter(id=b.id).update(status="Running")
    assert listed("--shard", "lab2") == ["c", "b"]
    assert listed("--status", "running") == ["b"]
    assert listed("--owner", "ana", "--shard", "lab1") == ["a"]
    assert listed("--limit", "1") == ["c"]
    assert a.id
    fails(cli("job", "list", "--shard", "nosuch"), "Error: unknown shard nosuch")


def test_job_list_says_when_it_shows_only_the_newest(cli, fleet):
    for i in range(3):
        fleet.job(f"j{i}")
    result = ok(cli("job", "list", "--limit", "2"))
    assert len(result.stdout.splitlines()) == 3
    assert "(the newest 2 of 3 jobs; --limit 0 shows all)" in result.stderr


def test_job_stat(cli, fleet):
    job = fleet.job(meta_hosts=[("board:a", 2)])
    out = ok(cli("job", "stat", str(job.id))).stdout
    assert f"Job:           {job.id}\n" in out and "Shard:         lab1\n" in out
    assert out.count("board:a    Queued") == 2
    obj = json.loads(ok(cli("job", "stat", str(job.id), "--json")).stdout)
    assert obj["id"] == job.id and len(obj["hqes"]) == 2
    fails(cli("job", "stat", "4242"), "Error: unknown job 4242")
    fails(cli("job", "stat", "x"), "Invalid value for 'ID'", code=2)


def test_job_stat_shows_the_log_tail_of_a_failed_run_and_lists_leave_it_out(cli, fleet):
    job = fleet.job()
    lines = "".join(f"step {i}\n" for i in range(30)) + "camera HAL not responding\n"
    job.hqes.update(status="Failed", failure="test", exit_code=3, log_tail=lines)
    out = ok(cli("job", "stat", str(job.id))).stdout
    assert f"Log of entry {job.hqes.get().id} on - (last 20 lines):" in out
    assert out.rstrip().endswith("camera HAL not responding") and "step 10\n" not in out and "step 11\n" in out
    obj = json.loads(ok(cli("job", "stat", str(job.id), "--json")).stdout)
    assert obj["hqes"][0]["log_tail"] == lines
    listed = json.loads(ok(cli("job", "list", "--json")).stdout)
    assert "log_tail" not in listed[0]["hqes"][0]


def test_job_output_and_names_cannot_drive_the_operators_terminal(cli, fleet):
    """A job's output (and a job's free-text name and command) went to the terminal verbatim: a hostile
    job could print escape sequences (clear the screen, retitle it, OSC 52 into the clipboard) at
    whoever ran `fleetshard job stat`. Control characters are shown escaped; --json was always safe."""
    job = fleet.job("\x1b[2Jname\u202e")
    tail = "ok\n\x1b]52;c;cm0gLXJmIH4K\x07\x1b[31mred\x9b\rfake\n"
    job.hqes.update(status="Failed", failure="test", exit_code=3, log_tail=tail)
    for args in (("job", "stat", str(job.id)), ("job", "list")):
        out = ok(cli(*args)).stdout
        assert not any(c in out for c in "\x1b\x07\x9b\r\u202e"), repr(out)
    out = ok(cli("job", "stat", str(job.id))).stdout
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b[31mred" in out and "\\x1b[2Jname\\u202e" in out
    assert json.loads(ok(cli("job", "stat", str(job.id), "--json")).stdout)["hqes"][0]["log_tail"] == tail


def test_a_newline_in_a_job_name_cannot_print_a_row_of_its_own(cli, fleet):
    """A job named "x\\n999  Completed ..." printed a second, fake row in `job list` (issue 23): a
    table's cells are on one line, their tabs and newlines shown escaped."""
    fleet.job("real\n4242  fake-job  Completed\tana")
    out = ok(cli("job", "list")).stdout
    lines = out.rstrip("\n").split("\n")
    assert len(lines) == 2, out
    assert "real\\n4242  fake-job  Completed\\tana" in lines[1]
    stat = ok(cli("job", "stat", str(Job.objects.get().id))).stdout
    assert "real\\n4242" in stat and not any(line.startswith("4242") for line in stat.splitlines())


def test_job_abort_by_owner_and_staff(cli, server, fleet):
    mine = fleet.job("mine")  # owner ana
    other = fleet.job("other")
    out = ok(cli("job", "abort", str(mine.id), token=server.user_token)).stdout
    assert out.startswith(f"Aborted job {mine.id} ")
    obj = json.loads(ok(cli("job", "abort", str(other.id), "--json")).stdout)
    assert obj["jobs"][0]["id"] == other.id and obj["jobs"][0]["aborted"] is True
    assert set(Job.objects.filter(aborted=True).values_list("id", flat=True)) == {mine.id, other.id}
    # Asked again before the shard stopped them: said so, and not recorded a second time.
    records = AuditRecord.objects.filter(action="job.abort").count()
    third = fleet.job("third")
    out = ok(cli("job", "abort", str(mine.id), str(third.id))).stdout
    assert out == (
        f"Aborted job {third.id}; job {mine.id} was already aborted (their shard stops them at its next heartbeat)\n"
    )
    assert AuditRecord.objects.filter(action="job.abort").count() == records + 1


def test_job_abort_refusals_change_nothing(cli, server, fleet, heartbeat):
    job = services.create_job(
        services.JobRequest(name="boss-job", owner="boss", command="true", meta_hosts=[("board:a", 1)]),
        acting_user=None,
    )
    done = fleet.job("done")
    report(heartbeat, fleet, done, "Completed", exit_code=0)
    before = snapshot()
    fails(cli("job", "abort", str(job.id), token=server.user_token), "Error: permission denied: only a job's owner")
    fails(cli("job", "abort", str(job.id), "4242"), "Error: unknown job 4242")
    fails(cli("job", "abort", str(done.id)), f"Error: job {done.id} (Completed) already finished")
    assert snapshot() == before


def test_job_wait_for_completed_jobs(cli, fleet, heartbeat):
    job = fleet.job()
    report(heartbeat, fleet, job, "Running")
    report(heartbeat, fleet, job, "Completed", exit_code=0)
    result = ok(cli("job", "wait", str(job.id)))
    assert result.stderr == "1 job: 1 Completed\n"
    assert result.stdout.splitlines()[1].split()[:5] == [str(job.id), "smoke", "ana", "40", "Completed"]
    obj = json.loads(ok(cli("job", "wait", str(job.id), "--json")).stdout)
    assert obj["completed"] is True and obj["timed_out"] is False and obj["jobs"][0]["status"] == "Completed"


def test_job_wait_fails_when_a_job_did_not_complete(cli, fleet, heartbeat):
    good, bad = fleet.job("good"), fleet.job("bad")
    report(heartbeat, fleet, good, "Completed", exit_code=0)
    report(heartbeat, fleet, bad, "Failed", failure="test", exit_code=3)
    result = cli("job", "wait", str(good.id), str(bad.id))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "2 jobs: 1 Completed, 1 Failed",
        f"Error: not every job completed: job {bad.id} (Failed)",
    ]
    assert [line.split()[4] for line in result.stdout.splitlines()[1:]] == ["Completed", "Failed"]


def test_job_wait_times_out(cli, fleet):
    job = fleet.job()
    result = cli("job", "wait", "--timeout", "0.5", "--interval", "0.1", str(job.id))
    assert result.exit_code == 124  # cli/errors.py: TIMED_OUT
    assert result.stderr.splitlines() == [
        "1 job: 1 Queued",
        f"Error: timed out after 0.5 s; not finished: job {job.id} (Queued)",
    ]


def test_job_wait_unknown_job(cli, fleet):
    fails(cli("job", "wait", "4242"), "Error: unknown job 4242")


def test_job_wait_shows_progress_as_the_shard_reports(server, fleet, heartbeat, tmp_path):
    job = fleet.job(meta_hosts=[("board:a", 2)])
    progress = tmp_path / "progress"
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token}
    with open(progress, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "job", "wait", "--interval", "0.1", "--timeout", "60", str(job.id)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: "1 job: 1 Queued" in progress.read_text(), what="the first progress line")
            report(heartbeat, fleet, job, "Running")
            wait_until(lambda: "1 job: 1 Running" in progress.read_text(), what="the Running line")
            report(heartbeat, fleet, job, "Completed", exit_code=0)
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0
    assert progress.read_text().splitlines() == ["1 job: 1 Queued", "1 job: 1 Running", "1 job: 1 Completed"]
    assert "Completed" in out


def test_job_wait_updates_one_line_in_place_on_a_terminal(server, fleet, heartbeat):
    job = fleet.job()
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token}
    leader, follower = pty.openpty()
    screen = bytearray()

    def read_terminal() -> None:
        with contextlib.suppress(OSError):  # EIO once the process has closed its end
            while chunk := os.read(leader, 1024):
                screen.extend(chunk)

    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "job", "wait", "--interval", "0.1", "--timeout", "60", str(job.id)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=follower, text=True,
    )  # fmt: skip
    os.close(follower)
    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        wait_until(lambda: b"1 Queued" in screen, what="the first progress line")
        report(heartbeat, fleet, job, "Completed", exit_code=0)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    os.close(leader)
    assert proc.returncode == 0
    assert bytes(screen) == b"\r\x1b[K1 job: 1 Queued\r\x1b[K1 job: 1 Completed\r\n"


def test_job_create_an_ab_job_with_a_revision(cli, fleet, tmp_path):
    build = tmp_path / "build"
    build.write_text("new")
    args = ("job", "create", "ab", "-c", "true", "-m", "board:a", "--variant", "control", "--variant", f"treat={build}")
    created = json.loads(ok(cli(*args, "--repeat", "auto:20", "--revision", "abc", "--json")).stdout)
    assert created["ab"] == {"variants": ["control", "treat"], "repeat": 20, "auto": True, "min_change": 2.0}
    assert created["keyvals"] == {"revision": "abc"}
    plain = json.loads(ok(cli("job", "create", "plain", "-c", "true", "-m", "board:a", "--json")).stdout)
    assert plain["ab"] == {}
