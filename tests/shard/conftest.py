"""Fixtures of the shard tests: a default shard world, started processes, and the databases to drop."""

import subprocess
from pathlib import Path

import pytest

from tests.shard.fleet import drop_created_databases
from tests.shard.world import ShardWorld
from tests.support import stop


@pytest.fixture(autouse=True)
def _drop_shard_databases():
    yield
    drop_created_databases()


@pytest.fixture
def started():
    """Stops every shard process a test started; their logs show when the test fails."""
    procs: list[tuple[subprocess.Popen, Path]] = []
    yield procs
    for proc, log in procs:
        stop(proc)
        print(f"==== {log} ====\n{log.read_text(errors='replace')[-20000:]}")


@pytest.fixture
def world(db, tmp_path):
    """A shard world with the default scheduler settings (tests/shard/world.py)."""
    w = ShardWorld(tmp_path)
    yield w
    w.stop()
