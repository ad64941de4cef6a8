"""The one background loop of both roles: run a step until a stop event is set; a failing step is
logged and retried after an exponential back-off with full jitter, reset by the next success.

Jitter matters after a master restart: thousands of shards that failed together must not retry
together (a thundering herd was measured), so each retry waits a uniformly random share of its
exponential bound. The bound is capped low where a quick return matters (heartbeat, log shipping).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# The shortest wait after a failure: full jitter may draw zero, and a step failing at once must not spin.
MIN_RETRY_S = 0.05


@dataclass
class Backoff:
    """Exponential back-off with full jitter: after the nth failure in a row a wait drawn uniformly
    from [MIN_RETRY_S, min(cap_s, base_s * 2**(n-1))]."""

    base_s: float
    cap_s: float
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def bound(self) -> float:
        """The largest wait the current run of failures allows."""
        if self.failures <= 0:
            return 0.0
        return min(self.cap_s, self.base_s * 2.0 ** min(self.failures - 1, 32))

    def failed(self) -> float:
        """Counts one more failure; returns how long to wait before the next try."""
        self.failures += 1
        bound = self.bound()
        return max(min(MIN_RETRY_S, bound), self.rng.uniform(0.0, bound))

    def succeeded(self) -> None:
        self.failures = 0


def run_until_stopped(
    step: Callable[[], float | None],
    stop: threading.Event,
    *,
    what: str,
    log: logging.Logger,
    backoff: Backoff,
    expected: tuple[type[BaseException], ...] = (),
    fatal: tuple[type[BaseException], ...] = (),
    on_error: Callable[[BaseException], None] | None = None,
    wait: Callable[[float], object] | None = None,
    verb: str = "failed",
) -> None:
    """Calls `step` until `stop` is set or `step` returns None; a float it returns is the wait before
    the next call. An exception in `fatal` ends the loop (raised to the caller); one in `expected` is
    logged as a warning ("WHAT VERB (why)"), any other with its traceback; either is passed to
    `on_error` (cleanup, counters) and followed by the back-off's wait. Waits on `stop` (or on `wait`,
    which must return when `stop` is set), so a stop is seen at once."""
    pause = wait if wait is not None else stop.wait
    while not stop.is_set():
        try:
            delay = step()
        except fatal:
            raise
        except Exception as exc:
            delay = backoff.failed()
            if isinstance(exc, expected):
                log.warning("%s %s (%s); retrying in %.1f s", what, verb, exc, delay)
            else:
                log.exception("%s failed unexpectedly; retrying in %.1f s", what, delay)
            if on_error is not None:
                on_error(exc)
        else:
            backoff.succeeded()
            if delay is None:
                return
        if delay > 0:
            pause(delay)
