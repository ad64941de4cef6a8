"""Shards: creating and deleting them, and giving them labels (which moves the labelled hosts)."""

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common.constants import HQEStatus, JobStatus
from common.errors import FleetshardError, Refused
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry, Job, Label, Shard
from master.access.audit import ActingUser, moves_detail, record
from master.access.credentials import issue_token
from master.services.shared import HostMove, check_names, check_new_names, get_labels, get_shard, reassign
from master.sync.notifier import shards_changed


@dataclass
class ShardChange:
    """A shard after a label change, and the hosts that joined or left it."""

    shard: Shard
    moves: list[HostMove]


@dataclass
class ShardDeletion:
    """What deleting shards did besides: hosts unassigned and active jobs aborted."""

    moves: list[HostMove]
    aborted_job_ids: list[int]


@transaction.atomic
def create_shard(hostname: str, labels: Sequence[str] = (), *, acting_user: ActingUser) -> tuple[Shard, str]:
    """Creates a shard and its token; the raw token is returned once and never stored."""
    (hostname,) = check_new_names("shard", [hostname])
    if Shard.objects.filter(hostname=hostname).exists():
        raise Refused(f"shard {hostname} already exists", field="hostname")
    shard = Shard.objects.create(hostname=hostname)
    given, moves, moved = _give_labels(shard, labels) if labels else ([], [], [])
    # The description column holds 255 characters; a hostname may use all of them.
    token, raw = issue_token(shard=shard, description=f"heartbeat token of {hostname}"[:255])
    record(
        "shard.create",
        acting_user=acting_user,
        targets=[shard, *given, *moved, token],
        details={"labels": list(dict.fromkeys(labels)), "hosts_moved": moves_detail(moves)},
    )
    return shard, raw


def _moved(hosts: list[Host], moves: list[HostMove]) -> list[Host]:
    """The hosts that changed shard, as audit targets: `audit list --host` must find what moved them."""
    by_name = {h.hostname: h for h in hosts}
    return [by_name[m.hostname] for m in moves]


def _give_labels(shard: Shard, label_names: Sequence[str]) -> tuple[list[Label], list[HostMove], list[Host]]:
    labels = get_labels(check_names("label", label_names), lock=True)
    for label in labels:
        if label.shard_id is not None and label.shard_id != shard.id:
            raise Refused(f"label {label.name} already belongs to shard {label.shard.hostname}", field="labels")  # type: ignore[union-attr]
    Label.objects.filter(id__in=[label.id for label in labels]).update(shard=shard)
    hosts = list(
        Host.objects.filter(id__in=Host.labels.through.objects.filter(label__in=labels).values("host_id"))
        .only("id", "hostname", "shard_id")
        .select_for_update(of=("self",))
    )
    moves = reassign(hosts)
    return labels, moves, _moved(hosts, moves)


@transaction.atomic
def add_labels_to_shard(hostname: str, label_names: Sequence[str], *, acting_user: ActingUser) -> ShardChange:
    """Gives labels to a shard; the hosts with them join it. A fixed number of queries, however many hosts."""
    shard = get_shard(hostname, lock=True)
    labels, moves, moved = _give_labels(shard, label_names)
    record(
        "shard.add_labels",
        acting_user=acting_user,
        targets=[shard, *labels, *moved],
        details={"labels": list(dict.fromkeys(label_names)), "hosts_moved": moves_detail(moves)},
    )
    return ShardChange(shard, moves)


@transaction.atomic
def remove_label_from_shard(hostname: str, label_name: str, *, acting_user: ActingUser) -> ShardChange:
    """Takes a label from a shard; returns the hosts that left the shard with it."""
    shard = get_shard(hostname, lock=True)
    (label,) = get_labels(check_names("label", [label_name]), lock=True)
    if label.shard_id != shard.id:
        raise FleetshardError(f"label {label.name} does not belong to shard {shard.hostname}", field="labels")
    Label.objects.filter(id=label.id).update(shard=None)
    hosts = list(Host.objects.filter(labels=label).only("id", "hostname", "shard_id").select_for_update(of=("self",)))
    moves = reassign(hosts)
    record(
        "shard.remove_label",
        acting_user=acting_user,
        targets=[shard, label, *_moved(hosts, moves)],
        details={"label": label.name, "hosts_moved": moves_detail(moves)},
    )
    return ShardChange(shard, moves)


@transaction.atomic
def delete_shards(hostnames: Sequence[str], *, acting_user: ActingUser) -> ShardDeletion:
    """Unassigns the shards' labels and hosts; their active jobs can no longer run, so they end Aborted.

    Returns the hosts that left the shards and the jobs aborted."""
    shards = [get_shard(h, lock=True) for h in check_names("shard", hostnames)]
    moves: list[HostMove] = []
    aborted: list[int] = []
    for shard in shards:
        active_jobs = list(Job.objects.filter(shard=shard, status__in=JobStatus.ACTIVE).values_list("id", flat=True))
        HostQueueEntry.objects.filter(job_id__in=active_jobs, status__in=HQEStatus.ACTIVE).update(
            status=HQEStatus.ABORTED, finished_on=timezone.now()
        )
        Job.objects.filter(id__in=active_jobs).update(aborted=True, version=F("version") + 1)
        refresh_job_statuses(active_jobs)
        leaving = Host.objects.filter(shard=shard).order_by("hostname").values_list("hostname", flat=True)
        moves += [HostMove(hostname, shard.hostname, None) for hostname in leaving]
        aborted += active_jobs
        Host.objects.filter(shard=shard).update(shard=None, version=F("version") + 1)
    moves.sort(key=lambda m: m.hostname)
    aborted.sort()
    shards_changed(shard.id for shard in shards)
    record(
        "shard.delete",
        acting_user=acting_user,
        targets=[
            *shards,
            *Host.objects.filter(hostname__in=[m.hostname for m in moves]),
            *Job.objects.filter(id__in=aborted),
        ],
        details={"hosts_moved": moves_detail(moves), "jobs_aborted": aborted},
    )
    for shard in shards:
        shard.delete()
    return ShardDeletion(moves, aborted)
