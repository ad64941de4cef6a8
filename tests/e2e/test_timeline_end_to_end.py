"""End to end: a real `run_shard` runs jobs that pass (one writing its own trace.json), fail with a
repair command, time out and are aborted; `fleetshard timeline export` then gives a trace the validator
takes, one thread per host, each run's slice as long as its HQE ran, the hosts' Cleaning and Repairing,
the job's own events inside its run, and `timeline stats --json` totals equal to the exported slices."""

import gzip
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from cli.main import main
from tests.master.timeline.validate import validate
from tests.shard.fleet import ACTIVE, master_hqes, new_shard, sql, submit
from tests.support import wait_until

pytestmark = pytest.mark.e2e

TRACE = (
    'printf \'{"traceEvents":[{"name":"compile","ph":"X","ts":5000,"dur":150000},'
    '{"name":"test","ph":"X","ts":60000,"dur":50000,"cat":"unit"}]}\' > "$FLEETSHARD_RESULTS_DIR/trace.json"; '
    "sleep 0.5"
)


def fleetshard(master, token: str, *args: str) -> str:
    result = CliRunner().invoke(
        main, list(args), env={"FLEETSHARD_SERVER": master.url, "FLEETSHARD_TOKEN": token}, prog_name="fleetshard"
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_shards_day_exported_as_a_trace_with_totals_that_add_up(master_server, tmp_path):
    shard = new_shard(
        master_server,
        tmp_path,
        hosts=2,
        FLEETSHARD_CLEANUP_COMMAND="sleep 0.3",
        FLEETSHARD_REPAIR_COMMAND="sleep 0.4",
        FLEETSHARD_COOLDOWN_S="0.2",
    )
    since = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    on = {"meta_hosts": [[shard.label, 1]]}
    specs = [
        {"name": "traced", "command": TRACE, **on},
        {"name": "fails", "command": "sleep 0.3; exit 3", **on},
        {"name": "times-out", "command": "sleep 60", "max_runtime_mins": 1, **on},
        {"name": "aborted", "command": "sleep 60", **on},
    ]
    jobs = dict(zip([s["name"] for s in specs], submit(master_server, specs), strict=True))
    shard.process.start()
    try:
        running = lambda: master_hqes(master_server, [jobs["aborted"]])[0][1] == "Running"  # noqa: E731
        wait_until(running, timeout=60, what="the job to abort Running")
        master_server.shell(
            f"from master import services\nservices.abort_jobs([{jobs['aborted']}], acting_user=None)\nresult = 1"
        )

        # The master is the session's: count only this shard's hosts and this test's jobs.
        mine = f"host_id IN ({', '.join(str(i) for i in shard.hosts.values())})"
        job_ids = ", ".join(str(j) for j in jobs.values())

        def settled() -> bool:
            ended = all(r[1] not in ACTIVE for r in master_hqes(master_server, list(jobs.values())))
            traced = sql(
                master_server.role.database_url,
                "SELECT count(*) FROM master_runtrace WHERE hqe_id IN "
                f"(SELECT id FROM common_hostqueueentry WHERE job_id IN ({job_ids}))",
            ) == [(1,)]
            open_states = sql(
                master_server.role.database_url,
                f"SELECT count(*) FROM master_interval WHERE kind != 'run' AND \"end\" IS NULL AND {mine}",
            )
            states = sql(
                master_server.role.database_url, f"SELECT count(*) FROM master_interval WHERE kind != 'run' AND {mine}"
            )
            return ended and traced and open_states == [(0,)] and states[0][0] >= 4

        wait_until(settled, timeout=90, interval=0.5, what="runs ended, hosts Ready again and the trace uploaded")
    finally:
        assert shard.process.stop() == 0
    rows = {r[0]: r for r in master_hqes(master_server, list(jobs.values()))}
    assert [rows[jobs[n]][1:3] for n in jobs] == [
        ("Completed", ""),
        ("Failed", "test"),
        ("Failed", "timeout"),
        ("Aborted", ""),
    ]
    token = master_server.shell(
        "from master import services\nresult = services.create_personal_token('tl', admin=True, acting_user=None)[1]"
    )
    until = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    window = ("--since", since, "--until", until)
    out = tmp_path / "day.json.gz"
    fleetshard(master_server, token, "timeline", "export", "-o", str(out), "--shard", shard.process.hostname, *window)
    trace = json.loads(gzip.decompress(out.read_bytes()))
    summary = validate(trace)
    events = trace["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(threads.values()) == sorted(shard.hosts), "one thread per host"
    assert sorted(threads) == sorted(shard.hosts.values())

    times = master_server.shell(
        "from common.models import HostQueueEntry\n"
        f"result = {{h.id: [h.started_on.timestamp(), h.finished_on.timestamp()] for h in "
        f"HostQueueEntry.objects.filter(job_id__in={list(jobs.values())}) if h.started_on}}"
    )
    runs = [e for e in events if e.get("cat") == "run"]
    assert sorted(e["name"] for e in runs) == sorted(jobs)
    for run in runs:
        started, finished = times[str(run["args"]["hqe"])]
        assert abs(run["dur"] / 1e6 - (finished - started)) < 1, run
        assert abs(run["ts"] / 1e6 - started) < 1, run
    kinds = {e["name"] for e in events if e.get("cat") == "host"}
    assert {"Cleaning", "Repairing"} <= kinds
    (traced,) = [e for e in runs if e["name"] == "traced"]
    nested = {e["name"]: e for e in events if e.get("cat") == "job"}
    assert set(nested) == {"compile", "test"}
    assert nested["compile"]["ts"] == traced["ts"] and nested["compile"]["dur"] == 150000
    assert nested["test"]["ts"] == traced["ts"] + 55000 and nested["test"]["args"] == {"cat": "unit"}
    assert all(e["tid"] == traced["tid"] for e in nested.values())
    assert summary.slices == len(runs) + sum(1 for e in events if e.get("cat") == "host") + 2

    stats = json.loads(
        fleetshard(master_server, token, "timeline", "stats", "--json", "--shard", shard.process.hostname, *window)
    )
    sums: dict[tuple[str, str], float] = defaultdict(float)
    for e in events:
        if e.get("cat") in ("run", "host"):
            kind = "running_s" if e["cat"] == "run" else f"{e['name'].lower().replace(' ', '_')}_s"
            sums[(threads[e["tid"]], kind)] += e["dur"] / 1e6
    assert sorted(r["key"] for r in stats) == sorted(shard.hosts)
    for row in stats:
        for kind in ("running_s", "cleaning_s", "repairing_s", "repair_failed_s"):
            assert row[kind] == pytest.approx(sums[(row["key"], kind)], abs=1e-3), (row, kind)
    assert sum(r["runs"] for r in stats) == 4
