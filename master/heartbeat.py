"""The master's side of the heartbeat: apply a shard's updates, then answer with what it lacks.

Every step works on whole sets (one query per kind of row), so the number of SQL queries stays the
same whatever the numbers of hosts, jobs and updates. The shard's row lock serialises a shard's
heartbeats, so a retry racing its original applies and assigns nothing twice.
"""

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Prefetch
from django.utils import timezone

from common.bulk import bulk_set
from common.constants import (
    LOG_TAIL_BYTES,
    MAX_HOSTS_PER_RESPONSE,
    MAX_JOBS_PER_RESPONSE,
    PROTOCOL_VERSION,
    FailureClass,
    HQEStatus,
    JobStatus,
)
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry, Job, Shard
from common.wire import HeartbeatRequest, format_time, parse_time

HQE_FIELDS = ["status", "failure", "exit_code", "started_on", "finished_on", "log_tail", "last_seq", "host"]


class UpdateRejected(Exception):
    pass


@dataclass
class _HostView:
    id: int
    version: int
    shard_id: int | None
    status: str


def _apply_one(update: dict[str, Any], hqe: dict[str, Any] | None, shard: Shard, host_ids: set[int]) -> bool:
    """Applies an update to the in-memory `hqe`; True if it changed, False for a duplicate."""
    hqe_id = update.get("hqe")
    if hqe is None:
        raise UpdateRejected(f"hqe {hqe_id!r} does not exist")
    if hqe["shard_id"] != shard.id:
        raise UpdateRejected(f"job {hqe['job_id']} is not assigned to shard {shard.hostname}")
    if "job" in update and update["job"] != hqe["job_id"]:
        raise UpdateRejected(f"hqe {hqe_id} belongs to job {hqe['job_id']}, not {update['job']!r}")
    if update["seq"] <= hqe["last_seq"]:
        return False
    status = update.get("status")
    if status not in HQEStatus.ALL:
        raise UpdateRejected(f"status {status!r} is not one of {', '.join(HQEStatus.ALL)}")
    if hqe["status"] in HQEStatus.TERMINAL:
        raise UpdateRejected(f"hqe {hqe_id} is already {hqe['status']}; it cannot become {status}")
    changes: dict[str, Any] = {"status": status, "last_seq": update["seq"]}
    failure = update.get("failure") or ""
    if status == HQEStatus.FAILED and failure not in FailureClass.ALL:
        raise UpdateRejected(f"a Failed update needs failure, one of {', '.join(FailureClass.ALL)}; got {failure!r}")
    if status != HQEStatus.FAILED and failure:
        raise UpdateRejected(f"failure {failure!r} is only for a Failed update")
    changes["failure"] = failure
    if "exit_code" in update:
        exit_code = update["exit_code"]
        if exit_code is not None and (not isinstance(exit_code, int) or isinstance(exit_code, bool)):
            raise UpdateRejected(f"exit_code must be an integer or null, got {exit_code!r}")
        changes["exit_code"] = exit_code
    for key in ("started_on", "finished_on"):
        if key in update:
            try:
                changes[key] = parse_time(update[key])
            except ValueError as exc:
                raise UpdateRejected(f"{key}: {exc}") from None
    if "log_tail" in update:
        if not isinstance(update["log_tail"], str):
            raise UpdateRejected("log_tail must be a string")
        changes["log_tail"] = update["log_tail"][-LOG_TAIL_BYTES:]
    if update.get("host") is not None:
        if update["host"] not in host_ids:
            raise UpdateRejected(f"host {update['host']!r} is not a host of shard {shard.hostname}")
        changes["host"] = update["host"]
    hqe.update(changes)
    return True


def _apply_updates(shard: Shard, updates: list[dict[str, Any]], host_ids: set[int]) -> tuple[list[dict[str, Any]], int]:
    ids = {u["hqe"] for u in updates if isinstance(u.get("hqe"), int) and not isinstance(u.get("hqe"), bool)}
    hqes = {
        row["id"]: row
        for row in HostQueueEntry.objects.filter(id__in=ids).values(
            "id", "job_id", "last_seq", "host_id", *[f for f in HQE_FIELDS if f != "host"], shard_id=F("job__shard_id")
        )
    }
    for row in hqes.values():
        row["host"] = row.pop("host_id")
    acks, changed, applied = [], set(), 0
    for update in updates:
        hqe = hqes.get(update.get("hqe"))  # type: ignore[arg-type]
        try:
            if _apply_one(update, hqe, shard, host_ids):
                changed.add(hqe["id"])  # type: ignore[index]
                applied += 1
            acks.append({"seq": update["seq"], "result": "accepted"})
        except UpdateRejected as exc:
            acks.append({"seq": update["seq"], "result": "rejected", "error": str(exc)})
    bulk_set(HostQueueEntry, [hqes[i] for i in changed], HQE_FIELDS)
    refresh_job_statuses({hqes[i]["job_id"] for i in changed})
    return acks, applied


