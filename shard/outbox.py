"""The shard's outbox: every HQE status change becomes an update, and every host status change a host
event, each with a seq that never repeats (one counter for both, so they keep one order)."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from common.models import HostQueueEntry
from common.wire import HostEvent as HostEventRecord
from common.wire import Update, clean_text
from shard.models import HostEvent, OutboxEntry, ShardState

# The master refuses a host event more than a day ahead of its clock: a last event further ahead than
# that was a clock gone wrong, and later events do not wait for it.
MAX_CLOCK_LEAD = timedelta(days=1)


def reserve_seqs(count: int) -> range:
    """Takes the next `count` seqs; the counter lives in its own row so an emptied outbox never reuses one."""
    state, _ = ShardState.objects.get_or_create(id=1)
    ShardState.objects.filter(id=state.id).update(last_seq=F("last_seq") + count)
    last = ShardState.objects.values_list("last_seq", flat=True).get(id=state.id)
    return range(last - count + 1, last + 1)


def reserve_event(at: datetime) -> tuple[int, datetime]:
    """The next seq, and the time of a host event said to happen at `at`: never before the last event's,
    so a clock stepping back (NTP, a VM restored) cannot make a later change look earlier and leave
    the status before it open on the master's timeline. A last event more than MAX_CLOCK_LEAD ahead of
    `at` was a clock gone wrong forwards: it is not followed."""
    state, _ = ShardState.objects.get_or_create(id=1)
    clock = Greatest(Coalesce(F("event_clock"), Value(at)), Value(at))
    ShardState.objects.filter(id=state.id).update(last_seq=F("last_seq") + 1, event_clock=clock)
    seq, latest = ShardState.objects.values_list("last_seq", "event_clock").get(id=state.id)
    return seq, latest if latest is not None and latest - at <= MAX_CLOCK_LEAD else at


def committed_seq() -> int:
    """The last seq taken by a committed change: every update and event up to it is readable now, as
    taking a seq locks the counter's row until that change commits."""
    return ShardState.objects.values_list("last_seq", flat=True).first() or 0


def next_seq() -> int:
    return reserve_seqs(1)[0]


def update_of(hqe: HostQueueEntry, seq: int, at: datetime | None = None) -> Update:
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
        at=at,
    )


def enqueue_many(hqes: Sequence[HostQueueEntry]) -> list[OutboxEntry]:
    """Queues the HQEs' current states for the master. Call it in the transaction that changed them."""
    assert transaction.get_connection().in_atomic_block, "enqueue must run inside the HQE change's transaction"
    if not hqes:
        return []
    now = timezone.now()
    entries = [
        OutboxEntry(seq=seq, hqe_id=hqe.id, job_id=hqe.job_id, payload=update_of(hqe, seq, now).to_wire())
        for hqe, seq in zip(hqes, reserve_seqs(len(hqes)), strict=True)
    ]
    return OutboxEntry.objects.bulk_create(entries)


def enqueue(hqe: HostQueueEntry) -> OutboxEntry:
    return enqueue_many([hqe])[0]


def pending(limit: int) -> list[dict[str, Any]]:
    return list(OutboxEntry.objects.order_by("seq").values_list("payload", flat=True)[:limit])


def enqueue_host_event(host_id: int, status: str, at: datetime | None = None) -> HostEvent:
    """Queues a host's status change for the master's timeline. Call it in the transaction of the change."""
    assert transaction.get_connection().in_atomic_block, "enqueue must run inside the host change's transaction"
    seq, when = reserve_event(at or timezone.now())
    return HostEvent.objects.create(seq=seq, host_id=host_id, status=status, at=when)


def pending_host_events(limit: int, before: int | None = None) -> list[dict[str, Any]]:
    """The oldest host events, as the wire has them; only those older than seq `before` when given (the
    updates were cut short there: an event never overtakes the update of the run it follows)."""
    events = HostEvent.objects.order_by("seq")
    if before is not None:
        events = events.filter(seq__lt=before)
    return [
        HostEventRecord(seq=e.seq, host=e.host_id, status=e.status, at=e.at).to_wire()
        for e in events.only("seq", "host_id", "status", "at")[:limit]
    ]


def outbox_depth() -> int:
    """Updates waiting to be sent: the master shows it (`shard stat`) as the shard last reported it."""
    return OutboxEntry.objects.count()
