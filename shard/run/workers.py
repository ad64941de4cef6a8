"""Elastic workers are capacity (docs/design.md, "Capacity that registers itself"): a worker
(`run_shard --worker-id ID --slots N`) registers N hosts `SHARD-ID-K` in the shard's database, and the
process holding the heartbeat folds the live workers' hosts into the discovered set it sends.

A registration is one row written in one transaction, so a worker killed while registering leaves
nothing half-made. A worker that exits cleanly marks its row released: its hosts are then sent as
`released` and the master deletes them. A worker that dies (its scheduler process gone) simply leaves
the set: the master marks its hosts Missing and ends what ran there as infra failures.
"""

import contextlib
import logging
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet

from common.constants import HostStatus
from common.models import Host
from common.wire import MAX_POOL_LABELS, MAX_POOLS
from shard.models import DiscoveryState, Run, WorkerRegistration
from shard.run.recovery import runner_alive
from shard.run.workspace import RESULT_SUFFIX
from shard.sync.leader import OUTBOX_CHANNEL

log = logging.getLogger(__name__)

MAX_SLOTS = 64
# The master's bound on a hostname (Host.hostname).
MAX_HOSTNAME_CHARS = 255
WORKER_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
# The attribute every worker host carries: an ordinary scheduler never runs on such a host.
WORKER_ATTRIBUTE = "worker_id"


