"""A real master (gunicorn) and a real run_shard process, each with its own database, over loopback."""

import signal
import uuid
from typing import Any

import pytest

from tests.support import Master, ShardProcess, make_shard_process, make_world, wait_until

pytestmark = pytest.mark.e2e


def shard_contents(shard: ShardProcess) -> dict[str, Any]:
    return shard.shell(
        "from common.models import Host, Job, HostQueueEntry\n"
        "result = {'hosts': sorted(Host.objects.values_list('id', flat=True)),"
        " 'jobs': list(Job.objects.values_list('id', flat=True)),"
        " 'hqes': list(HostQueueEntry.objects.values_list('id', 'status'))}"
    )


def master_job(master: Master, job_id: int) -> dict[str, Any]:
    return master.shell(
        "from common.models import Job\n"
        f"j = Job.objects.get(id={job_id}); h = j.hqes.get()\n"
        "result = {'job': j.status, 'hqe': h.status, 'host': h.host_id, 'exit_code': h.exit_code, 'log': h.log_tail}"
    )


def test_jobs_reach_the_shard_and_results_reach_the_master(master_server, tmp_path):
    prefix = f"e{uuid.uuid4().hex[:6]}"
    world = make_world(master_server, prefix, hosts=2, jobs=1)
    # Locked hosts get no work from the shard's scheduler, so this test decides how the HQE ends.
    master_server.shell(
        "from master import services\n"
        f"services.lock_hosts(['{prefix}-h0', '{prefix}-h1'], acting_user=None)\nresult = 1"
    )
    shard = make_shard_process(tmp_path, master_server, world["shard"], world["token"])
    shard.start()
    try:

        def arrived() -> dict[str, Any] | None:
            got = shard_contents(shard)
            return got if got["jobs"] == world["jobs"] and got["hosts"] == sorted(world["hosts"]) else None

        [(hqe_id, status)] = wait_until(arrived, timeout=60, what="hosts and jobs on the shard")["hqes"]
        assert status == "Queued"
        shard.shell(
            "from shard.services import transition_hqe, finish_hqe\n"
            f"transition_hqe({hqe_id}, 'Running', host_id={world['hosts'][0]})\n"
            f"finish_hqe({hqe_id}, 'Completed', exit_code=0, log_tail='all good')\n"
            "result = 1"
        )
        job_id = world["jobs"][0]
        done = wait_until(
            lambda: (lambda r: r if r["job"] == "Completed" else None)(master_job(master_server, job_id)),
            timeout=60,
            what="the job to complete on the master",
        )
        assert done == {
            "job": "Completed",
            "hqe": "Completed",
            "host": world["hosts"][0],
            "exit_code": 0,
            "log": "all good",
        }
        wait_until(
            lambda: shard.shell("from shard.models import OutboxEntry\nresult = OutboxEntry.objects.count() == 0"),
            timeout=30,
            what="the shard's outbox to drain",
        )
    finally:
        assert shard.proc is not None
        shard.proc.send_signal(signal.SIGTERM)
        code = shard.proc.wait(30)
    assert code == 0, shard.log()
    assert "stopped" in shard.log()
