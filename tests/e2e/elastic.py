"""Helpers of the elastic workers' end-to-end tests: a shard whose work only workers run, a manager
started on it, and a watcher that counts the workers from outside (their processes) as they come and go."""

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.shard.fleet import LabShard, in_list, master_hqes, new_shard, sql, submit
from tests.support import Master

JOBS = 12
MAX_WORKERS = 3
IDLE_S = 3.0
TICK_S = 1.0

# Each worker runs one job at a time, so the manager's count is the pool's capacity.
WORKER_ENV = {"FLEETSHARD_MAX_RUNS": "1", "FLEETSHARD_DRAIN_S": "5"}


def elastic_shard(master: Master, tmp: Path) -> LabShard:
    return new_shard(master, tmp, hosts=MAX_WORKERS, **WORKER_ENV)


def manager_args(shard: LabShard, backend: str, *more: str) -> list[str]:
    return [
        "run_worker_manager",
        f"--backend={backend}",
        "--min-workers=0",
        f"--max-workers={MAX_WORKERS}",
        "--min-seconds-between-workers=0.5",
        f"--idle-seconds={IDLE_S:g}",
        f"--tick-seconds={TICK_S:g}",
        f"--label={shard.label}",
        *more,
    ]


def worker_pids(shard_hostname: str) -> set[int]:
    """The `run_shard --exit-when-idle` processes of this shard now, read from /proc (not counting a
    worker's child forked for a job and not yet turned into it)."""
    pids: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if b"run_shard" not in cmdline or not any(a.startswith(b"--exit-when-idle") for a in cmdline):
                continue
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] == "Z":
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FLEETSHARD_SHARD_HOSTNAME={shard_hostname}".encode() in environ:
            pids[int(entry.name)] = int(stat[1])
    return {pid for pid, parent in pids.items() if parent not in pids}


@dataclass
class WorkerWatch:
    """Samples the shard's worker processes every 100 ms in a thread: the most at once, and when the
    last one went."""

    shard_hostname: str
    most: int = 0
    seen: set[int] = field(default_factory=set)
    last_seen_at: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> "WorkerWatch":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = worker_pids(self.shard_hostname)
            self.most = max(self.most, len(pids))
            self.seen |= pids
            if pids:
                self.last_seen_at = time.monotonic()
            self._stop.wait(0.1)


def submit_jobs(master: Master, shard: LabShard, command: str = "sleep 1") -> list[int]:
    return submit(
        master, [{"name": f"e{n}", "command": command, "meta_hosts": [[shard.label, 1]]} for n in range(JOBS)]
    )


def all_ended(master: Master, shard: LabShard, jobs: list[int]) -> bool:
    """Every job ended on the master, and nothing of them is left queued or running on the shard."""
    rows = master_hqes(master, jobs)
    if len(rows) != len(jobs) or any(r[1] in ("Queued", "Starting", "Running") for r in rows):
        return False
    active = sql(
        shard.url,
        "SELECT count(*) FROM common_hostqueueentry WHERE status IN ('Queued', 'Starting', 'Running') "
        f"AND job_id IN {in_list(jobs)}",
    )
    return active == [(0,)]


def kill_workers(shard_hostname: str) -> None:
    for pid in worker_pids(shard_hostname):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
