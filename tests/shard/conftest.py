"""Drops the shard databases each test made, once its processes are stopped."""

import pytest

from tests.shard.fleet import drop_created_databases


@pytest.fixture(autouse=True)
def _drop_shard_databases():
    yield
    drop_created_databases()
