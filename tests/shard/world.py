"""A shard's world for in-process scheduler tests: hosts and jobs arrive the way the master sends them
(through `apply_response`), and the scheduler runs real commands with the local executor."""

import contextlib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from django.utils import timezone

from common.models import Host, HostQueueEntry, Job
from common.wire import HeartbeatResponse, format_time
from shard.config import SchedulerConfig
from shard.models import HostState, Run
from shard.run.scheduler import Scheduler
from shard.sync.ingest import IngestResult, apply_response
from tests.support import wait_until


def apply_wire(body: dict[str, Any]) -> IngestResult:
    """Applies a response given as JSON, as the client does: parsed by the wire contract first."""
    response = HeartbeatResponse.parse({"protocol": 1, **body})
    assert not response.skipped, response.skipped
    return apply_response(response)


class ShardWorld:
    def __init__(self, tmp_path: Path, **config: Any) -> None:
        defaults: dict[str, Any] = {"tick_s": 0.05, "abort_grace_s": 2.0, "minute_s": 1.0}
        self.config = SchedulerConfig(results_root=tmp_path / "results", **(defaults | config))
        self.scheduler = Scheduler(self.config)
        self._ids = {"host": 0, "job": 0, "hqe": 0}

    def _next(self, kind: str) -> int:
        self._ids[kind] += 1
        return self._ids[kind]

    def host(
        self,
        hostname: str,
        labels: tuple[str, ...] = (),
        *,
        locked: bool = False,
        attributes: dict[str, str] | None = None,
        version: int = 1,
        host_id: int | None = None,
    ) -> int:
        host_id = host_id or self._next("host")
        wire = {
            "id": host_id,
            "version": version,
            "hostname": hostname,
            "labels": list(labels),
            "locked": locked,
            "lock_reason": "test" if locked else "",
            "attributes": attributes or {},
        }
        apply_wire({"hosts": [wire]})
        return host_id

    def job(
        self,
        command: str,
        *,
        meta_host: str | None = None,
        host: int | None = None,
        count: int = 1,
        priority: int = 40,
        deps: tuple[str, ...] = (),
        timeout_mins: int = 1440,
        max_runtime_mins: int = 60,
        keyvals: dict[str, str] | None = None,
        parent: tuple[int, dict[str, str]] | None = None,
        created_on: datetime | None = None,
        aborted: bool = False,
    ) -> int:
        job_id = self._next("job")
        hqes = [{"id": self._next("hqe"), "host_id": host, "meta_host": meta_host} for _ in range(count)]
        wire = {
            "id": job_id,
            "version": 1,
            "name": f"job{job_id}",
            "owner": "ana",
            "priority": priority,
            "command": command,
            "timeout_mins": timeout_mins,
            "max_runtime_mins": max_runtime_mins,
            "dependency_labels": list(deps),
            "keyvals": keyvals or {},
            "parent_id": parent[0] if parent else None,
            "aborted": aborted,
            "created_on": format_time(created_on or timezone.now()),
            "hqes": hqes,
        }
        apply_wire({"jobs": [wire], "suite_keyvals": {str(parent[0]): parent[1]} if parent else {}})
        return job_id

    def abort(self, job_id: int) -> None:
        Job.objects.filter(id=job_id).update(aborted=True)

    def hqes(self, job_id: int) -> list[HostQueueEntry]:
        return list(HostQueueEntry.objects.filter(job_id=job_id).select_related("run").order_by("id"))

    def hqe(self, job_id: int) -> HostQueueEntry:
        (hqe,) = self.hqes(job_id)
        return hqe

    def host_status(self, host_id: int) -> str:
        return Host.objects.get(id=host_id).status

    def host_state(self, host_id: int) -> HostState:
        return HostState.objects.get(host_id=host_id)

    def results_dir(self, job_id: int) -> str:
        """The results directory of the job's one HQE's run; "" until it has one."""
        dirs = list(Run.objects.filter(hqe__job_id=job_id).values_list("results_dir", flat=True))
        assert len(dirs) <= 1, f"job {job_id} has {len(dirs)} runs"
        return dirs[0] if dirs else ""

    def run_until(self, predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
        """Ticks the scheduler until `predicate` holds; generous timeouts, never an elapsed-time assertion."""
        return wait_until(
            lambda: self.scheduler.tick() or predicate(), timeout=timeout, interval=self.config.tick_s, what=what
        )

    def finished(self, *job_ids: int) -> bool:
        return not HostQueueEntry.objects.filter(
            job_id__in=job_ids, status__in=("Queued", "Starting", "Running")
        ).exists()

    def idle(self) -> bool:
        return not self.scheduler.busy and not Host.objects.exclude(status__in=("Ready", "Repair Failed")).exists()

    def stop(self) -> None:
        """Kills whatever a failed test left running."""
        self.scheduler.stop_runs(at_once=True)
        self.scheduler.hosts.stop_all()
        with contextlib.suppress(AssertionError):
            wait_until(
                lambda: self.scheduler.tick(start_new=False) or not self.scheduler.runs,
                timeout=10,
                interval=0.05,
                what="the runs to end",
            )
        self.scheduler.executor.kill_runner(self.scheduler.runner_id)


def make_world(tmp_path: Path, request: Any, **config: Any) -> ShardWorld:
    """A world with its own scheduler settings, stopped when the test ends (`request` is pytest's)."""
    w = ShardWorld(tmp_path / "w", **config)
    request.addfinalizer(w.stop)
    return w
