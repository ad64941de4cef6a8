"""Shard instances end to end: a second database with the same token is refused while the first is
live, adopted once the first is silent, and no job ever runs twice."""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shard.fleet import ACTIVE, FAST_SHARD_ENV, master_hqes, new_shard, sql, submit
from tests.support import make_shard_process, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def marks() -> Iterator[Path]:
    """A directory every job user can append to: each run of the job leaves one line."""
    path = Path(tempfile.mkdtemp(prefix="fs-marks-"))
    path.chmod(0o777)
    yield path
    subprocess.run(["pkill", "-KILL", "-f", str(path)], check=False)
    shutil.rmtree(path, ignore_errors=True)


def runs(marks: Path) -> int:
    path = marks / "runs"
    return len(path.read_text().split()) if path.exists() else 0


def test_second_database_is_refused_while_the_first_lives_then_adopted_without_running_twice(
    master_server, tmp_path, marks
):
    lab = new_shard(master_server, tmp_path, hosts=1)
    command = f'echo "$FLEETSHARD_HQE_ID" >> {marks}/runs; sleep 60'
    (job,) = submit(master_server, [{"name": "once", "command": command, "meta_hosts": [[lab.label, 1]]}])
    first = lab.process
    first.start()
    try:
        wait_until(lambda: master_hqes(master_server, [job])[0][1] == "Running", what="the job to run")
        token = first.role.extra_env["FLEETSHARD_SHARD_TOKEN"]
        second = make_shard_process(tmp_path / "rebuilt", master_server, first.hostname, token, **FAST_SHARD_ENV)

        second.start()
        assert second.proc is not None
        code = second.proc.wait(30)
        assert code != 0
        assert f"shard {first.hostname} is running from another database" in second.log()
        assert master_hqes(master_server, [job])[0][1] == "Running"
        assert runs(marks) == 1

        # The first shard's machine dies; its job's process is left behind, as after a power cut.
        assert first.proc is not None
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        time.sleep(3 * 0.5 + 1)

        second.start()
        wait_until(lambda: master_hqes(master_server, [job])[0][1:3] == ("Failed", "infra"), what="adoption")
        assert "database was replaced" in master_hqes(master_server, [job])[0][5]
        wait_until(
            lambda: sql(second.role.database_url, "SELECT last_heartbeat_ok FROM shard_shardstate")[0][0],
            what="the new database to heartbeat",
        )
        time.sleep(2)
        active = sql(
            second.role.database_url,
            f"SELECT count(*) FROM common_hostqueueentry WHERE job_id = {job} AND status IN {ACTIVE!r}",
        )
        assert active == [(0,)], "the ended job is nothing the new database could run"
        assert runs(marks) == 1, "the job ran once, on the first database only"
        assert second.stop() == 0
    finally:
        for process in (first,):
            if process.proc is not None and process.proc.poll() is None:
                process.stop()
