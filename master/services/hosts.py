"""Hosts: creating, deleting, locking and unlocking them."""

from collections.abc import Sequence

from django.db import transaction
from django.db.models import F

from common.constants import HQEStatus
from common.errors import FleetshardError, Refused
from common.models import Host, HostQueueEntry
from master.access.audit import ActingUser, record
from master.services.assignment import shard_for_labels
from master.services.shared import (
    MAX_MAP_ENTRIES,
    bump_hosts,
    check_env_names,
    check_names,
    check_new_names,
    check_string_map,
    check_text,
    get_hosts,
    get_labels,
    plural,
)
from master.sync.notifier import shards_changed


@transaction.atomic
def create_hosts(
    hostnames: Sequence[str],
    *,
    acting_user: ActingUser,
    labels: Sequence[str] = (),
    attributes: dict[str, str] | None = None,
    locked: bool = False,
    lock_reason: str = "",
) -> list[Host]:
    hostnames = check_new_names("host", hostnames)
    attributes = check_string_map("attribute", attributes or {}, "attributes")
    check_text("the lock reason", lock_reason, "lock_reason", max_length=1024)
    if lock_reason and not locked:
        raise FleetshardError("a lock reason needs --lock", field="lock_reason")
    existing = list(Host.objects.filter(hostname__in=hostnames).values_list("hostname", flat=True))
    if existing:
        raise Refused(f"{plural('host', existing)} already exist{'' if len(existing) > 1 else 's'}", field="hostname")
    label_objs = get_labels(check_names("label", labels)) if labels else []
    for hostname in hostnames:
        shard = shard_for_labels(hostname, label_objs)
        host = Host.objects.create(
            hostname=hostname,
            attributes=attributes,
            locked=locked,
            lock_reason=lock_reason if locked else "",
            shard=shard,
        )
        host.labels.set(label_objs)
    hosts = get_hosts(hostnames)
    shards_changed(h.shard_id for h in hosts)
    record(
        "host.create",
        acting_user=acting_user,
        targets=[*hosts, *label_objs],
        reason=lock_reason if locked else "",
        details={"labels": [label.name for label in label_objs], "attributes": attributes, "locked": locked},
    )
    return hosts


@transaction.atomic
def delete_hosts(hostnames: Sequence[str], *, acting_user: ActingUser) -> None:
    hosts = get_hosts(check_names("host", hostnames), lock=True)
    busy = (
        HostQueueEntry.objects.filter(host__in=hosts, status__in=HQEStatus.ACTIVE)
        .values_list("host__hostname", "job_id")
        .order_by("job_id")
    )
    if busy:
        host, job = busy[0]
        raise Refused(f"host {host} has active job {job}; abort it first", field="hosts")
    record("host.delete", acting_user=acting_user, targets=hosts)
    shards_changed(h.shard_id for h in hosts)
    Host.objects.filter(id__in=[h.id for h in hosts]).delete()


@transaction.atomic
def lock_hosts(hostnames: Sequence[str], reason: str = "", *, acting_user: ActingUser) -> list[Host]:
    check_text("the lock reason", reason, "reason", max_length=1024)
    hosts = get_hosts(check_names("host", hostnames), lock=True)
    Host.objects.filter(id__in=[h.id for h in hosts]).update(locked=True, lock_reason=reason, version=F("version") + 1)
    record("host.lock", acting_user=acting_user, targets=hosts, reason=reason)
    shards_changed(h.shard_id for h in hosts)
    return get_hosts(hostnames)


@transaction.atomic
def unlock_hosts(hostnames: Sequence[str], *, acting_user: ActingUser) -> list[Host]:
    hosts = get_hosts(check_names("host", hostnames), lock=True)
    Host.objects.filter(id__in=[h.id for h in hosts]).update(locked=False, lock_reason="", version=F("version") + 1)
    record("host.unlock", acting_user=acting_user, targets=hosts)
    shards_changed(h.shard_id for h in hosts)
    return get_hosts(hostnames)


@transaction.atomic
def set_host_attributes(
    hostnames: Sequence[str], set_to: dict[str, str], remove: Sequence[str], *, acting_user: ActingUser
) -> list[Host]:
    """Sets and removes attributes of hosts (all or none): the shard hands them to jobs as
    FLEETSHARD_HOST_ATTR_<KEY>. A key both set and removed, or removed from a host without it, is
    refused; a change that changes nothing is not recorded."""
    set_to = check_string_map("attribute", set_to, "set")
    removed = list(dict.fromkeys(check_string_map("attribute", dict.fromkeys(remove, ""), "remove")))
    if not set_to and not removed:
        raise FleetshardError("give attributes to set or to remove", field="set")
    both = sorted(set(set_to) & set(removed))
    if both:
        raise FleetshardError(f"attribute {', '.join(both)} is both set and removed", field="remove")
    hosts = get_hosts(check_names("host", hostnames), lock=True)
    changed = []
    for host in hosts:
        current = dict(host.attributes or {})
        missing = [key for key in removed if key not in current]
        if missing:
            raise FleetshardError(f"host {host.hostname} has no attribute {', '.join(missing)}", field="remove")
        new = {key: value for key, value in (current | set_to).items() if key not in removed}
        if len(new) > MAX_MAP_ENTRIES:
            raise FleetshardError(f"a host may have at most {MAX_MAP_ENTRIES} attributes", field="set")
        if set_to:
            check_env_names("attribute", new, "set", new=set_to)
        if new != current:
            host.attributes = new
            changed.append(host)
    if changed:
        Host.objects.bulk_update(changed, ["attributes"])
        bump_hosts(changed)
        record(
            "host.set_attributes",
            acting_user=acting_user,
            targets=changed,
            details={"set": set_to, "removed": removed},
        )
    return hosts
