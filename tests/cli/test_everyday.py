"""The first hour of a lab engineer (issue 28): what the command line says where it used to stumble.

Each test runs the real command against a live server on loopback: in-process with click's runner, or
as a separate process where the terminal's encoding or a pipe's reader is what is tested.
"""

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from cli.output import Clock, shown_time
from common.ab import make_plan
from common.constants import HQEStatus
from common.models import Host, HostQueueEntry, Job, Shard
from master import services
from master.blobs.models import Blob
from master.logs.store import append_log
from master.models import AuditRecord
from tests.cli.conftest import fails, ok
from tests.fleet_state import snapshot
from tests.support import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def process_env(server, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_")}
    return env | {"FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token, **more}


def test_a_terminal_that_is_not_utf8_gets_every_line_with_escapes(server, fleet):
    fleet.job("h\u00e9llo \u2713")
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "job", "list"],
        cwd=ROOT,
        env=process_env(server, PYTHONIOENCODING="latin-1"),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "h\u00e9llo \\u2713".encode("latin-1") in proc.stdout
    assert proc.stderr == b""


@pytest.mark.parametrize("follow", ["", "--follow"])
def test_a_pipe_whose_reader_left_ends_the_command_quietly(server, fleet, follow):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    big = b"".join(b"line %07d\n" % n for n in range(200_000))
    for start in range(0, len(big), 200_000):
        append_log(hqe.id, start, big[start : start + 200_000], final=start + 200_000 >= len(big))
    command = f"{sys.executable} -m cli.main job log {follow} {hqe.job_id} | head -n 1; echo ${{PIPESTATUS[0]}} >&2"
    proc = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=process_env(server), capture_output=True, text=True, timeout=60
    )
    assert proc.stdout == "line 0000000\n"
    assert proc.stderr == "141\n"  # as if SIGPIPE ended it, like any Unix filter


def test_job_log_says_when_an_ended_entrys_log_is_not_all_there(cli, fleet):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    append_log(hqe.id, 0, b"1\n2\n3\n")
    HostQueueEntry.objects.filter(id=hqe.id).update(status=HQEStatus.COMPLETED)
    result = cli("job", "log", str(hqe.job_id))
    assert result.exit_code == 75, result.stderr
    assert result.stdout == "1\n2\n3\n"
    assert result.stderr.startswith(
        f"[fleetshard] incomplete: job {hqe.job_id} entry {hqe.id} ended (Completed) but its shard has shipped only "
        "6 bytes of its log so far"
    )
    append_log(hqe.id, 6, b"4\n", final=True)
    assert ok(cli("job", "log", str(hqe.job_id))).stdout == "1\n2\n3\n4\n"


def test_job_log_follow_stops_when_the_entrys_shard_is_offline(cli, fleet, monkeypatch):
    monkeypatch.setattr("cli.job_log.SHARD_CHECK_S", 1.0)
    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    HostQueueEntry.objects.filter(id=hqe.id).update(status=HQEStatus.RUNNING)
    append_log(hqe.id, 0, b"started\n")
    assert Shard.objects.get(hostname="lab1").status == "offline"  # it never sent a heartbeat
    started = time.monotonic()
    result = cli("job", "log", "--follow", str(job.id))
    assert time.monotonic() - started < 20
    assert result.stdout == "started\n"
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: shard lab1 is offline (last heartbeat: never): the log of job {job.id} entry {hqe.id} stops here"
    )
    assert result.stderr.count("\n") == 1


def test_job_log_on_a_job_of_several_entries_names_the_option(cli, fleet):
    job = fleet.job(meta_hosts=[("board:a", 2)])
    fails(cli("job", "log", str(job.id)), f"job {job.id} has 2 entries: name one with --hqe N")
    assert Job.objects.count() == 1


def test_times_read_one_way_on_the_terminal_local_or_utc_and_iso_in_json(server, fleet):
    job = fleet.job()
    created = job.created_on.astimezone(UTC)

    def run(*args: str, tz: str = "UTC") -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "cli.main", *args],
            cwd=ROOT,
            env=process_env(server, TZ=tz),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    utc_text = created.strftime("%Y-%m-%d %H:%M:%S")
    tokyo_text = (created + timedelta(hours=9)).strftime("%Y-%m-%d %H:%M:%S")
    assert f"Created:       {tokyo_text}\n" in run("job", "stat", str(job.id), tz="Asia/Tokyo")
    assert f"Created:       {utc_text}\n" in run("job", "stat", str(job.id), "--utc", tz="Asia/Tokyo")
    assert run("--utc", "job", "list", tz="Asia/Tokyo").splitlines()[1].endswith(utc_text)
    assert run("job", "list", tz="Asia/Tokyo").splitlines()[1].endswith(tokyo_text)
    as_json = json.loads(run("job", "stat", str(job.id), "--json", tz="Asia/Tokyo"))
    assert datetime.fromisoformat(as_json["created_on"]) == created
    assert as_json["created_on"].endswith("Z")


