"""Appending to and reading the master's copy of a run's log (docs/protocol.md, "Logs").

Bytes in, text out. A shard pushes the bytes of its `job.log` at explicit offsets, so a chunk sent
twice (a lost answer, a retry racing the first try) is recognised and kept once, and a chunk that would
leave a hole is refused with the offset the master expects. The master keeps the first
FLEETSHARD_MAX_LOG_BYTES of each log; past that it only counts bytes, and a reader is told the log was
cut. A reader gets text: UTF-8, each invalid byte and NUL shown as U+FFFD, and never half a character
(a slice ends before an incomplete sequence the next chunk may finish).
"""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.constants import HQEStatus
from common.errors import FleetshardError, NotFound
from common.models import HostQueueEntry
from common.wire import clean_text
from master.logs.models import RunLog, RunLogChunk
from master.services.hqe_guard import hold_hqe

# An HQE ended this long ago whose shard never said its log ended (a shard without log shipping, or
# one that lost the run) has a log that is not coming: a follower stops waiting for it.
LOG_SETTLE = timedelta(seconds=60)
# Appends smaller than this go into the log's last row while it stays this small (see _store).
MERGE_BELOW = 16 * 1024


class LogGap(FleetshardError):
    """A chunk starts past the end of what the master has: the shard resends from `expected`."""

    def __init__(self, hqe_id: int, offset: int, expected: int) -> None:
        super().__init__(
            f"offset: the log of HQE {hqe_id} has {expected} bytes, so a chunk at {offset} would leave a gap: "
            f"send from offset {expected}",
            field="offset",
        )
        self.expected = expected


class LogEnded(FleetshardError):
    """Bytes past the end of a log the shard said ended: a follower that stopped there would miss them."""

    def __init__(self, hqe_id: int, size: int) -> None:
        super().__init__(
            f"offset: the log of HQE {hqe_id} ended at byte {size} (a final chunk came): no bytes may follow it",
            field="offset",
        )


@dataclass(frozen=True)
class Appended:
    """Where a log stands after a chunk: `size` bytes of the shard's log accounted for (the next chunk
    starts there), `kept` of them stored; `new` of the chunk's bytes were not had before."""

    size: int
    kept: int
    complete: bool
    new: int

    @property
    def truncated(self) -> bool:
        return self.size > self.kept


@transaction.atomic
def append_log(hqe_id: int, offset: int, data: bytes, *, final: bool = False) -> Appended:
    """Adds the chunk `data` found at byte `offset` of the HQE's log; `final`: the log ends with it.

    Bytes below the log's size are the master's already (a duplicate changes nothing); a chunk past
    it raises LogGap, except once the log is cut: nothing past the cap is stored, so nothing is missed.
    Once a final chunk came, bytes past the log's size raise LogEnded (a repeated final is a duplicate).
    Raises NotFound (field `hqe`) when the HQE is gone (purged) by now.
    """
    if not hold_hqe(hqe_id):
        raise NotFound(f"hqe: unknown HQE {hqe_id}", field="hqe")
    try:
        log = RunLog.objects.select_for_update().get(hqe_id=hqe_id)
    except RunLog.DoesNotExist:
        # Two first chunks may race: one row is made, both then wait for its lock.
        RunLog.objects.bulk_create([RunLog(hqe_id=hqe_id)], ignore_conflicts=True)
        log = RunLog.objects.select_for_update().get(hqe_id=hqe_id)
    size, kept = log.size, log.kept
    if log.complete and offset + len(data) > size:
        raise LogEnded(hqe_id, size)
    if offset > size and not log.truncated:
        raise LogGap(hqe_id, offset, size)
    fresh = data[max(0, size - offset) :]
    if fresh and size == kept:
        keep = fresh[: max(0, settings.FLEETSHARD_MAX_LOG_BYTES - kept)]
        if keep:
            _store(log, kept, keep)
            kept += len(keep)
    new_size = max(size, offset + len(data))
    complete = log.complete or final
    if (new_size, kept, complete) != (log.size, log.kept, log.complete):
        RunLog.objects.filter(hqe_id=hqe_id).update(
            size=new_size, kept=kept, complete=complete, updated_on=timezone.now()
        )
    return Appended(size=new_size, kept=kept, complete=complete, new=new_size - size)


