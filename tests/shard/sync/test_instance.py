"""A shard database's instance id: kept across restarts, renewed for a copy (a file copied, a database
made from another as its template)."""

import shutil
import subprocess

import psycopg2
import pytest

from shard.models import ShardState
from shard.sync.instance import ensure_instance, physical_identity
from tests.support import Role, drop_database, fresh_database_url, using_postgres

INSTANCE = "from shard.sync.instance import ensure_instance\nresult = ensure_instance()"


def _copy(role: Role, tmp_path) -> Role:
    if not using_postgres():
        source = role.database_url.removeprefix("sqlite:///")
        target = tmp_path / "copy.sqlite3"
        shutil.copy(source, target)
        return Role("shard", f"sqlite:///{target}", tmp_path)
    url = fresh_database_url(tmp_path, "copy")
    drop_database(url)
    base, name = url.rsplit("/", 1)
    conn = psycopg2.connect(base + "/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{role.database_url.rsplit("/", 1)[1]}"')
    conn.close()
    return Role("shard", url, tmp_path)


def test_instance_is_kept_across_restarts_and_renewed_for_a_copy(tmp_path):
    role = Role("shard", fresh_database_url(tmp_path, "orig"), tmp_path)
    copy = None
    try:
        role.manage("migrate", "--noinput")
        first = role.shell(INSTANCE)
        assert role.shell(INSTANCE) == first
        copy = _copy(role, tmp_path)
        copied = copy.shell(INSTANCE)
        assert copied != first
        assert copy.shell(INSTANCE) == copied
        assert role.shell(INSTANCE) == first
    finally:
        drop_database(role.database_url)
        if copy is not None:
            drop_database(copy.database_url)


def test_a_stored_identity_that_does_not_match_takes_a_new_instance(db):
    first = ensure_instance()
    assert ShardState.objects.get(id=1).identity == physical_identity()
    assert ensure_instance() == first
    ShardState.objects.filter(id=1).update(identity="sqlite:1:2")
    assert ensure_instance() != first


def _restore_in_place(role: Role, tmp_path) -> None:
    """Restores a backup over the database itself, as an operator does: `cp backup.sqlite3 db.sqlite3`
    (the file keeps its inode) or `pg_restore --clean` into the same database (it keeps its oid)."""
    if not using_postgres():
        source = role.database_url.removeprefix("sqlite:///")
        shutil.copyfile(tmp_path / "backup.sqlite3", source)
        return
    subprocess.run(
        ["pg_restore", "--clean", "--if-exists", "--no-owner", "-d", role.database_url, tmp_path / "backup.dump"],
        check=True,
        capture_output=True,
    )


def _back_up(role: Role, tmp_path) -> None:
    if not using_postgres():
        shutil.copyfile(role.database_url.removeprefix("sqlite:///"), tmp_path / "backup.sqlite3")
        return
    subprocess.run(["pg_dump", "-Fc", "-f", tmp_path / "backup.dump", role.database_url], check=True)


@pytest.mark.xfail(
    strict=True,
    reason="A backup restored over the database itself keeps the physical identity (inode, oid), so the "
    "rolled-back database keeps its instance id: the master resends nothing and the shard may run again "
    "what it ran after the backup. Needs a rollback check against the master (e.g. the shard's seq high "
    "water mark in the heartbeat): a protocol change.",
)
def test_a_backup_restored_in_place_takes_a_new_instance(tmp_path):
    role = Role("shard", fresh_database_url(tmp_path, "orig"), tmp_path)
    try:
        role.manage("migrate", "--noinput")
        first = role.shell(INSTANCE)
        _back_up(role, tmp_path)
        role.shell("from shard.models import ShardState\nresult = ShardState.objects.update(last_heartbeat_ok=None)")
        _restore_in_place(role, tmp_path)
        assert role.shell(INSTANCE) != first
    finally:
        drop_database(role.database_url)
