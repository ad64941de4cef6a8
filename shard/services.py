"""The shard's HQE and host state changes. The scheduler, the executors and tests all go through here,
so every HQE change is saved and queued for the master in the same transaction, and a host changes hands
only by conditional UPDATEs."""

from datetime import datetime

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from common.constants import LOG_TAIL_BYTES, FailureClass, HQEStatus, hqe_can_move
from common.errors import FleetshardError, NotFound
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry
from common.wire import clean_text
from shard.models import HostState, Run
from shard.outbox import enqueue, enqueue_host_event, enqueue_many


class HostTaken(FleetshardError):
    """The host is not (or no longer) as the caller expected: another scheduler process has it, or it changed."""


@transaction.atomic
def transition_hqe(
    hqe_id: int,
    status: str,
    *,
    host_id: int | None = None,
    failure: str = "",
    exit_code: int | None = None,
    log_tail: str = "",
    now: datetime | None = None,
) -> HostQueueEntry:
    """Moves an HQE to `status`; a terminal HQE never changes again."""
    try:
        hqe = HostQueueEntry.objects.select_for_update().get(id=hqe_id)
    except HostQueueEntry.DoesNotExist:
        raise NotFound(f"unknown HQE {hqe_id}") from None
    if not hqe_can_move(hqe.status, status):
        raise FleetshardError(f"HQE {hqe_id} cannot go from {hqe.status} to {status}", field="status")
    if (status == HQEStatus.FAILED) != bool(failure) or (failure and failure not in FailureClass.ALL):
        raise FleetshardError(f"failure class {str(failure)!r} does not fit status {status}", field="failure")
    now = now or timezone.now()
    hqe.status = status
    if host_id is not None:
        hqe.host_id = host_id
    if status in (HQEStatus.STARTING, HQEStatus.RUNNING) and hqe.started_on is None:
        hqe.started_on = now
    if status in HQEStatus.TERMINAL:
        hqe.finished_on = now
        hqe.failure = failure
        hqe.exit_code = exit_code
        # The tail is a job's output: untrusted text that must be storable and sendable (docs/protocol.md,
        # "Values"), whichever caller passed it.
        hqe.log_tail = clean_text(log_tail[-LOG_TAIL_BYTES:])
    hqe.save()
    enqueue(hqe)
    refresh_job_statuses([hqe.job_id])
    return hqe


def finish_hqe(
    hqe_id: int, status: str, *, failure: str = "", exit_code: int | None = None, log_tail: str = ""
) -> HostQueueEntry:
    """Ends an HQE (Completed, Failed, Aborted or Expired)."""
    if status not in HQEStatus.TERMINAL:
        raise FleetshardError(f"{status} is not a terminal status", field="status")
    return transition_hqe(hqe_id, status, failure=failure, exit_code=exit_code, log_tail=log_tail)


@transaction.atomic
def abort_queued_hqes(job_ids: list[int]) -> int:
    """Aborted jobs: their HQEs not yet started end Aborted here, in a fixed number of queries however
    many there are; running ones are the scheduler's to kill."""
    if not job_ids:
        return 0
    waiting = list(HostQueueEntry.objects.select_for_update().filter(job_id__in=job_ids, status=HQEStatus.QUEUED))
    if not waiting:
        return 0
    now = timezone.now()
    HostQueueEntry.objects.filter(id__in=[h.id for h in waiting]).update(status=HQEStatus.ABORTED, finished_on=now)
    for hqe in waiting:
        hqe.status, hqe.finished_on = HQEStatus.ABORTED, now
    enqueue_many(waiting)
    refresh_job_statuses({h.job_id for h in waiting})
    return len(waiting)


def open_run(hqe_id: int, runner: str) -> None:
    """The claim's record of who runs the HQE. Its key is the HQE's, so an HQE never gets a second one."""
    Run.objects.create(hqe_id=hqe_id, runner=runner)


def record_run(hqe_id: int, *, pid: int | None = None, results_dir: str | None = None) -> None:
    """Shard-only bookkeeping of a started run (its process, its results); never sent to the master."""
    fields = {name: value for name, value in (("pid", pid), ("results_dir", results_dir)) if value is not None}
    if fields:
        Run.objects.filter(hqe_id=hqe_id).update(**fields)


def move_host(
    host_id: int,
    to_status: str,
    *,
    held_by: str,
    holder: str,
    retired: bool | None = None,
    failed_repair: bool = False,
    **host_is: object,
) -> None:
    """Moves a host held by `held_by` ("": by nobody) to `to_status`, held by `holder` ("" releases it), if
    its state matches `retired` (None: either) and its row matches `host_is`; `failed_repair` notes that
    its present config version failed repair.

    Two conditional UPDATEs, the holder's first, then the change's host event for the master's timeline.
    Call it under shard.locks.shard_write: that lock keeps
    every writer of hosts in one order, and raising HostTaken rolls back the first UPDATE with the rest.
    """
    held = HostState.objects.filter(host_id=host_id, runner=held_by)
    if retired is not None:
        held = held.filter(retired=retired)
    state: dict[str, object] = {"runner": holder}
    if failed_repair:
        state["repair_failed_version"] = Subquery(Host.objects.filter(id=OuterRef("host_id")).values("version")[:1])
    if held.update(**state) != 1:
        raise HostTaken(f"host {host_id} is not held by {held_by or 'nobody'} as expected")
    if Host.objects.filter(id=host_id, **host_is).update(status=to_status) != 1:
        raise HostTaken(f"host {host_id} is not {host_is}")
    enqueue_host_event(host_id, to_status)
