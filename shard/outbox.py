"""The shard's outbox: every HQE status change becomes an update with a seq that never repeats."""

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import F

from common.models import HostQueueEntry
from common.wire import Update, clean_text
from shard.models import OutboxEntry, ShardState


def reserve_seqs(count: int) -> range:
    """Takes the next `count` seqs; the counter lives in its own row so an emptied outbox never reuses one."""
    state, _ = ShardState.objects.get_or_create(id=1)
    ShardState.objects.filter(id=state.id).update(last_seq=F("last_seq") + count)
    last = ShardState.objects.values_list("last_seq", flat=True).get(id=state.id)
    return range(last - count + 1, last + 1)


def next_seq() -> int:
    return reserve_seqs(1)[0]


def update_of(hqe: HostQueueEntry, seq: int) -> Update:
    """The HQE's current state as the wire's update; text a job wrote is cleaned of NUL and surrogates."""
    return Update(
        seq=seq,
        hqe=hqe.id,
        job=hqe.job_id,
        status=hqe.status,
        host=hqe.host_id,
        failure=hqe.failure,
        exit_code=hqe.exit_code,
        started_on=hqe.started_on,
        finished_on=hqe.finished_on,
        log_tail=clean_text(hqe.log_tail) if hqe.log_tail else None,
    )


def enqueue_many(hqes: Sequence[HostQueueEntry]) -> list[OutboxEntry]:
    """Queues the HQEs' current states for the master. Call it in the transaction that changed them."""
    assert transaction.get_connection().in_atomic_block, "enqueue must run inside the HQE change's transaction"
    if not hqes:
        return []
    entries = [
        OutboxEntry(seq=seq, hqe_id=hqe.id, job_id=hqe.job_id, payload=update_of(hqe, seq).to_wire())
        for hqe, seq in zip(hqes, reserve_seqs(len(hqes)), strict=True)
    ]
    return OutboxEntry.objects.bulk_create(entries)


def enqueue(hqe: HostQueueEntry) -> OutboxEntry:
    return enqueue_many([hqe])[0]


def pending(limit: int) -> list[dict[str, Any]]:
    return list(OutboxEntry.objects.order_by("seq").values_list("payload", flat=True)[:limit])


def outbox_depth() -> int:
    """Updates waiting to be sent: the master shows it (`shard stat`) as the shard last reported it."""
    return OutboxEntry.objects.count()
