"""The worker manager's policy, as docs/design.md ("Elastic workers") writes it: a pure function of what the
backend reports, the queued work and the time since the last start, so a restart changes nothing.

Each tick it starts one worker when work is queued, unless there are `max_workers` workers, pending
workers already cover the queued HQEs, or the last start was less than `min_seconds_between_workers`
ago. Below `min_workers` it starts one whatever the queue (the interval still holds: starts are
always that far apart). Pending workers beyond the queued work (it was cancelled or taken by other
workers) are stopped, newest first, but never below `min_workers`; an active worker is never stopped:
workers leave on their own once idle (`run_shard --exit-when-idle`).
"""

from dataclasses import dataclass
from enum import StrEnum


class WorkerState(StrEnum):
    """A worker as its backend sees it: waiting for resources (pending), or running (active)."""

    PENDING = "pending"
    ACTIVE = "active"


class Skip(StrEnum):
    """Why a tick with queued work (or below the minimum) started nothing."""

    MAX_WORKERS = "max-workers"
    PENDING_COVERS_QUEUE = "pending-covers-queue"
    RATE_LIMIT = "rate-limit"


@dataclass(frozen=True)
class Worker:
    """One worker of the pool. `order` sorts workers by start (the newest is stopped first)."""

    id: str
    state: WorkerState
    order: float = 0.0


@dataclass(frozen=True)
class Limits:
    min_workers: int
    max_workers: int
    min_seconds_between_workers: float

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(f"need 0 <= --min-workers <= --max-workers, not {self.min_workers} and {self.max_workers}")
        if not 0 <= self.min_seconds_between_workers < 10**9:
            raise ValueError(
                f"--min-seconds-between-workers must be 0 or more seconds, not {self.min_seconds_between_workers}"
            )


@dataclass(frozen=True)
class Decision:
    start: bool
    skip: Skip | None
    stop: tuple[str, ...]


def rate_limited(limits: Limits, since_last_start: float | None) -> bool:
    """Whether the last start is too recent. A clock stepped back counts as recent, by the same margin."""
    return since_last_start is not None and abs(since_last_start) < limits.min_seconds_between_workers


def decide(
    limits: Limits, queued: int, workers: list[Worker], since_last_start: float | None, slots: int = 1
) -> Decision:
    """What one tick does, given the queued HQEs the pool could run and the backend's list of workers;
    each worker takes `slots` HQEs at once."""
    pending = sorted((w for w in workers if w.state == WorkerState.PENDING), key=lambda w: (w.order, w.id))
    surplus = min(len(pending) - -(-max(queued, 0) // slots), len(workers) - limits.min_workers)
    stop = tuple(w.id for w in pending[len(pending) - surplus :]) if surplus > 0 else ()
    total = len(workers) - len(stop)
    waiting = len(pending) - len(stop)
    skip: Skip | None = None
    if total < limits.min_workers:
        skip = Skip.RATE_LIMIT if rate_limited(limits, since_last_start) else None
        return Decision(skip is None, skip, stop)
    if queued <= 0:
        return Decision(False, None, stop)
    if total >= limits.max_workers:
        skip = Skip.MAX_WORKERS
    elif waiting * slots >= queued:
        skip = Skip.PENDING_COVERS_QUEUE
    elif rate_limited(limits, since_last_start):
        skip = Skip.RATE_LIMIT
    return Decision(skip is None, skip, stop)
