"""Labels: creating and deleting them, and putting them on hosts (which may move hosts between shards)."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction

from common.constants import JobStatus
from common.errors import FleetshardError, Refused
from common.models import Host, HostQueueEntry, Job, Label
from master.access.audit import ActingUser, moves_detail, record
from master.services.shared import (
    HostMove,
    bump_hosts,
    check_names,
    check_new_names,
    get_hosts,
    get_labels,
    plural,
    reassign,
)


@dataclass
class HostsChange:
    """Hosts after a label change, and those whose shard changed with it (callers report them)."""

    hosts: list[Host]
    moves: list[HostMove]
    # The hosts named that already were as asked (had the label): nothing done to them, nothing recorded.
    unchanged: list[str] = field(default_factory=list)


@transaction.atomic
def create_labels(names: Sequence[str], *, acting_user: ActingUser) -> list[Label]:
    names = check_new_names("label", names)
    existing = list(Label.objects.filter(name__in=names).values_list("name", flat=True))
    if existing:
        raise Refused(f"{plural('label', existing)} already exist{'' if len(existing) > 1 else 's'}", field="name")
    labels = Label.objects.bulk_create([Label(name=name) for name in names])
    record("label.create", acting_user=acting_user, targets=labels)
    return labels


@transaction.atomic
def delete_labels(names: Sequence[str], *, acting_user: ActingUser) -> list[HostMove]:
    """Deletes labels unused by active jobs; returns the hosts that left a shard with them."""
    labels = get_labels(check_names("label", names), lock=True)
    for label in labels:
        in_use = Job.objects.filter(status__in=JobStatus.ACTIVE).filter(
            id__in=HostQueueEntry.objects.filter(meta_host=label).values("job_id")
        ) | Job.objects.filter(status__in=JobStatus.ACTIVE, dependency_labels=label)
        job_ids = sorted({j.id for j in in_use})
        if job_ids:
            raise Refused(f"label {label.name} is used by active jobs {', '.join(map(str, job_ids))}", field="name")
    hosts = list(Host.objects.filter(labels__in=labels).distinct())
    targets = [*labels, *hosts]
    Label.objects.filter(id__in=[label.id for label in labels]).delete()
    bump_hosts(hosts)
    moves = reassign(hosts)
    record("label.delete", acting_user=acting_user, targets=targets, details={"hosts_moved": moves_detail(moves)})
    return moves


@transaction.atomic
def add_label_to_hosts(label_name: str, hostnames: Sequence[str], *, acting_user: ActingUser) -> HostsChange:
    (label,) = get_labels(check_names("label", [label_name]))
    hosts = get_hosts(check_names("host", hostnames), lock=True)
    changed = [h for h in hosts if label not in h.labels.all()]
    unchanged = [h.hostname for h in hosts if h not in changed]
    if not changed:
        # Nothing changes, so nothing goes in the audit trail: it records changes, not requests.
        return HostsChange(hosts, [], unchanged)
    Host.labels.through.objects.bulk_create([Host.labels.through(host_id=h.id, label_id=label.id) for h in changed])
    done = _relabelled("host.add_label", label, hosts, changed, acting_user=acting_user)
    return HostsChange(done.hosts, done.moves, unchanged)


@transaction.atomic
def remove_label_from_hosts(label_name: str, hostnames: Sequence[str], *, acting_user: ActingUser) -> HostsChange:
    (label,) = get_labels(check_names("label", [label_name]))
    hosts = get_hosts(check_names("host", hostnames), lock=True)
    without = [h.hostname for h in hosts if label not in h.labels.all()]
    if without:
        raise FleetshardError(f"label {label.name} is not on {plural('host', without)}", field="hosts")
    Host.labels.through.objects.filter(label_id=label.id, host_id__in=[h.id for h in hosts]).delete()
    return _relabelled("host.remove_label", label, hosts, hosts, acting_user=acting_user)


def _relabelled(
    action: str, label: Label, hosts: list[Host], changed: list[Host], *, acting_user: ActingUser
) -> HostsChange:
    """After `label` went on or off `hosts`: the changed ones get new versions and maybe a new shard."""
    bump_hosts(changed)
    moves = reassign(changed)
    record(
        action,
        acting_user=acting_user,
        targets=[label, *changed],
        details={"label": label.name, "hosts_moved": moves_detail(moves)},
    )
    return HostsChange(get_hosts([h.hostname for h in hosts]), moves)
