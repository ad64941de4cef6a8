"""A shard database's instance id: kept across restarts, renewed for a copy (a file copied, a database
made from another as its template)."""

import shutil
import subprocess
import uuid
from typing import Any

import psycopg2

from shard.models import ShardState
from shard.sync.instance import ensure_instance, physical_identity, renew_instance
from tests.support import Master, Role, drop_database, fresh_database_url, make_world, using_postgres

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


def _tick(master: Master, world: dict[str, Any]) -> str:
    """One heartbeat of the shard's client in the role's process: "ok", or why the master refused it."""
    return f"""
from shard.sync.client import HeartbeatClient, InstanceRefused
client = HeartbeatClient({master.url!r}, {world["shard"]!r}, {world["token"]!r})
try:
    client.tick()
    result = "ok"
except InstanceRefused as exc:
    result = str(exc)
"""


RUN_TO_COMPLETION = """
from common.models import Host, HostQueueEntry
from shard.services import finish_hqe, transition_hqe
hqe = HostQueueEntry.objects.get()
transition_hqe(hqe.id, "Running", host_id=Host.objects.order_by("id").first().id)
finish_hqe(hqe.id, "Completed", exit_code=0)
result = None
"""

SILENCE = """
from datetime import timedelta
from django.db.models import F
from common.models import Shard
result = Shard.objects.filter(id={shard}).update(last_heartbeat=F("last_heartbeat") - timedelta(hours=1))
"""

STATE = """
from common.models import HostQueueEntry
from shard.models import ShardState
result = [ShardState.objects.get().instance, list(HostQueueEntry.objects.values_list("status", flat=True))]
"""


def test_a_backup_restored_in_place_is_refused_then_taken_as_a_new_database_that_runs_nothing_again(
    tmp_path, master_server
):
    """The restored database keeps its physical identity, and so its instance id, but its seq counter
    went back: the master refuses it (409 `last_seq`) and it takes a new instance id, which the master
    takes as a new database once the old one is silent, telling it that the job it ran after the
    backup has ended."""
    world = make_world(master_server, f"r{uuid.uuid4().hex[:6]}", hosts=1)
    role = Role("shard", fresh_database_url(tmp_path, "orig", migrated_as="shard"), tmp_path)
    try:
        assert role.shell(_tick(master_server, world)) == "ok"
        first, statuses = role.shell(STATE)
        assert statuses == ["Queued"]
        _back_up(role, tmp_path)
        role.shell(RUN_TO_COMPLETION)
        assert role.shell(_tick(master_server, world)) == "ok"
        _restore_in_place(role, tmp_path)
        assert role.shell(STATE) == [first, ["Queued"]]

        refused = role.shell(_tick(master_server, world))
        assert "database went back in time" in refused and "takes the new instance id" in refused
        renewed, statuses = role.shell(STATE)
        assert renewed != first and renewed in refused and statuses == ["Queued"]
        # The new instance is taken once the old one has been silent for three intervals.
        master_server.shell(SILENCE.format(shard=world["shard_id"]))
        assert role.shell(_tick(master_server, world)) == "ok"
        assert role.shell(STATE) == [renewed, ["Completed"]]
    finally:
        drop_database(role.database_url)


def test_an_instance_is_renewed_once_however_many_processes_were_refused(db):
    first = ensure_instance()
    ShardState.objects.filter(id=1).update(last_heartbeat_ok="2026-11-26T10:00:00Z")
    renewed = renew_instance(first, 1)
    assert renewed != first and renew_instance(first, 1) == renewed and ensure_instance() == renewed
    assert ShardState.objects.get(id=1).last_heartbeat_ok is None


def test_an_instance_whose_counter_reached_the_seq_the_master_saw_is_not_renewed(db):
    """The refused request was overtaken by a newer one of this database: it did not go back."""
    first = ensure_instance()
    ShardState.objects.filter(id=1).update(last_seq=42, last_heartbeat_ok="2026-11-26T10:00:00Z")
    assert renew_instance(first, 42) is None and renew_instance(first, 7) is None
    state = ShardState.objects.get(id=1)
    assert state.instance == first and state.last_heartbeat_ok is not None
    assert renew_instance(first, 43) not in (None, first)