def _host_wire(host: Host) -> dict[str, Any]:
    return {
        "id": host.id,
        "version": host.version,
        "hostname": host.hostname,
        "labels": sorted(label.name for label in host.labels.all()),
        "locked": host.locked,
        "lock_reason": host.lock_reason,
        "attributes": host.attributes,
    }


def job_wire(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "version": job.version,
        "name": job.name,
        "owner": job.owner,
        "priority": job.priority,
        "command": job.command,
        "timeout_mins": job.timeout_mins,
        "max_runtime_mins": job.max_runtime_mins,
        "dependency_labels": sorted(label.name for label in job.dependency_labels.all()),
        "keyvals": job.keyvals,
        "parent_id": job.parent_id,
        "aborted": job.aborted,
        "created_on": format_time(job.created_on),
        "hqes": [
            {
                "id": hqe.id,
                "host_id": hqe.host_id if hqe.meta_host_id is None else None,
                "meta_host": hqe.meta_host.name if hqe.meta_host else None,
            }
            for hqe in job.hqes.all()
        ],
    }


@transaction.atomic
def process_heartbeat(shard_id: int, req: HeartbeatRequest) -> dict[str, Any]:
    shard = Shard.objects.select_for_update().get(id=shard_id)
    known_host_versions = {h.id: h.version for h in req.known_hosts}
    hosts = {
        row[0]: _HostView(*row)
        for row in Host.objects.filter(shard=shard).values_list("id", "version", "shard_id", "status")
    }
    # A host the shard still holds but the master moved or deleted may finish its running job.
    host_ids = set(hosts) | set(
        Host.objects.filter(id__in=[i for i in known_host_versions if i not in hosts]).values_list("id", flat=True)
    )

    acks, applied = _apply_updates(shard, req.updates, host_ids)

    status_rows = [
        {"id": h.id, "status": h.status} for h in req.known_hosts if h.id in hosts and hosts[h.id].status != h.status
    ]
    bulk_set(Host, status_rows, ["status"])

    send_host_ids = sorted(i for i, h in hosts.items() if known_host_versions.get(i, -1) < h.version)
    removed_host_ids = sorted(i for i in known_host_versions if i not in hosts)
    more = len(send_host_ids) > MAX_HOSTS_PER_RESPONSE
    send_host_ids = send_host_ids[:MAX_HOSTS_PER_RESPONSE]

    known_job_versions = {j.id: j.version for j in req.known_jobs}
    candidates = Job.objects.filter(shard=shard, status__in=JobStatus.ACTIVE).values_list("id", "version", "priority")
    send_jobs = sorted(
        ((-priority, job_id) for job_id, version, priority in candidates if known_job_versions.get(job_id, 0) < version)
    )
    more = more or len(send_jobs) > MAX_JOBS_PER_RESPONSE
    send_job_ids = [job_id for _, job_id in send_jobs[:MAX_JOBS_PER_RESPONSE]]

    sent_hosts = Host.objects.filter(id__in=send_host_ids).prefetch_related("labels").order_by("id")
    sent_jobs = {
        job.id: job
        for job in Job.objects.filter(id__in=send_job_ids)
        .select_related("parent")
        .prefetch_related(
            "dependency_labels",
            Prefetch("hqes", queryset=HostQueueEntry.objects.select_related("meta_host").order_by("id")),
        )
    }
    jobs = [sent_jobs[i] for i in send_job_ids]
    suite_keyvals = {str(j.parent_id): j.parent.keyvals for j in jobs if j.parent is not None}

    Shard.objects.filter(id=shard.id).update(
        last_heartbeat=timezone.now(),
        client_version=req.client_version,
        known_hosts_count=len(req.known_hosts),
        known_jobs_count=len(req.known_jobs),
        last_updates_count=len(req.updates),
        updates_applied=F("updates_applied") + applied,
    )
    return {
        "protocol": PROTOCOL_VERSION,
        "hosts": [_host_wire(h) for h in sent_hosts],
        "removed_host_ids": removed_host_ids,
        "jobs": [job_wire(j) for j in jobs],
        "suite_keyvals": suite_keyvals,
        "acks": acks,
        "more": more,
        "heartbeat_interval_s": settings.FLEETSHARD_HEARTBEAT_INTERVAL_S,
    }
