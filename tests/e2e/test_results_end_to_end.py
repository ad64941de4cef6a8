"""End to end: a job on a real shard writes benchmark results; the master has them, linked to the job
and host, and the malformed one (refused by the master) and the link (refused by the shard, unsent)
are set aside where operators see them, without failing the job."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from tests.shard.fleet import master_hqes, new_shard, sql, submit, writable_by_jobs
from tests.support import ROOT, assert_status, wait_until

pytestmark = pytest.mark.e2e


def result_files(test: str) -> dict[str, bytes]:
    """A TensorFlow TestResults file and a Google Benchmark file of the same test and entry, and a malformed one."""
    tf = {
        "name": test,
        "startTime": "1700000000",
        "entries": {"entry": [{"name": "BM_Copy", "iters": "100", "wallTime": 0.25, "cpuTime": 0.2}]},
        "commitId": {"hash": "0123abcd"},
    }
    gb = {
        "context": {"date": "2024-01-02T03:04:05+00:00", "executable": f"/build/bench/{test}"},
        "benchmarks": [
            {"name": "BM_Copy", "iterations": 1000, "real_time": 250.0, "cpu_time": 200.0, "time_unit": "ms"}
        ],
    }
    return {
        "tf_results.json": json.dumps(tf).encode(),
        "gbench.json": json.dumps(gb).encode(),
        "broken.json": b'{"benchmarks": "nope"}',
    }


def cli_text(master, token: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_")}
    env |= {"FLEETSHARD_SERVER": master.url, "FLEETSHARD_TOKEN": token}
    proc = subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def cli(master, token: str, *args: str) -> dict | list:
    return json.loads(cli_text(master, token, *args, "--json"))


def test_a_jobs_results_reach_the_master_and_a_malformed_file_is_quarantined(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1)
    ((hostname, host_id),) = shard.hosts.items()
    test = f"e2e_bench_{uuid.uuid4().hex[:8]}"
    source = writable_by_jobs(tmp_path) / "files"
    source.mkdir()
    for name, data in result_files(test).items():
        (source / name).write_bytes(data)
        (source / name).chmod(0o644)
    source.chmod(0o755)
    command = (
        # results/ is there before the job starts (no mkdir); a file one level up is not a result, and says so.
        f'cp {source}/*.json "$FLEETSHARD_RESULTS_DIR/results/"'
        ' && ln -s /etc/hostname "$FLEETSHARD_RESULTS_DIR/results/link.json"'
        f' && cp {source}/gbench.json "$FLEETSHARD_RESULTS_DIR/stray.json"'
    )
    (job,) = submit(master_server, [{"name": "bench", "command": command, "meta_hosts": [[shard.label, 1]]}])
    token = master_server.shell(
        "from master import services\n"
        "_, result = services.create_personal_token('results-e2e', admin=True, acting_user=None)"
    )
    shard.process.start()
    try:
        wait_until(lambda: master_hqes(master_server, [job])[0][1] == "Completed", timeout=90, what="the job Completed")

        def timings() -> list:
            rows = cli(master_server, token, "results", "timings", test, "BM_Copy")
            return rows if len(rows) == 2 else []

        rows = wait_until(timings, timeout=60, what="both files' timings on the master")

        def stat_with_quarantine() -> dict:
            # Each file is sent on its own: the broken one's record may come after the good ones' (CI).
            got = cli(master_server, token, "job", "stat", str(job))
            return got if len(got["hqes"][0]["quarantined"]) >= 3 else {}

        stat = wait_until(stat_with_quarantine, timeout=60, what="the three quarantined files on the master")
        shown = cli_text(master_server, token, "job", "stat", str(job))
    finally:
        assert shard.process.stop() == 0
    assert stat["status"] == "Completed"
    assert sorted((r["wall_time_s"], r["job"], r["host"]) for r in rows) == [
        (0.25, job, hostname),
        (0.25, job, hostname),
    ]
    ((hqe,),) = [stat["hqes"]]
    assert hqe["host"] == hostname
    quarantined = {q["name"]: q["reason"] for q in hqe["quarantined"]}
    assert sorted(quarantined) == ["broken.json", "link.json", "stray.json"]
    assert quarantined["stray.json"] == (
        "not stored: it is beside results/, not in it (write $FLEETSHARD_RESULTS_DIR/results/stray.json)"
    )
    reason = quarantined["broken.json"]
    assert "broken.json" in reason and quarantined["link.json"] == "not sent: a symbolic link"
    assert "Quarantined result files:\n" in shown
    assert reason.startswith("broken.json: ")  # the name once on stat, not twice
    assert f"  entry {hqe['id']} ({hostname}): broken.json: {reason.removeprefix('broken.json: ')}\n" in shown
    assert f"  entry {hqe['id']} ({hostname}): link.json: not sent: a symbolic link" in shown
    query = (
        f"SELECT r.results_dir FROM shard_run r JOIN common_hostqueueentry q ON q.id = r.hqe_id WHERE q.job_id={job}"
    )
    (run,) = sql(shard.url, query)
    run_dir = Path(run[0])
    assert sorted(p.name for p in (run_dir / "archive").iterdir()) == ["gbench.json", "tf_results.json"]
    assert sorted(p.name for p in (run_dir / "quarantine").iterdir()) == [
        "broken.json",
        "broken.json.error",
        "link.json",
        "link.json.error",
    ]
    assert (run_dir / "quarantine" / "broken.json.error").read_text() == f"the master refused it (400): {reason}\n"
    assert list((run_dir / "results").iterdir()) == []
    assert host_id in shard.hosts.values()


def test_the_served_masters_detector_raises_a_regression_after_uploads_through_the_endpoint(master_server):
    """No request detects: the detector thread each `serve` worker runs drains the marked series."""
    test = f"e2e_step_{uuid.uuid4().hex[:8]}"
    token = master_server.shell(
        "from master import services\n"
        "_, result = services.create_personal_token('detector-e2e', admin=True, acting_user=None)"
    )
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    for i in range(40):
        wall = (1.0 if i < 30 else 1.3) * (1 + 0.01 * ((i * 7) % 5 - 2))
        doc = {
            "name": test,
            "startTime": 1_700_000_000 + 3600 * i,
            "entries": {"entry": [{"name": "e", "wallTime": wall}]},
        }
        resp = session.post(f"{master_server.url}/api/v1/results/upload", params={"name": f"{i}.json"}, json=doc)
        assert_status(resp, 201)

    def raised() -> list:
        return cli(master_server, token, "results", "regressions", "--test", test)

    (reg,) = wait_until(raised, timeout=30, what="the served master's detector to raise the regression")
    assert (reg["entry"], reg["status"], reg["start"]) == ("e", "new", "2023-11-16T04:13:20Z")
    marked = f"from master.models import DirtySeries\nresult = DirtySeries.objects.filter(test={test!r}).count()"
    wait_until(lambda: master_server.shell(marked) == 0, timeout=30, what="its series no longer marked")