def test_job_rerun_makes_a_new_job_of_the_same_spec_owned_by_the_caller_and_audited(cli, server, fleet):
    first = services.create_job(
        services.JobRequest(
            name="nightly",
            owner="boss",
            command="run-suite",
            meta_hosts=[("board:a", 2)],
            dependency_labels=["wifi"],
            priority=70,
            keyvals={"build": "42"},
        ),
        acting_user=None,
    )
    out = ok(cli("job", "rerun", str(first.id), token=server.user_token)).stdout
    again = Job.objects.exclude(id=first.id).get()
    assert out == (
        f"Created job {again.id} (nightly), a rerun of job {first.id}, on shard lab1: "
        "2 host queue entries, priority 70\n"
    )
    assert (again.owner, again.command, again.priority, again.keyvals, again.rerun_of_id) == (
        "ana",
        "run-suite",
        70,
        {"build": "42"},
        first.id,
    )
    assert [label.name for label in again.dependency_labels.all()] == ["wifi"]
    assert sorted(h.meta_host.name for h in again.hqes.all()) == ["board:a", "board:a"]
    record = AuditRecord.objects.filter(action="job.create").order_by("-id").first()
    assert record.details["rerun_of"] == first.id and record.actor == "ana"
    stat = json.loads(ok(cli("job", "stat", str(again.id), "--json")).stdout)
    assert stat["rerun_of"] == first.id
    assert f"Rerun of:      {first.id}\n" in ok(cli("job", "stat", str(again.id))).stdout


def test_job_rerun_of_named_hosts_and_of_an_unknown_job(cli, fleet):
    first = services.create_job(
        services.JobRequest(name="pinned", owner="ana", command="true", hosts=["a1", "a3"]), acting_user=None
    )
    ok(cli("job", "rerun", str(first.id)))
    again = Job.objects.exclude(id=first.id).get()
    assert sorted(h.host.hostname for h in again.hqes.all()) == ["a1", "a3"]
    before = Job.objects.count()
    fails(cli("job", "rerun", "4242"), "Error: unknown job 4242")
    assert Job.objects.count() == before


def test_job_rerun_keeps_the_ab_plan_and_the_inputs(cli, fleet):
    """A rerun of an A/B job with inputs is that A/B job again: the same plan, the same blobs."""
    digest = "ab" * 32
    Blob.objects.create(digest=digest, size=3)
    inputs = [{"name": "model", "digest": digest, "size": 3, "kind": "file"}]
    first = services.create_job(
        services.JobRequest(
            name="ab", owner="ana", command="bench", hosts=["a1"], ab=make_plan(["base", "new"], 3), inputs=inputs
        ),
        acting_user=None,
    )
    ok(cli("job", "rerun", str(first.id)))
    again = Job.objects.exclude(id=first.id).get()
    assert (again.ab, again.inputs) == (first.ab, first.inputs)
    assert again.ab["variants"] == ["base", "new"] and again.inputs == inputs
    Blob.objects.all().delete()  # purged since: the rerun says what is missing and makes nothing
    before = Job.objects.count()
    fails(cli("job", "rerun", str(first.id)), f"input model: the master has no blob {digest}")
    assert Job.objects.count() == before


def test_host_mod_sets_and_removes_attributes_audited_and_seen_by_the_shard(cli, fleet):
    before = Host.objects.get(hostname="a1").version
    out = ok(cli("host", "mod", "--attribute", "serial=X1", "-i", "adb.port=5555", "a1", "a2")).stdout
    assert out == "Attributes of hosts a1, a2: serial=X1, adb.port=5555\n"
    assert Host.objects.get(hostname="a1").attributes == {"serial": "X1", "adb.port": "5555"}
    assert Host.objects.get(hostname="a1").version > before  # the shard gets them at its next heartbeat
    out = ok(cli("host", "mod", "--remove-attribute", "adb.port", "-i", "serial=X9", "a1")).stdout
    assert out == "Attributes of hosts a1: serial=X9; removed adb.port\n"
    assert Host.objects.get(hostname="a1").attributes == {"serial": "X9"}
    record = AuditRecord.objects.filter(action="host.set_attributes").order_by("-id").first()
    assert record.details == {"set": {"serial": "X9"}, "removed": ["adb.port"]}
    before = snapshot()
    fails(cli("host", "mod", "--remove-attribute", "nope", "a1", "a2"), "Error: host a1 has no attribute nope")
    fails(cli("host", "mod", "-i", "bad key=1", "a1"), "invalid attribute name 'bad key'")
    assert snapshot() == before
    records = AuditRecord.objects.count()
    ok(cli("host", "mod", "-i", "serial=X9", "a1"))  # as it was: nothing recorded
    assert AuditRecord.objects.count() == records
    result = cli("host", "mod", "a1")
    assert result.exit_code == 2 and "--attribute KEY=VALUE" in result.stderr