_SIZE = re.compile(r"\s*(\d{1,16})\s*([kmgt]?)b?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size in bytes as CodaLab's worker options write it: `1000`, `500m`, `10g` (KiB to TiB); above 0."""
    match = _SIZE.fullmatch(text)
    size = int(match[1]) * 1024 ** " kmgt".index(match[2].lower() or " ") if match else 0
    if not 0 < size < 2**62:
        raise ValueError(f"expected a size above 0 in bytes, or with k, m, g or t (10g), not {text[:40]!r}")
    return size


class RegistrationError(Exception):
    """The worker cannot register (another live worker has its id, a bad id or slot count)."""


@dataclass(frozen=True)
class WorkerIdentity:
    worker_id: str
    slots: int
    labels: tuple[str, ...]
    backend_job: str = ""

    def __post_init__(self) -> None:
        if not WORKER_ID.fullmatch(self.worker_id) or ".." in self.worker_id:
            raise RegistrationError(
                "--worker-id must be 1 to 64 lower-case letters, digits, '.', '_' or '-' (no '..'), "
                f"not {self.worker_id[:70]!r}"
            )
        if not 1 <= self.slots <= MAX_SLOTS:
            raise RegistrationError(f"--slots must be between 1 and {MAX_SLOTS}, not {self.slots}")
        if not self.labels:
            raise RegistrationError(
                "a worker's hosts need the pool's labels: "
                "pass --label (the manager does) or set FLEETSHARD_DISCOVERY_LABELS"
            )

    def hostnames(self) -> list[str]:
        return [f"{settings.FLEETSHARD_SHARD_HOSTNAME}-{self.worker_id}-{k}" for k in range(1, self.slots + 1)]

    def records(self) -> list[dict[str, Any]]:
        attributes = {"node": socket.gethostname()[:255], WORKER_ATTRIBUTE: self.worker_id}
        if self.backend_job:
            attributes["backend_job"] = self.backend_job[:255]
        return [{"hostname": h, "labels": list(self.labels), "attributes": attributes} for h in self.hostnames()]


@transaction.atomic
def register(identity: WorkerIdentity, runner: str) -> WorkerRegistration:
    """Registers the worker's hosts. A row of the same id left by a dead worker (or a clean exit not yet
    sent) is taken over; one of a live worker is refused. Registrations take the discovery row's lock
    first, so two of one id are one after the other (both saw no row: the second's insert failed on the
    unique id, an IntegrityError instead of the reason)."""
    longest = identity.hostnames()[-1]
    if len(longest) > MAX_HOSTNAME_CHARS:
        raise RegistrationError(
            f"the worker's hostnames ({longest[:40]}...) would be longer than {MAX_HOSTNAME_CHARS} characters, "
            "which the master refuses: use a shorter --worker-id"
        )
    DiscoveryState.objects.get_or_create(id=1)
    found = DiscoveryState.objects.select_for_update().values_list("hosts", flat=True).get(id=1)
    old = WorkerRegistration.objects.filter(worker_id=identity.worker_id).first()
    if old is not None:
        if not old.released and old.runner != runner and runner_alive(old.runner):
            raise RegistrationError(f"worker {identity.worker_id} is already registered by live process {old.runner}")
        old.delete()
    # The master refuses a set over its limit whole, the sources' devices with it.
    others = sum(len(hosts) for hosts in worker_rows().values_list("hosts", flat=True))
    limit = settings.FLEETSHARD_MAX_DISCOVERED_HOSTS
    if len(found) + others + identity.slots > limit:
        raise RegistrationError(
            f"the shard's discovered set would hold {len(found) + others + identity.slots} hosts "
            f"({len(found)} found by its sources, {others} of other workers, {identity.slots} of this one), "
            f"more than FLEETSHARD_MAX_DISCOVERED_HOSTS={limit}"
        )
    row = WorkerRegistration.objects.create(worker_id=identity.worker_id, runner=runner, hosts=identity.records())
    _nudge_holder()
    return row


@transaction.atomic
def release(worker_id: str, runner: str) -> None:
    """A clean exit: the worker's hosts leave the master's host list with the next heartbeat."""
    WorkerRegistration.objects.filter(worker_id=worker_id, runner=runner).update(released=True)
    _nudge_holder()


def _nudge_holder() -> None:
    """The heartbeat's holder (another process) heartbeats at once, on commit, as for a new outbox entry."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {OUTBOX_CHANNEL}")


def own_hosts(identity: WorkerIdentity | None) -> Q:
    """The hosts a scheduler may run on: a worker's own, or (an ordinary shard process) no worker's."""
    if identity is None:
        return ~Q(attributes__has_key=WORKER_ATTRIBUTE)
    return Q(hostname__in=identity.hostnames())


def sync_worker_hosts() -> bool:
    """The heartbeat holder's view of the workers, folded into the discovered set: live workers' hosts
    are in it; released ones are sent as `released` until the master acks; dead ones just leave. True
    when the set changed (a new generation). A shard that never had a worker pays one query."""
    if (
        not WorkerRegistration.objects.exists()
        and not DiscoveryState.objects.filter(id=1).exclude(worker_hosts=[]).exists()
    ):
        return False
    return _sync_worker_hosts()


@transaction.atomic
def _sync_worker_hosts() -> bool:
    DiscoveryState.objects.get_or_create(id=1)
    state = DiscoveryState.objects.select_for_update().get(id=1)
    hosts: list[dict[str, Any]] = []
    released: list[str] = []
    for row in WorkerRegistration.objects.order_by("worker_id"):
        if row.released:
            released += [h["hostname"] for h in row.hosts]
            row.delete()
        elif runner_alive(row.runner):
            hosts += row.hosts
        else:
            log.warning("worker %s (%s) is gone without a clean exit: its hosts go Missing", row.worker_id, row.runner)
            row.delete()
    if hosts == state.worker_hosts and not released:
        return False
    state.generation += 1
    state.worker_hosts = hosts
    live = {h["hostname"] for h in hosts}
    kept = [r for r in state.released if r[0] not in live and r[0] not in released]
    state.released = (kept + [[name, state.generation] for name in released])[
        -settings.FLEETSHARD_MAX_DISCOVERED_HOSTS :
    ]
    state.save()
    return True


def worker_rows() -> "QuerySet[WorkerRegistration]":
    return WorkerRegistration.objects.filter(released=False)


def free_slots(slots: int, backend_ids: set[str]) -> int:
    """Capacity the pool already has for queued work: Ready idle worker hosts, hosts registered but not
    yet back from the master, and `slots` for each running backend worker not registered yet."""
    registered: dict[str, list[str]] = {row.worker_id: [h["hostname"] for h in row.hosts] for row in worker_rows()}
    names = [n for hosts in registered.values() for n in hosts]
    known = set(Host.objects.filter(hostname__in=names).values_list("hostname", flat=True))
    idle = Host.objects.filter(
        hostname__in=names, status=HostStatus.READY, locked=False, state__runner="", state__retired=False
    ).count()
    unseen = len(set(names) - known)
    starting = sum(slots for worker_id in backend_ids if worker_id not in registered)
    return idle + unseen + starting


class PoolError(ValueError):
    """A pool the master would refuse (too many labels): the manager says so at start."""


@transaction.atomic
def announce_pool(labels: list[str], max_hosts: int) -> None:
    """A worker manager's pool, announced in the heartbeat so the master accepts jobs for it before any
    worker exists (replacing an earlier announcement of the same labels). Nothing ever retracts a pool,
    so the list is kept to the MAX_POOLS the master takes, in the order they were last announced: past
    it, the pool announced longest ago is dropped, with a warning. Before, a shard whose managers had
    announced a 101st pool had every heartbeat refused (400) by the master."""
    key = sorted(set(labels))
    if not key or len(key) > MAX_POOL_LABELS:
        raise PoolError(f"a pool needs 1 to {MAX_POOL_LABELS} labels, not {len(key)}")
    DiscoveryState.objects.get_or_create(id=1)
    state = DiscoveryState.objects.select_for_update().get(id=1)
    pools = [p for p in state.pools if sorted(p["labels"]) != key] + [{"labels": key, "max_hosts": max_hosts}]
    for dropped in pools[:-MAX_POOLS]:
        log.warning(
            "pool %s dropped from the pools this shard announces: it was announced longest ago, and the master "
            "takes at most %d (its jobs are accepted again once its manager starts)",
            ",".join(dropped["labels"]),
            MAX_POOLS,
        )
    pools = pools[-MAX_POOLS:]
    if pools != state.pools:
        state.pools = pools
        state.save(update_fields=["pools"])


def work_dirs(runner: str) -> list[Path]:
    """A worker's work directory (CodaLab's term): the run directories of the runs this process ran."""
    dirs = (
        Run.objects.filter(runner=runner)
        .exclude(results_dir="")
        .order_by("hqe_id")
        .values_list("results_dir", flat=True)
    )
    return [Path(d) for d in dirs]


def work_dir_size(runner: str) -> int:
    total = 0
    for top in work_dirs(runner):
        for root, _, files in os.walk(top):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_size
    return total


def delete_work_dirs(runner: str) -> tuple[int, int]:
    """`--delete-work-dir-on-exit`: removes the worker's run directories whose result files were all
    handled (none left waiting in `results/`); one still holding a file to send is kept, for the next
    process of the shard to send. (deleted, kept)."""
    deleted = kept = 0
    for top in work_dirs(runner):
        results = top / "results"
        with contextlib.suppress(OSError):
            if results.is_dir() and any(n.endswith(RESULT_SUFFIX) for n in os.listdir(results)):
                kept += 1
                continue
        if top.is_dir():
            shutil.rmtree(top, ignore_errors=True)
            deleted += 1
    return deleted, kept
