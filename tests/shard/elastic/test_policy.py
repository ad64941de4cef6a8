"""The worker manager's policy against an in-memory backend: whatever the sequence of queued work, workers
starting and leaving, backend failures, clock steps and manager restarts, the invariants of docs/design.md
("Elastic workers") hold. The last start time lives in the real test database, as in production."""

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shard.elastic.manager import WorkerManager
from shard.elastic.policy import Decision, Limits, Skip, Worker, WorkerState, decide
from shard.models import WorkerPool
from tests.shard.elastic.memory import Clock, MemoryBackend


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("low", "high", "gap"), [(0, 3, 5.0), (2, 4, 10.0), (0, 1, 0.0), (3, 3, 2.0)], ids=["0-3", "2-4", "0-1", "3-3"]
)
def test_policy_invariants_hold_whatever_happens(low, high, gap):
    limits = Limits(low, high, gap)

    class Manager(RuleBasedStateMachine):
        @initialize()
        def setup(self) -> None:
            self.key = f"pool-{uuid.uuid4().hex}"
            self.clock = Clock()
            self.backend = MemoryBackend(self.clock)
            self.manager = self.new_manager()
            self.before: list[Worker] = []
            self.last: Decision | None = None

        def new_manager(self) -> WorkerManager:
            return WorkerManager(self.backend, limits, self.key, lambda: self.backend.queued, clock=self.clock)

        @rule(queued=st.integers(0, 8))
        def work_changes(self, queued: int) -> None:
            self.backend.queued = queued

        @rule(seconds=st.floats(0, 3 * max(gap, 1)))
        def time_passes(self, seconds: float) -> None:
            self.clock.now += timedelta(seconds=seconds)

        @precondition(lambda self: any(w.state == WorkerState.PENDING for w in self.backend.workers.values()))
        @rule(data=st.data())
        def a_worker_begins_running(self, data: st.DataObject) -> None:
            pending = sorted(w.id for w in self.backend.workers.values() if w.state == WorkerState.PENDING)
            chosen = data.draw(st.sampled_from(pending))
            old = self.backend.workers[chosen]
            self.backend.workers[chosen] = Worker(old.id, WorkerState.ACTIVE, old.order)

        @precondition(lambda self: self.backend.workers)
        @rule(data=st.data())
        def a_worker_leaves(self, data: st.DataObject) -> None:
            """Idle, finished, killed by the batch system: it is gone from the backend's list."""
            del self.backend.workers[data.draw(st.sampled_from(sorted(self.backend.workers)))]

        @rule(call=st.sampled_from(["list", "start", "start-lost", "stop"]), failing=st.booleans())
        def backend_fails_or_recovers(self, call: str, failing: bool) -> None:
            (self.backend.fail.add if failing else self.backend.fail.discard)(call)

        @rule()
        def manager_restarts(self) -> None:
            self.manager = self.new_manager()

        @rule()
        def tick(self) -> None:
            self.before = list(self.backend.workers.values())
            stopped = len(self.backend.stopped)
            self.last = self.manager.tick()
            if self.last is None:
                assert "list" in self.backend.fail
                return
            if len(self.backend.stopped) > stopped:
                left = len(self.before) - (len(self.backend.stopped) - stopped)
                assert left >= low, "pending workers were stopped below the minimum"
            for worker, surplus in self.backend.stopped[stopped:]:
                assert worker.state == WorkerState.PENDING, "an active worker was stopped"
                assert surplus > 0, "a pending worker was stopped while the queued work needed it"
            workers = list(self.backend.workers.values())
            pending = sum(w.state == WorkerState.PENDING for w in workers)
            if "stop" not in self.backend.fail:
                assert pending <= self.backend.queued or len(workers) <= low, "more pending workers than work"

        @invariant()
        def never_above_max(self) -> None:
            assert len(self.backend.workers) <= high

        @invariant()
        def starts_are_the_interval_apart(self) -> None:
            starts = self.backend.starts
            for earlier, later in zip(starts, starts[1:], strict=False):
                assert (later - earlier).total_seconds() >= gap, starts

        @invariant()
        def the_last_start_is_in_the_database(self) -> None:
            if self.backend.starts:
                assert WorkerPool.objects.get(key=self.key).last_start == self.backend.starts[-1]

    Manager.TestCase.settings = settings(
        max_examples=30,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    Manager.TestCase().runTest()


def workers(pending: int, active: int) -> list[Worker]:
    return [Worker(f"p{n}", WorkerState.PENDING, n) for n in range(pending)] + [
        Worker(f"a{n}", WorkerState.ACTIVE, 100 + n) for n in range(active)
    ]


@pytest.mark.parametrize(
    ("queued", "pending", "active", "since", "expected"),
    [
        (1, 0, 0, None, Decision(True, None, ())),
        (0, 0, 0, None, Decision(False, None, ())),
        (5, 0, 3, None, Decision(False, Skip.MAX_WORKERS, ())),
        (2, 2, 0, None, Decision(False, Skip.PENDING_COVERS_QUEUE, ())),
        (3, 2, 0, 4.0, Decision(False, Skip.RATE_LIMIT, ())),
        (3, 2, 0, -4.0, Decision(False, Skip.RATE_LIMIT, ())),
        (3, 2, 0, 5.0, Decision(True, None, ())),
        # The queued work went away: the newest pending workers go, active ones stay.
        (1, 3, 1, None, Decision(False, Skip.PENDING_COVERS_QUEUE, ("p1", "p2"))),
        (0, 2, 5, None, Decision(False, None, ("p0", "p1"))),
    ],
)
def test_decide_as_design_md_writes_it(queued, pending, active, since, expected):
    limits = Limits(0, 3 if active < 5 else 8, 5.0)
    assert decide(limits, queued, workers(pending, active), since) == expected


def test_below_the_minimum_a_worker_starts_without_work_but_not_faster_than_the_interval():
    limits = Limits(2, 4, 5.0)
    assert decide(limits, 0, workers(1, 0), None) == Decision(True, None, ())
    assert decide(limits, 0, workers(1, 0), 1.0) == Decision(False, Skip.RATE_LIMIT, ())
    # Pending workers started for the minimum are kept though no work is queued.
    assert decide(limits, 0, workers(2, 0), None) == Decision(False, None, ())


@pytest.mark.parametrize(("low", "high", "gap"), [(2, 1, 0.0), (-1, 3, 0.0), (0, 3, -1.0), (0, 3, float("nan"))])
def test_limits_refuse_what_cannot_be_kept(low, high, gap):
    with pytest.raises(ValueError, match="--m"):
        Limits(low, high, gap)