def test_job_create_json_with_follow_prints_one_document(cli, fleet):
    """Scripts read one JSON document, the outcome: --follow then waits as --wait does."""
    result = cli("job", "create", "-m", "board:a", "-c", "true", "--follow", "--timeout", "1", "--json", "x")
    assert result.exit_code == 124
    out = json.loads(result.stdout)
    assert out["timed_out"] is True and out["jobs"][0]["name"] == "x"


@pytest.mark.parametrize(
    "value, shown",
    [
        ("0001-01-01T00:00:00Z", "0001-01-01 00:00:00"),
        ("0999-05-06T07:08:09.5Z", "0999-05-06 07:08:09"),
        ("9999-12-31T23:59:59+00:00", "9999-12-31 23:59:59"),
        ("2026-11-25T16:27:27", "2026-11-25 16:27:27"),  # naive: UTC
        ("0001-01-01T00:30:00+01:00", "0001-01-01T00:30:00+01:00"),  # no UTC time: shown as given
        ("not a time", "not a time"),
    ],
)
def test_odd_times_keep_the_one_format(value, shown, monkeypatch):
    """strftime's %Y wrote year 1 as `1-01-01`: the format is four digits of year in every case."""
    monkeypatch.setattr(Clock, "utc", True)
    assert shown_time(value) == shown


@pytest.mark.parametrize(
    "args",
    [
        ("job", "wait", "1", "--timeout", "nan"),
        ("job", "wait", "1", "--interval", "inf"),
        ("job", "create", "-m", "board:a", "-c", "true", "--wait", "--timeout", "NaN", "x"),
        ("job", "rerun", "1", "--follow", "--timeout", "nan"),
        ("results", "compare", "--base", "1", "--new", "2", "--min-change", "nan"),
    ],
)
def test_seconds_and_percentages_are_finite_numbers(cli, fleet, args):
    """click's FloatRange lets nan through its bounds: `--timeout nan` waited for ever, `--interval inf`
    was a traceback from time.sleep. Both are usage errors now, and nothing is made."""
    before = snapshot()
    result = cli(*args)
    assert result.exit_code == 2 and "is not a finite number" in result.stderr, result.stderr
    assert snapshot() == before


@pytest.mark.parametrize(
    "args",
    [("job", "list", "--name", "a\udcffb"), ("job", "list", "--since", "a\udcffb"), ("host", "stat", "a\udcffb")],
)
def test_a_byte_that_is_not_utf8_in_a_query_or_path_is_one_line(cli, fleet, args):
    """An argument from a terminal not in UTF-8 (a surrogate in argv) was an UnicodeEncodeError traceback
    when requests encoded the query or the path."""
    fails(cli(*args), r"'a\udcffb' is not valid UTF-8: nothing was sent")


def test_two_attribute_names_of_one_environment_variable_are_refused(cli, fleet):
    """`serial` and `SERIAL` (or `a.b` and `a-b`) both reach a job as FLEETSHARD_HOST_ATTR_SERIAL: one
    value was dropped by chance. Refused, whether both are set at once or one is already on the host."""
    ok(cli("host", "mod", "-i", "serial=X1", "a1"))
    before = snapshot()
    fails(
        cli("host", "mod", "-i", "SERIAL=X2", "a1"),
        "attribute names serial and SERIAL are both SERIAL in a job's environment: use one",
    )
    fails(cli("host", "mod", "-i", "a.b=1", "-i", "a-b=2", "a2"), "attribute names a.b and a-b are both A_B")
    fails(
        cli("job", "create", "-m", "board:a", "-c", "true", "-k", "x.y=1", "-k", "x_y=2", "j"),
        "keyval names x.y and x_y are both X_Y",
    )
    assert snapshot() == before
    ok(cli("host", "mod", "-i", "serial=X3", "a1"))  # the same name again is a change of its value
