"""End to end: a real shard runs a job that prints a line a second; `fleetshard job log --follow` (a
real CLI process against a real master) prints each line within 2 s of the job printing it and ends
with the entry; the master's log then equals the shard's file, up to the master's cap, even across
a master restart in the middle of the run."""

import os
import select
import subprocess
import sys
import threading
import time

import pytest
import requests

from tests.shard.fleet import new_shard, sql, submit
from tests.support import ROOT, Master, assert_status, serve, stop, wait_until

pytestmark = pytest.mark.e2e

# Each line carries the moment the job printed it, so the follower's delay is measured per line.
TICKING = 'for i in $(seq 1 {n}); do echo "line $i $(date +%s.%N) {pad}"; sleep {every}; done'


def person_token(master: Master) -> str:
    return master.shell(
        "import uuid\nfrom master import services\n"
        "_, result = services.create_personal_token('log-' + uuid.uuid4().hex[:8], acting_user=None)"
    )


def cli_env(master: Master, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_")}
    return env | {"FLEETSHARD_SERVER": master.url, "FLEETSHARD_TOKEN": token, "PYTHONUNBUFFERED": "1"}


def read_log(master: Master, token: str, job: int) -> dict:
    resp = requests.get(f"{master.url}/api/v1/jobs/{job}/log", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert_status(resp, 200)
    return resp.json()


def shard_log(shard, job: int) -> bytes:
    rows = sql(
        shard.url,
        "SELECT r.results_dir FROM shard_run r JOIN common_hostqueueentry q ON q.id = r.hqe_id "
        f"WHERE q.job_id = {int(job)}",
    )
    return (ROOT / rows[0][0] / "job.log").read_bytes()


def test_job_log_follow_prints_each_line_within_two_seconds_and_ends_with_the_job(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1)
    token = person_token(master_server)
    command = TICKING.format(n=8, every=1, pad="")
    (job,) = submit(master_server, [{"name": "ticking", "command": command, "meta_hosts": [[shard.label, 1]]}])
    shard.process.start()
    try:
        follower = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "job", "log", str(job), "--follow"],
            cwd=ROOT,
            env=cli_env(master_server, token),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        arrivals: list[tuple[str, float]] = []

        def read() -> None:
            assert follower.stdout is not None
            for line in follower.stdout:
                arrivals.append((line, time.time()))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert follower.wait(timeout=90) == 0, follower.stderr.read() if follower.stderr else ""
        reader.join(timeout=10)
        lines = [line for line, _ in arrivals]
        assert [line.split()[:2] for line in lines] == [["line", str(i)] for i in range(1, 9)], lines
        delays = [arrived - float(line.split()[2]) for line, arrived in arrivals]
        assert max(delays) < 2.0, [f"{d:.2f}" for d in delays]
        # The follower ended with the entry, and what it printed is the shard's file, byte for byte.
        # The log may be complete a heartbeat before the master hears that the entry ended.
        final = wait_until(
            lambda: (piece := read_log(master_server, token, job))["hqe_status"] == "Completed" and piece,
            timeout=30,
            what="the entry Completed",
        )
        assert final["complete"] and final["ended"]
        assert "".join(lines).encode() == final["text"].encode() == shard_log(shard, job)
        print(f"follow delays (s): {' '.join(f'{d:.2f}' for d in delays)}")
    finally:
        shard.process.stop()


CAP = 3000


@pytest.mark.parametrize("own_master", [{"FLEETSHARD_MAX_LOG_BYTES": str(CAP)}], indirect=True)
def test_a_log_shipped_across_a_master_restart_equals_the_shards_file_up_to_the_cap(own_master, tmp_path):
    cap = CAP
    port = int(own_master.url.rsplit(":", 1)[1])
    shard = new_shard(own_master, tmp_path, hosts=1)
    token = person_token(own_master)
    # 50 lines of 80 bytes over about 5 s: the master's cap falls in the last part.
    command = TICKING.format(n=50, every=0.1, pad="x" * 50)
    (job,) = submit(own_master, [{"name": "chatty", "command": command, "meta_hosts": [[shard.label, 1]]}])
    shard.process.start()
    follower: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: read_log(own_master, token, job)["size"] > 0, timeout=60, what="the first lines shipped")
        # A follower started before the restart waits for the master and goes on where it was.
        follower = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "job", "log", str(job), "-f"],
            cwd=ROOT,
            env=cli_env(own_master, token),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # It has read the lines shipped so far (so it follows the master before the restart), however
        # slowly a loaded machine starts its Python: a fixed second was no promise it had.
        assert follower.stdout is not None
        ready, _, _ = select.select([follower.stdout], [], [], 60)
        assert ready, "the follower printed nothing in 60 s"
        first = os.read(follower.stdout.fileno(), 1 << 16)
        stop(own_master.proc)
        time.sleep(1)
        own_master.proc = serve(own_master.role, port)
        final = wait_until(
            lambda: (piece := read_log(own_master, token, job))["ended"] and piece["hqe_status"] != "Running" and piece,
            timeout=120,
            what="the whole log shipped and the entry ended",
        )
        whole = shard_log(shard, job)
        assert len(whole) > cap and final["truncated"] and final["size"] == cap
        assert final["text"].encode() == whole[:cap]
        assert final["hqe_status"] == "Completed"
        assert "log shipping paused" in shard.process.log()
        out, err = follower.communicate(timeout=60)
        out = first + out
        assert follower.returncode == 0, err
        assert out == whole[:cap], (out[-200:], err)
        assert b"lost the master" in err and b"the master keeps the first 3000 bytes" in err
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
        shard.process.stop()
