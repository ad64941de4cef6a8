"""End to end, as a lab engineer's first hour goes: submit and wait or watch in one command, find the
job again by name, read its results on `job stat` with the chart's address. A real master and a real
`run_shard` on loopback; the command line as a separate process."""

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.shard.fleet import new_shard
from tests.support import ROOT, wait_until

pytestmark = pytest.mark.e2e


def fleetshard(master, token: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_")}
    env |= {"FLEETSHARD_SERVER": master.url, "FLEETSHARD_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_create_with_wait_or_follow_exits_with_the_jobs_outcome_and_its_results_show_on_stat(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=2)
    token = master_server.shell(
        "from master import services\n"
        "_, result = services.create_personal_token('everyday-e2e', admin=True, acting_user=None)"
    )
    tag = uuid.uuid4().hex[:6]
    test = f"everyday_{tag}"
    doc = json.dumps(
        {"name": test, "startTime": 1_700_000_000, "entries": {"entry": [{"name": "e", "wallTime": 2e-6}]}}
    )
    shard.process.start()
    try:
        # --follow: the log on stdout as it comes; results/ is there without a mkdir.
        followed = fleetshard(
            master_server,
            token,
            "job",
            "create",
            "-m",
            shard.label,
            "-c",
            f"echo one; echo '{doc}' > \"$FLEETSHARD_RESULTS_DIR/results/r.json\"; echo two",
            "--follow",
            f"ev-{tag}-ok",
        )
        assert followed.returncode == 0, followed.stderr
        assert followed.stdout == "one\ntwo\n"
        assert followed.stderr.startswith("Created job ")
        job_id = followed.stderr.split()[2]

        failed = fleetshard(
            master_server, token, "job", "create", "-m", shard.label, "-c", "exit 3", "--wait", f"ev-{tag}-bad"
        )
        assert failed.returncode == 1, failed.stderr
        assert failed.stdout.startswith("Created job ")
        assert "Failed" in failed.stdout
        assert failed.stderr.splitlines()[-1].startswith("Error: not every job completed: job ")

        slow = fleetshard(
            master_server,
            token,
            "job",
            "create",
            "-m",
            shard.label,
            "-c",
            "sleep 60",
            "--wait",
            "--timeout",
            "2",
            f"ev-{tag}-slow",
        )
        assert slow.returncode == 124, slow.stderr
        assert "Error: timed out after 2 s" in slow.stderr

        listed = json.loads(
            fleetshard(master_server, token, "job", "list", "--name", f"ev-{tag}-*", "--since", "1h", "--json").stdout
        )
        assert sorted(j["name"] for j in listed) == [f"ev-{tag}-bad", f"ev-{tag}-ok", f"ev-{tag}-slow"]
        one = fleetshard(master_server, token, "job", "list", "--name", f"ev-{tag}-?k", "--json")
        assert [j["name"] for j in json.loads(one.stdout)] == [f"ev-{tag}-ok"]

        def stat() -> str | None:
            text = fleetshard(master_server, token, "job", "stat", job_id).stdout
            return text if "Results:" in text else None

        shown = wait_until(stat, timeout=60, what="the results on job stat")
    finally:
        shard.process.stop()
    assert f": {test}: 1 run, 1 entry; chart: {master_server.url}/admin/benchmarks/entries/?test={test}" in shown, shown
