"""One lock order for every writer of a shard's database.

Every HQE change takes the outbox counter (ShardState's row) to number its update, and the heartbeat's
ingest holds it too. Taking that row first, before any host or HQE row, keeps the order the same in
every transaction, so on PostgreSQL two scheduler processes and the heartbeat never deadlock.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import transaction

from shard.models import ShardState


@contextmanager
def shard_write() -> Iterator[None]:
    """A transaction that first locks the shard's counter row (a no-op lock on SQLite, whose writers queue)."""
    with transaction.atomic():
        ShardState.objects.select_for_update().get_or_create(id=1)
        yield