def _store(log: RunLog, kept: int, keep: bytes) -> None:
    """Stores `keep` at byte `kept` (the log's end): into its last row while that stays under
    MERGE_BELOW, so a log sent a few bytes at a time is a row per 16 KiB, not a row per request."""
    if len(keep) < MERGE_BELOW and kept > 0:
        last = RunLogChunk.objects.filter(log=log, end=kept, start__gte=kept + len(keep) - MERGE_BELOW).first()
        if last is not None:
            RunLogChunk.objects.filter(id=last.id).update(end=kept + len(keep), data=bytes(last.data) + keep)
            return
    RunLogChunk.objects.create(log=log, start=kept, end=kept + len(keep), data=keep)


@dataclass(frozen=True)
class LogSlice:
    """Bytes [offset, next_offset) of a log's kept part as text, and where the log stands."""

    offset: int
    next_offset: int
    text: str
    size: int
    truncated: bool
    complete: bool
    ended: bool


def read_log(hqe: HostQueueEntry, offset: int, limit: int) -> LogSlice:
    """Up to `limit` bytes of the HQE's log from byte `offset` (past the end: none; inside a character:
    from the next one), as text."""
    log = RunLog.objects.filter(hqe_id=hqe.id).first()
    if log is None:
        return LogSlice(offset, offset, "", 0, False, False, log_ended(hqe, None))
    start = min(offset, log.kept)
    stop = min(log.kept, start + limit)
    data = b""
    if stop > start:
        # The 3 bytes before `start` tell whether it falls inside a character (then skipped).
        low = max(0, start - 3)
        rows = RunLogChunk.objects.filter(log_id=hqe.id, end__gt=low, start__lt=stop).order_by("start")
        pieces = list(rows.values_list("start", "data"))
        first = pieces[0][0] if pieces else low
        data = b"".join(bytes(piece) for _, piece in pieces)[low - first : stop - first]
        inside = utf8_inside(data[: start - low], data[start - low :])
        start += inside
        data = data[start - low :]
    # The log's last kept bytes are final once the shard said so or the cap cut it: an incomplete
    # character there is shown as U+FFFD rather than waited for.
    settled = stop == log.kept and (log.complete or log.truncated)
    used = len(data) if settled else utf8_prefix(data)
    text = clean_text(data[:used].decode("utf-8", errors="replace"))
    return LogSlice(start, start + used, text, log.kept, log.truncated, log.complete, log_ended(hqe, log))


def utf8_prefix(data: bytes) -> int:
    """The length of `data` without a UTF-8 sequence cut short at its end (which the next bytes finish)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for its lead
            continue
        if byte < 0x80:
            return len(data)
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return len(data) if back >= need else len(data) - back
    return len(data)


def utf8_inside(before: bytes, data: bytes) -> int:
    """How many of `data`'s first bytes continue a valid UTF-8 sequence begun in `before` (a reader's
    offset inside a character): 0 when the offset is a character's start or the bytes are invalid."""
    for back in range(1, len(before) + 1):
        lead = before[-back]
        if lead & 0xC0 == 0x80:
            continue
        need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
        rest = need - back
        if rest <= 0:
            return 0
        if len(data) < rest:  # the rest of the character has not come yet: skip what there is of it
            return len(data) if all(byte & 0xC0 == 0x80 for byte in data) else 0
        whole = before[-back:] + data[:rest]
        try:
            whole.decode("utf-8")
        except UnicodeDecodeError:
            return 0
        return rest
    return 0


def log_ended(hqe: HostQueueEntry, log: RunLog | None) -> bool:
    """Whether no more of the log is coming: the shard said it ended, the HQE never ran, or it ended
    LOG_SETTLE ago without its shard saying so."""
    if log is not None and log.complete:
        return True
    if hqe.status in HQEStatus.ACTIVE:
        return False
    if hqe.started_on is None or hqe.finished_on is None:
        return True
    return timezone.now() - hqe.finished_on > LOG_SETTLE
