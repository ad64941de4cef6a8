"""Holding an HQE row against a concurrent purge while a shard's upload writes rows that refer to it."""

from django.db import connection

from common.models import HostQueueEntry


def hold_hqe(hqe_id: int) -> bool:
    """Locks the HQE's row FOR KEY SHARE until the transaction ends; False when it is gone.

    A result, trace or log row refers to its HQE through a foreign key that PostgreSQL checks only at
    commit (Django makes them deferred): a purge deleting the HQE in between failed one side with an
    IntegrityError. Taken first, this lock (the one the check itself would take) makes the purge wait
    for the upload, or the upload find the HQE gone; it does not block the heartbeat's updates of the
    row. SQLite has one writer at a time, so a plain read is enough there."""
    table = connection.ops.quote_name(HostQueueEntry._meta.db_table)
    lock = " FOR KEY SHARE" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s{lock}", [hqe_id])
        return cursor.fetchone() is not None
