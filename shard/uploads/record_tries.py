"""Failed tries of one record (a result file, a job trace, a run's log) the master answered but did
not take: each record waits its own backoff and is given up after a bounded number of tries, so one
record the master fails on never holds back the others (docs/protocol.md, "Results").

A try counts only when the master showed it was working since the record's previous counted try
(some request, or a heartbeat, was answered well): a master that fails everything (its database
down) is an outage, which delays records but never gives them up. Kept in memory: a restarted shard
counts from zero again, so a record is tried at most `max_tries` times per start.
"""

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from common.loop import Backoff

# The longest a record waits between tries.
RECORD_RETRY_CAP_S = 60.0


@dataclass
class Attempts:
    count: int = 0
    counted_at: float = float("-inf")
    next_at: float = 0.0
    last: str = ""
    backoff: Backoff | None = None


class RecordTries:
    def __init__(self, max_tries: int, interval: Callable[[], float], healthy_at: Callable[[], float | None]) -> None:
        self.max_tries = max(1, max_tries)
        self.interval = interval
        self.healthy_at = healthy_at
        self.by_key: dict[Hashable, Attempts] = {}

    def due(self, key: Hashable) -> bool:
        """Whether the record may be tried now (never failed, or its backoff has passed)."""
        attempts = self.by_key.get(key)
        return attempts is None or time.monotonic() >= attempts.next_at

    def failed(self, key: Hashable, reason: str) -> str | None:
        """Notes a failed try; the reason to give the record up with once it has failed `max_tries`
        times, else None (it waits its backoff)."""
        now = time.monotonic()
        attempts = self.by_key.setdefault(key, Attempts())
        healthy = self.healthy_at()
        if attempts.count == 0 or (healthy is not None and healthy > attempts.counted_at):
            attempts.count += 1
            attempts.counted_at = now
        attempts.last = reason
        if attempts.backoff is None:
            attempts.backoff = Backoff(base_s=max(self.interval(), 1.0), cap_s=RECORD_RETRY_CAP_S)
        attempts.next_at = now + attempts.backoff.failed()
        if attempts.count < self.max_tries:
            return None
        del self.by_key[key]
        return f"failed on it {attempts.count} times; the last: {reason}"

    def done(self, key: Hashable) -> None:
        self.by_key.pop(key, None)

    def waiting(self) -> int:
        return len(self.by_key)
