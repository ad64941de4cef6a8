"""A copy of a live shard's database, holding queued work and a Ready host, run with the same token:
the master refuses it (409), and it must start nothing before that answer (docs/protocol.md, "Shard
instances": a shard process touches no run, process or host until the master accepted its instance).

Found while building bench/chaos.py's database_copy fault (which hits it only when the copy catches a
Ready host beside queued work); this is its deterministic reproduction.
"""

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shard.fleet import FAST_SHARD_ENV, new_shard, sql, submit
from tests.support import ShardProcess, drop_database, fresh_database_url, make_shard_process, stop, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres_only(reason="the copy is made with pg_dump from a live PostgreSQL shard database"),
]


@pytest.fixture
def marks() -> Iterator[Path]:
    """A directory every job user can append to: each run of a job leaves one line."""
    path = Path(tempfile.mkdtemp(prefix="fs-copy-marks-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pg_copy(source_url: str, tmp: Path) -> str:
    """pg_dump | psql into a new database while the source's shard keeps running."""
    target = fresh_database_url(tmp, "copy")
    dump = subprocess.Popen(["pg_dump", "--no-owner", source_url], stdout=subprocess.PIPE)
    restore = subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", target], stdin=dump.stdout, capture_output=True)
    assert dump.stdout is not None
    dump.stdout.close()
    assert dump.wait(60) == 0 and restore.returncode == 0, restore.stderr
    return target


def test_a_copy_with_queued_work_is_refused_and_starts_nothing(master_server, tmp_path, marks):
    # The original holds the job queued and its host Ready, but never starts anything itself
    # (FLEETSHARD_MAX_RUNS=0): any run of the job can only be the copy's.
    lab = new_shard(master_server, tmp_path, hosts=1, FLEETSHARD_MAX_RUNS="0")
    (job,) = submit(
        master_server,
        [{"name": "queued", "command": f'echo "$FLEETSHARD_HQE_ID" >> {marks}/runs', "meta_hosts": [[lab.label, 1]]}],
    )
    original = lab.process
    original.start()
    copy: ShardProcess | None = None
    copy_url = ""
    try:
        wait_until(
            lambda: sql(lab.url, f"SELECT status FROM common_hostqueueentry WHERE job_id = {job}") == [("Queued",)],
            what="the job queued on the original",
        )
        copy_url = pg_copy(lab.url, tmp_path)
        token = original.role.extra_env["FLEETSHARD_SHARD_TOKEN"]
        copy = make_shard_process(tmp_path / "copy", master_server, original.hostname, token, **FAST_SHARD_ENV)
        copy.role.database_url = copy_url
        copy.start()
        assert copy.proc is not None
        assert copy.proc.wait(60) != 0
        assert "running from another database" in copy.log()
        ran = (marks / "runs").read_text().split() if (marks / "runs").exists() else []
        assert ran == [], f"the refused copy ran HQE(s) {ran}"
        assert sql(copy_url, f"SELECT status FROM common_hostqueueentry WHERE job_id = {job}") == [("Queued",)]
        held = "SELECT h.status, s.runner FROM common_host h JOIN shard_hoststate s ON s.host_id = h.id"
        assert sql(copy_url, held) == [("Ready", "")]
    finally:
        for process in (original, copy):
            if process is not None and process.proc is not None:
                stop(process.proc)
        if copy_url:
            drop_database(copy_url)
