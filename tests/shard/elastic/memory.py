"""An in-memory worker backend and a settable clock for the worker manager's tests."""

from datetime import UTC, datetime
from pathlib import Path

from shard.elastic.backends import Backend, BackendError, WorkerSpec
from shard.elastic.policy import Worker, WorkerState

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class MemoryBackend(Backend):
    """Workers in a dict; each call can be made to fail, and a start can fail after it took effect."""

    name = "memory"

    def __init__(self, clock: "Clock") -> None:
        super().__init__(WorkerSpec("memory", ("true",), cwd=Path("."), log_dir=Path(".")))
        self.clock = clock
        self.workers: dict[str, Worker] = {}
        self.next_id = 0
        self.fail: set[str] = set()
        self.starts: list[datetime] = []
        self.stopped: list[tuple[Worker, int]] = []
        self.queued = 0

    def list_workers(self) -> list[Worker]:
        if "list" in self.fail:
            raise BackendError("list failed")
        return list(self.workers.values())

    def start(self) -> str:
        self.starts.append(self.clock.now)
        if "start" in self.fail:
            raise BackendError("start failed")
        self.next_id += 1
        worker = Worker(str(self.next_id), WorkerState.PENDING, order=self.next_id)
        self.workers[worker.id] = worker
        if "start-lost" in self.fail:
            raise BackendError("timed out, though the worker was submitted")
        return worker.id

    def stop(self, worker_id: str) -> None:
        if "stop" in self.fail:
            raise BackendError("stop failed")
        pending = sum(w.state == WorkerState.PENDING for w in self.workers.values())
        self.stopped.append((self.workers.pop(worker_id), pending - self.queued))


class Clock:
    def __init__(self) -> None:
        self.now = EPOCH

    def __call__(self) -> datetime:
        return self.now
