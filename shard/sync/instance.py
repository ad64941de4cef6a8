"""Which shard database this is: its instance id, kept across restarts, renewed when the database is a copy.

A copy of a shard database (a file copied, a dump restored) holds the original's instance id. Beside
the id the database keeps the physical identity it was taken for; when that no longer matches the
database we are connected to, this is a copy and takes a new id, so the master can refuse it while
the original is live (docs/protocol.md, "Shard instances"). A backup restored over the database itself
keeps its identity; the master tells it by its seqs, which went back, and it takes a new id then.
"""

import logging
import os
import uuid

from django.db import DatabaseError, connection, transaction

from shard.models import ShardState

log = logging.getLogger(__name__)


def physical_identity() -> str:
    """For SQLite the file's device and inode; for PostgreSQL the cluster's system id and the database's oid."""
    if connection.vendor == "sqlite":
        path = connection.settings_dict["NAME"]
        st = os.stat(path)
        return f"sqlite:{st.st_dev}:{st.st_ino}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        (oid,) = cursor.fetchone()
        try:
            with transaction.atomic():
                cursor.execute("SELECT system_identifier FROM pg_control_system()")
                (cluster,) = cursor.fetchone()
        except DatabaseError:
            # Without the right to read the control file, the server's address stands for the cluster.
            cursor.execute("SELECT coalesce(host(inet_server_addr()), 'local') || ':' || inet_server_port()")
            (cluster,) = cursor.fetchone()
    return f"postgresql:{cluster}:{oid}"


def current_instance() -> str | None:
    """The instance id this database holds now (another process of it may have renewed it)."""
    return ShardState.objects.filter(id=1).values_list("instance", flat=True).first()


@transaction.atomic
def ensure_instance() -> str:
    """This database's instance id: the stored one, or a new one for a new or copied database."""
    ShardState.objects.get_or_create(id=1)
    state = ShardState.objects.select_for_update().get(id=1)
    identity = physical_identity()
    if state.instance and state.identity == identity:
        return state.instance
    if state.instance:
        log.warning(
            "this shard database is a copy (it was %s, it is %s): taking a new instance id", state.identity, identity
        )
    state.instance = str(uuid.uuid4())
    state.identity = identity
    state.save(update_fields=["instance", "identity"])
    log.info("shard database instance %s", state.instance)
    return state.instance


@transaction.atomic
def renew_instance(refused: str, seq_seen: int) -> str | None:
    """A new instance id in place of `refused`, which the master says went back in time (a backup
    restored over the database, whose physical identity stays): the master then takes this database
    as a new one, and resends what it holds. The acceptance goes too, so no process of the shard acts
    before the master has accepted the new id. Renewed once however many processes were refused.

    None, renewing nothing, when this database's counter stands at `seq_seen` (the highest seq the
    master has had from `refused`) or above: it did not go back, the refused request was overtaken
    by a newer one of this database (another process's: elastic workers share it), and the next
    heartbeat, built anew, goes through. A database gone back that has already counted past
    `seq_seen` would pass the master's check anyway."""
    state = ShardState.objects.select_for_update().get(id=1)
    if state.instance != refused:
        return state.instance
    if state.last_seq >= seq_seen:
        log.info(
            "a heartbeat of instance %s was overtaken by a newer one (the master saw seq %d; this database is at %d)",
            refused,
            seq_seen,
            state.last_seq,
        )
        return None
    log.warning("the master says this shard database went back in time: taking a new instance id for %s", refused)
    state.instance = str(uuid.uuid4())
    state.last_heartbeat_ok = None
    state.save(update_fields=["instance", "last_heartbeat_ok"])
    log.info("shard database instance %s", state.instance)
    return state.instance
