"""A shard database's instance id: kept across restarts, renewed for a copy (a file copied, a database
made from another as its template)."""

import shutil

import psycopg2

from common.models import ShardState
from shard.instance import ensure_instance, physical_identity
from tests.support import Role, drop_database, fresh_database_url, using_postgres

INSTANCE = "from shard.instance import ensure_instance\nresult = ensure_instance()"


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
