"""Closing what a crashed scheduler process left behind, and telling live schedulers from dead ones.

Each scheduler process marks the HQEs and hosts it handles with its runner id (machine, pid and the
pid's start time, so a reused pid is not mistaken for the old process); one on another machine (an
elastic worker) is alive while it holds its presence lock in the shard's PostgreSQL database. Work
marked by a runner that no longer exists was abandoned: its HQEs end `Failed`/`infra` and its hosts
are repaired.
"""

import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from django.db import DatabaseError, connection
from django.db.models import Q

from common.constants import FailureClass, HostStatus, HQEStatus
from common.errors import FleetshardError
from common.models import Host, HostQueueEntry
from shard.locks import shard_write
from shard.models import HostState, run_of
from shard.run.executor import Executor
from shard.run.isolation import take_back
from shard.run.tracking import proc_stat
from shard.run.workspace import run_log_tail
from shard.services import HostTaken, finish_hqe, move_host
from shard.sync.leader import runner_present

log = logging.getLogger(__name__)

# How long a scheduler process of another machine may be without its presence lock (re-opening its
# database connection) before its work is taken for abandoned.
PRESENCE_GRACE_S = 30.0
_absent_since: dict[str, float] = {}


def _start_time(pid: int, *, gone_only: bool = False) -> str | None:
    fields = proc_stat(pid, gone_only=gone_only)
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def current_runner_id() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def runner_alive(runner: str) -> bool:
    """Whether the scheduler process `runner` still exists. One on another machine is assumed alive."""
    if not runner:
        return False
    try:
        machine, pid, start = runner.rsplit(":", 2)
        pid_number = int(pid)
    except ValueError:
        return False
    if machine != socket.gethostname():
        return remote_runner_alive(runner)
    try:
        return _start_time(pid_number, gone_only=True) == start
    except OSError:
        return True  # unknown is not dead: its runs must not be closed and killed on a failed read


def remote_runner_alive(runner: str, now: float | None = None) -> bool:
    """Whether a scheduler process of another machine lives: on PostgreSQL, while it holds its presence
    lock (shard.sync.leader), with a grace of PRESENCE_GRACE_S for a connection it is re-opening; elsewhere
    (and when the database cannot say) it is assumed alive, as nothing here can tell."""
    if connection.vendor != "postgresql":
        return True
    try:
        present = runner_present(runner)
    except DatabaseError:
        return True
    now = time.monotonic() if now is None else now
    if present:
        _absent_since.pop(runner, None)
        return True
    return now - _absent_since.setdefault(runner, now) < PRESENCE_GRACE_S


def close_abandoned_hqe(hqe: HostQueueEntry, why: str) -> None:
    """Ends one HQE whose run nobody watches any more as an infra failure, its log's tail kept.

    Pass the HQE with select_related("run"), or its run is read here.
    """
    run = run_of(hqe)
    results_dir = run.results_dir if run else ""
    tail = run_log_tail(results_dir)
    if results_dir and os.geteuid() == 0:
        # Its processes are gone: what it left is no later job's to read (shard.run.isolation.take_back).
        take_back(Path(results_dir))
    note = f"\n[fleetshard] {why}: infra failure\n"
    try:
        with shard_write():
            finish_hqe(hqe.id, HQEStatus.FAILED, failure=FailureClass.INFRA, log_tail=tail + note)
    except FleetshardError:
        return
    log.warning("HQE %s of job %s: %s: closed as an infra failure", hqe.id, hqe.job_id, why)


def recover_abandoned(runner_id: str, executor: Executor) -> list[int]:
    """Ends the HQEs of dead runners as infra failures and takes over their hosts as `Repairing`.

    Everything a dead runner left running on this machine is killed first (its cgroups, else each
    run's process group). Each HQE and host is handled on its own: one that fails is logged and
    retried at the next recovery without holding up the rest.
    Returns the ids of the hosts taken over; the caller runs their repair before they get work.
    """
    alive: dict[str, bool] = {}

    def is_alive(runner: str) -> bool:
        if runner not in alive:
            alive[runner] = runner_alive(runner)
            if not alive[runner] and runner:
                isolated(f"killing what {runner} left", executor.kill_runner, runner)
        return alive[runner]

    # A dead runner's cgroups go even when no record names it (it crashed between a run's end and
    # the removal of the run's cgroup, or it was another shard's on this machine).
    for runner in executor.runners():
        if runner != runner_id:
            is_alive(runner)
    active = (
        HostQueueEntry.objects.filter(status__in=(HQEStatus.STARTING, HQEStatus.RUNNING))
        .exclude(run__runner=runner_id)
        .select_related("run")
    )
    for hqe in active:
        run = run_of(hqe)
        runner = run.runner if run else ""
        if is_alive(runner):
            continue
        if run and run.pid and runner.rsplit(":", 2)[0] == socket.gethostname():
            isolated(f"HQE {hqe.id}: killing its processes", executor.kill_orphan, run.pid, hqe.id)
        isolated(
            f"HQE {hqe.id}: closing",
            close_abandoned_hqe,
            hqe,
            f"abandoned: the shard process running this job ({runner or 'none'}) is gone (crash or restart)",
        )

    taken = []
    busy = (HostStatus.RUNNING, HostStatus.CLEANING, HostStatus.REPAIRING)
    # A host with no state (not stored by shard.sync.ingest, or by an old shard process during the upgrade)
    # matches no claim: it gets one here, held by nobody, or it would be skipped forever.
    hosts = Host.objects.filter(Q(status__in=busy) | Q(state__isnull=True)).exclude(state__runner=runner_id)
    for host_id, hostname, status, runner in hosts.values_list("id", "hostname", "status", "state__runner"):
        if runner is None:
            HostState.objects.bulk_create([HostState(host_id=host_id)], ignore_conflicts=True)
            if status not in busy:
                continue
            runner = ""
        if is_alive(runner):
            continue
        try:
            with shard_write():
                move_host(host_id, HostStatus.REPAIRING, held_by=runner, holder=runner_id, status=status)
        except HostTaken:
            continue
        except Exception:
            log.exception("host %s: cannot take it over; retrying at the next recovery", hostname)
            continue
        log.warning("host %s was left %s by %s: repairing it", hostname, status, runner or "nobody")
        taken.append(host_id)
    return taken


def isolated(what: str, action: Callable[..., object], *args: object) -> None:
    """Runs one record's recovery step; its failure is logged, and the next recovery tries again."""
    try:
        action(*args)
    except Exception:
        log.exception("%s failed; retrying at the next recovery", what)
