"""The one background loop (common/loop.py): its back-off's bounds, its reset, and how fast it stops."""

import logging
import random
import threading
import time

import pytest

from common.loop import MIN_RETRY_S, Backoff, run_until_stopped
from tests.support import wait_until

log = logging.getLogger(__name__)


def test_backoff_draws_within_a_doubling_bound_capped():
    backoff = Backoff(base_s=1.0, cap_s=5.0, rng=random.Random(7))
    bounds = []
    for _ in range(6):
        delay = backoff.failed()
        bounds.append(backoff.bound())
        assert MIN_RETRY_S <= delay <= backoff.bound()
    assert bounds == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_backoff_jitter_spreads_over_the_whole_bound():
    """Full jitter: shards failing together must not retry together, so the draws cover [0, bound]."""
    draws = []
    for seed in range(400):
        backoff = Backoff(base_s=1.0, cap_s=8.0, failures=3, rng=random.Random(seed))
        draws.append(backoff.failed())
    assert all(MIN_RETRY_S <= d <= 8.0 for d in draws)
    assert min(draws) < 1.0 and max(draws) > 7.0


def test_backoff_resets_on_success():
    backoff = Backoff(base_s=1.0, cap_s=60.0)
    for _ in range(5):
        backoff.failed()
    backoff.succeeded()
    assert backoff.failures == 0
    assert backoff.failed() <= 1.0


def test_a_failing_step_is_logged_and_retried_then_a_success_resets(caplog):
    stop = threading.Event()
    calls: list[str] = []
    backoff = Backoff(base_s=0.01, cap_s=0.02)

    def step() -> float | None:
        calls.append("call")
        if len(calls) <= 3:
            raise ConnectionError("master away")
        if len(calls) == 4:
            assert backoff.failures == 3
            return 0.0
        assert backoff.failures == 0
        return None

    with caplog.at_level(logging.WARNING):
        run_until_stopped(step, stop, what="test loop", log=log, backoff=backoff, expected=(ConnectionError,))
    assert len(calls) == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all(w.startswith("test loop failed (master away); retrying in ") for w in warnings)


def test_an_unexpected_error_is_logged_with_its_traceback_and_passed_to_on_error(caplog):
    stop = threading.Event()
    seen: list[BaseException] = []

    def step() -> float:
        if seen:
            stop.set()
            return 0.0
        raise ValueError("bug")

    with caplog.at_level(logging.ERROR):
        run_until_stopped(step, stop, what="test loop", log=log, backoff=Backoff(0.01, 0.01), on_error=seen.append)
    assert isinstance(seen[0], ValueError)
    assert any(r.exc_info and "test loop failed unexpectedly" in r.getMessage() for r in caplog.records)


def test_a_fatal_error_ends_the_loop():
    def step() -> float:
        raise PermissionError("refused")

    with pytest.raises(PermissionError):
        run_until_stopped(
            step, threading.Event(), what="t", log=log, backoff=Backoff(0.01, 0.01), fatal=(PermissionError,)
        )


def test_stop_ends_a_long_wait_at_once():
    """A loop waiting out a long back-off (or interval) returns as soon as its stop event is set."""
    stop = threading.Event()
    entered = threading.Event()

    def step() -> float:
        entered.set()
        raise ConnectionError("down")

    thread = threading.Thread(
        target=run_until_stopped,
        args=(step, stop),
        kwargs={"what": "t", "log": log, "backoff": Backoff(base_s=60.0, cap_s=60.0, failures=5)},
    )
    thread.start()
    wait_until(entered.is_set, timeout=5, what="the first step")
    time.sleep(0.1)
    started = time.monotonic()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - started < 10.0  # not its 60 s back-off; room for load
