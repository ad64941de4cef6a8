"""The shard's outbox: every HQE status change becomes an update with a seq that never repeats."""

from typing import Any

from django.db import transaction
from django.db.models import F

from common.models import HostQueueEntry, OutboxEntry, ShardState
from common.wire import format_time


def next_seq() -> int:
    """Takes the next seq; the counter lives in its own row so an emptied outbox never reuses one."""
    state, _ = ShardState.objects.get_or_create(id=1)
    ShardState.objects.filter(id=state.id).update(last_seq=F("last_seq") + 1)
    return ShardState.objects.values_list("last_seq", flat=True).get(id=state.id)


def enqueue(hqe: HostQueueEntry) -> OutboxEntry:
    """Queues the HQE's current state for the master. Call it in the transaction that changed the HQE."""
    assert transaction.get_connection().in_atomic_block, "enqueue must run inside the HQE change's transaction"
    seq = next_seq()
    payload: dict[str, Any] = {
        "seq": seq,
        "hqe": hqe.id,
        "job": hqe.job_id,
        "status": hqe.status,
        "host": hqe.host_id,
        "started_on": format_time(hqe.started_on),
        "finished_on": format_time(hqe.finished_on),
    }
    if hqe.failure:
        payload["failure"] = hqe.failure
    if hqe.exit_code is not None:
        payload["exit_code"] = hqe.exit_code
    if hqe.log_tail:
        payload["log_tail"] = hqe.log_tail
    return OutboxEntry.objects.create(seq=seq, hqe_id=hqe.id, job_id=hqe.job_id, payload=payload)


def pending(limit: int) -> list[dict[str, Any]]:
    return list(OutboxEntry.objects.order_by("seq").values_list("payload", flat=True)[:limit])
