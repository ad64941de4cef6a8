"""The master's domain changes. Each is one transaction; the API, the CLI, the admin and tests call these.

A change a shard must see raises the record's `version`, so the next heartbeat re-sends it.
"""

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common.constants import MAX_COMMAND_BYTES, PRIORITY_NAMES, HQEStatus, JobStatus
from common.errors import FleetshardError, NotFound, Refused
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry, Job, Label, Shard
from master.assignment import HQESpec, check_capacity, route_job, shard_for_labels
from master.models import Token
from master.tokens import issue_token

# Names of hosts, labels and shards end up in URL paths, shell environments, file names, log lines
# and the admin: plain ASCII without separators or '..' keeps them meaning only themselves there.
_NAME_RE = re.compile(r"[A-Za-z0-9.\-_:@+=]{1,255}")
NAME_RULE = "use letters, digits and . - _ : @ + = (no '..', not starting with '.', at most 255 characters)"
# Attribute and keyval names become environment variable suffixes on the shard (FLEETSHARD_HOST_ATTR_*).
_KEY_RE = re.compile(r"[A-Za-z0-9_.\-]{1,255}")
KEY_RULE = "use 1-255 letters, digits, '_', '.', '-'"
# What no database column can hold as text (PostgreSQL refuses NUL; no encoder takes a lone surrogate).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
MAX_MAP_ENTRIES = 256
MAX_VALUE_LENGTH = 1024
INT32_MAX = 2**31 - 1


def valid_name(name: object) -> bool:
    """Whether `name` may name a new host, label or shard (existing names are not re-checked)."""
    return isinstance(name, str) and bool(_NAME_RE.fullmatch(name)) and ".." not in name and name[0] != "."


def _check_new_names(kind: str, names: Sequence[str]) -> list[str]:
    """The names of objects to create, each following NAME_RULE, without repeats."""
    if not names:
        raise FleetshardError(f"give at least one {kind} name", field=kind)
    for name in names:
        if not valid_name(name):
            raise FleetshardError(f"invalid {kind} name {name!r}: {NAME_RULE}", field=kind)
    return list(dict.fromkeys(names))


def _check_names(kind: str, names: Sequence[str]) -> list[str]:
    """Names to look up, without repeats. Lenient on purpose: objects named before NAME_RULE existed
    must stay reachable to be fixed or deleted. Only what no database can hold is refused here
    (PostgreSQL fails on a NUL); the lookup itself says which names are unknown."""
    if not names:
        raise FleetshardError(f"give at least one {kind} name", field=kind)
    for name in names:
        if not isinstance(name, str) or not name or len(name) > 255 or _UNSTORABLE.search(name):
            raise NotFound(f"unknown {kind} {name!r}", field=kind)
    return list(dict.fromkeys(names))


def _check_text(what: str, value: object, field_name: str, *, max_length: int) -> str:
    """Free text to store: a string without NUL or lone surrogates, at most `max_length` long."""
    if not isinstance(value, str):
        raise FleetshardError(f"{what} must be a string, not {type(value).__name__}", field=field_name)
    if _UNSTORABLE.search(value):
        raise FleetshardError(f"{what} must not contain NUL or lone surrogate characters", field=field_name)
    if len(value) > max_length:
        raise FleetshardError(f"{what} is longer than {max_length} characters", field=field_name)
    return value


def _check_string_map(kind: str, mapping: object, field_name: str) -> dict[str, str]:
    """Host attributes and job keyvals: names per KEY_RULE (shards put them in environment variable
    names), values storable strings, and a bounded number of entries."""
    if not isinstance(mapping, dict):
        raise FleetshardError(f"{field_name} must map names to strings", field=field_name)
    if len(mapping) > MAX_MAP_ENTRIES:
        raise FleetshardError(
            f"{field_name} may have at most {MAX_MAP_ENTRIES} entries; this one has {len(mapping)}", field=field_name
        )
    for key, value in mapping.items():
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise FleetshardError(f"invalid {kind} name {key!r}: {KEY_RULE}", field=field_name)
        _check_text(f"{kind} {key}", value, field_name, max_length=MAX_VALUE_LENGTH)
    return dict(mapping)


def _plural(kind: str, names: Iterable[str]) -> str:
    names = sorted(names)
    return f"{kind}{'s' if len(names) > 1 else ''} {', '.join(names)}"


def get_labels(names: Sequence[str], *, lock: bool = False) -> list[Label]:
    names = list(dict.fromkeys(names))
    qs = Label.objects.select_related("shard").filter(name__in=names)
    found = {label.name: label for label in (qs.select_for_update(of=("self",)) if lock else qs)}
    missing = [n for n in names if n not in found]
    if missing:
        raise NotFound(f"unknown {_plural('label', missing)}", field="labels")
    return [found[n] for n in names]


def get_hosts(hostnames: Sequence[str], *, lock: bool = False) -> list[Host]:
    hostnames = list(dict.fromkeys(hostnames))
    qs = Host.objects.filter(hostname__in=hostnames).prefetch_related("labels__shard")
    found = {h.hostname: h for h in (qs.select_for_update(of=("self",)) if lock else qs)}
    missing = [n for n in hostnames if n not in found]
    if missing:
        raise NotFound(f"unknown {_plural('host', missing)}", field="hosts")
    return [found[n] for n in hostnames]


def get_shard(hostname: str, *, lock: bool = False) -> Shard:
    qs = Shard.objects.select_for_update() if lock else Shard.objects.all()
    try:
        return qs.get(hostname=hostname)
    except Shard.DoesNotExist:
        raise NotFound(f"unknown shard {hostname}", field="shard") from None


@dataclass(frozen=True)
class HostMove:
    """A host whose shard changed: operators must know which hosts left which shard, since a job
    already queued there for that host can no longer run on it."""

    hostname: str
    from_shard: str | None
    to_shard: str | None


@dataclass
class HostsChange:
    """Hosts after a label change, and those whose shard changed with it (callers report them)."""

    hosts: list[Host]
    moves: list[HostMove]


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


def describe_moves(moves: Sequence[HostMove]) -> str:
    """`host dut3 left shard lab1; hosts a1, a2 joined shard lab2`, or "" when nothing moved."""
    groups: dict[tuple[str | None, str | None], list[str]] = {}
    for move in moves:
        groups.setdefault((move.from_shard, move.to_shard), []).append(move.hostname)
    parts = []
    for (before, after), hostnames in sorted(groups.items(), key=lambda g: (g[0][0] or "", g[0][1] or "")):
        who = _plural("host", hostnames)
        if after is None:
            parts.append(f"{who} left shard {before}")
        elif before is None:
            parts.append(f"{who} joined shard {after}")
        else:
            parts.append(f"{who} moved from shard {before} to shard {after}")
    return "; ".join(parts)


def _reassign(hosts: Iterable[Host]) -> list[HostMove]:
    """Recomputes each host's shard from its labels; raises (rolling back) on a two-shard host.

    Returns the hosts whose shard changed, in hostname order."""
    moves = []
    for host in hosts:
        labels = list(Label.objects.select_related("shard").filter(hosts=host))
        shard = shard_for_labels(host.hostname, labels)
        if shard != host.shard:
            before = host.shard.hostname if host.shard is not None else None
            moves.append(HostMove(host.hostname, before, shard.hostname if shard is not None else None))
            host.shard = shard
            host.version = F("version") + 1
            host.save(update_fields=["shard", "version"])
    return sorted(moves, key=lambda m: m.hostname)


def _bump_hosts(hosts: Iterable[Host]) -> None:
    Host.objects.filter(id__in=[h.id for h in hosts]).update(version=F("version") + 1)


# Labels


@transaction.atomic
def create_labels(names: Sequence[str]) -> list[Label]:
    names = _check_new_names("label", names)
    existing = list(Label.objects.filter(name__in=names).values_list("name", flat=True))
    if existing:
        raise Refused(f"{_plural('label', existing)} already exist{'' if len(existing) > 1 else 's'}", field="name")
    return [Label.objects.create(name=name) for name in names]


@transaction.atomic
def delete_labels(names: Sequence[str]) -> list[HostMove]:
    """Deletes labels unused by active jobs; returns the hosts that left a shard with them."""
    labels = get_labels(_check_names("label", names), lock=True)
    for label in labels:
        in_use = Job.objects.filter(status__in=JobStatus.ACTIVE).filter(
            id__in=HostQueueEntry.objects.filter(meta_host=label).values("job_id")
        ) | Job.objects.filter(status__in=JobStatus.ACTIVE, dependency_labels=label)
        job_ids = sorted({j.id for j in in_use})
        if job_ids:
            raise Refused(f"label {label.name} is used by active jobs {', '.join(map(str, job_ids))}", field="name")
    hosts = list(Host.objects.filter(labels__in=labels).distinct().select_related("shard"))
    Label.objects.filter(id__in=[label.id for label in labels]).delete()
    _bump_hosts(hosts)
    return _reassign(hosts)


@transaction.atomic
def add_label_to_hosts(label_name: str, hostnames: Sequence[str]) -> HostsChange:
    (label,) = get_labels(_check_names("label", [label_name]))
    hosts = get_hosts(_check_names("host", hostnames), lock=True)
    changed = [h for h in hosts if label not in h.labels.all()]
    for host in changed:
        host.labels.add(label)
    _bump_hosts(changed)
    moves = _reassign(changed)
    return HostsChange(get_hosts(hostnames), moves)


@transaction.atomic
def remove_label_from_hosts(label_name: str, hostnames: Sequence[str]) -> HostsChange:
    (label,) = get_labels(_check_names("label", [label_name]))
    hosts = get_hosts(_check_names("host", hostnames), lock=True)
    without = [h.hostname for h in hosts if label not in h.labels.all()]
    if without:
        raise FleetshardError(f"label {label.name} is not on {_plural('host', without)}", field="hosts")
    for host in hosts:
        host.labels.remove(label)
    _bump_hosts(hosts)
    moves = _reassign(hosts)
    return HostsChange(get_hosts(hostnames), moves)


# Hosts


@transaction.atomic
def create_hosts(
    hostnames: Sequence[str],
    *,
    labels: Sequence[str] = (),
    attributes: dict[str, str] | None = None,
    locked: bool = False,
    lock_reason: str = "",
) -> list[Host]:
    hostnames = _check_new_names("host", hostnames)
    attributes = _check_string_map("attribute", attributes or {}, "attributes")
    _check_text("the lock reason", lock_reason, "lock_reason", max_length=1024)
    if lock_reason and not locked:
        raise FleetshardError("a lock reason needs --lock", field="lock_reason")
    existing = list(Host.objects.filter(hostname__in=hostnames).values_list("hostname", flat=True))
    if existing:
        raise Refused(f"{_plural('host', existing)} already exist{'' if len(existing) > 1 else 's'}", field="hostname")
    label_objs = get_labels(_check_names("label", labels)) if labels else []
    hosts = []
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
        hosts.append(host)
    return get_hosts(hostnames)


@transaction.atomic
def delete_hosts(hostnames: Sequence[str]) -> None:
    hosts = get_hosts(_check_names("host", hostnames), lock=True)
    busy = (
        HostQueueEntry.objects.filter(host__in=hosts, status__in=HQEStatus.ACTIVE)
        .values_list("host__hostname", "job_id")
        .order_by("job_id")
    )
    if busy:
        host, job = busy[0]
        raise Refused(f"host {host} has active job {job}; abort it first", field="hosts")
    Host.objects.filter(id__in=[h.id for h in hosts]).delete()


@transaction.atomic
def lock_hosts(hostnames: Sequence[str], reason: str = "") -> list[Host]:
    _check_text("the lock reason", reason, "reason", max_length=1024)
    hosts = get_hosts(_check_names("host", hostnames), lock=True)
    Host.objects.filter(id__in=[h.id for h in hosts]).update(locked=True, lock_reason=reason, version=F("version") + 1)
    return get_hosts(hostnames)


@transaction.atomic
def unlock_hosts(hostnames: Sequence[str]) -> list[Host]:
    hosts = get_hosts(_check_names("host", hostnames), lock=True)
    Host.objects.filter(id__in=[h.id for h in hosts]).update(locked=False, lock_reason="", version=F("version") + 1)
    return get_hosts(hostnames)


# Shards


@transaction.atomic
def create_shard(hostname: str, labels: Sequence[str] = ()) -> tuple[Shard, str]:
    """Creates a shard and its token; the raw token is returned once and never stored."""
    (hostname,) = _check_new_names("shard", [hostname])
    if Shard.objects.filter(hostname=hostname).exists():
        raise Refused(f"shard {hostname} already exists", field="hostname")
    shard = Shard.objects.create(hostname=hostname)
    if labels:
        add_labels_to_shard(hostname, labels)
    # The description column holds 255 characters; a hostname may use all of them.
    _, raw = issue_token(shard=shard, description=f"heartbeat token of {hostname}"[:255])
    return shard, raw


@transaction.atomic
def add_labels_to_shard(hostname: str, label_names: Sequence[str]) -> ShardChange:
    shard = get_shard(hostname, lock=True)
    labels = get_labels(_check_names("label", label_names), lock=True)
    for label in labels:
        if label.shard_id is not None and label.shard_id != shard.id:
            raise Refused(f"label {label.name} already belongs to shard {label.shard.hostname}", field="labels")  # type: ignore[union-attr]
    Label.objects.filter(id__in=[label.id for label in labels]).update(shard=shard)
    moves = _reassign(
        Host.objects.filter(id__in=Host.labels.through.objects.filter(label__in=labels).values("host_id"))
        .select_related("shard")
        .select_for_update(of=("self",))
    )
    return ShardChange(shard, moves)


@transaction.atomic
def remove_label_from_shard(hostname: str, label_name: str) -> ShardChange:
    """Takes a label from a shard; returns the hosts that left the shard with it."""
    shard = get_shard(hostname, lock=True)
    (label,) = get_labels(_check_names("label", [label_name]), lock=True)
    if label.shard_id != shard.id:
        raise FleetshardError(f"label {label.name} does not belong to shard {shard.hostname}", field="labels")
    Label.objects.filter(id=label.id).update(shard=None)
    moves = _reassign(Host.objects.filter(labels=label).select_related("shard").select_for_update(of=("self",)))
    return ShardChange(shard, moves)


@transaction.atomic
def delete_shards(hostnames: Sequence[str]) -> ShardDeletion:
    """Unassigns the shards' labels and hosts; their active jobs can no longer run, so they end Aborted.

    Returns the hosts that left the shards and the jobs aborted."""
    shards = [get_shard(h, lock=True) for h in _check_names("shard", hostnames)]
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
        shard.delete()
    return ShardDeletion(sorted(moves, key=lambda m: m.hostname), sorted(aborted))


# Jobs


_PRIORITY_RE = re.compile(r"[+-]?[0-9]{1,10}")
_COUNT_RE = re.compile(r"[0-9]+")


def parse_priority(value: str | int) -> int:
    """An integer from -(2^31-1) to 2^31-1 or a priority name. Digits are ASCII only: Python's int()
    takes '²', '٣' and '1_0', which nobody means as a priority."""
    names = ", ".join(f"{k}={v}" for k, v in PRIORITY_NAMES.items())
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise FleetshardError(f"invalid priority {value!r}: use an integer or one of {names}", field="priority")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in PRIORITY_NAMES:
            return PRIORITY_NAMES[text]
        if not _PRIORITY_RE.fullmatch(text):
            raise FleetshardError(f"invalid priority {value!r}: use an integer or one of {names}", field="priority")
        value = int(text)
    if abs(value) > INT32_MAX:
        raise FleetshardError(
            f"invalid priority {value}: it must be between {-INT32_MAX} and {INT32_MAX}", field="priority"
        )
    return value


def max_hqes_per_job() -> int:
    return int(settings.FLEETSHARD_MAX_HQES_PER_JOB)


@dataclass
class JobRequest:
    name: str
    owner: str
    command: str
    meta_hosts: list[tuple[str, int]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    dependency_labels: list[str] = field(default_factory=list)
    priority: int | str = PRIORITY_NAMES["default"]
    timeout_mins: int = 1440
    max_runtime_mins: int = 60
    keyvals: dict[str, str] = field(default_factory=dict)
    parent_id: int | None = None


def parse_meta_hosts(text: str) -> list[tuple[str, int]]:
    """`board:pixel7*3,board:x` -> [("board:pixel7", 3), ("board:x", 1)].

    N is plain ASCII decimal digits (not '+3', ' 3', '1_0' or '٣', all of which int() takes); its
    size is judged by create_job against the per-job bound, so a huge N is an error naming it."""
    result = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, star, count = item.partition("*")
        if not name.strip():
            raise FleetshardError(f"invalid meta-host {item!r}: it needs a label before '*'", field="meta_hosts")
        if star and not _COUNT_RE.fullmatch(count):
            raise FleetshardError(
                f"invalid meta-host {item!r}: the count after '*' must be a whole number in ASCII digits, such as "
                f"{name}*2",
                field="meta_hosts",
            )
        # Python refuses to convert over 4300 digits; any count that long is over the bound anyway.
        n = (int(count) if len(count) <= 100 else 10**100) if star else 1
        result.append((name, n))
    return result


def merge_meta_hosts(meta_hosts: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """`board:a*1, board:a*1, wifi` -> [("board:a", 2), ("wifi", 1)]: a label named twice asks for
    that many hosts in all, which is what someone who wrote it twice means."""
    merged: dict[str, int] = {}
    for name, count in meta_hosts:
        merged[name] = merged.get(name, 0) + count
    return list(merged.items())


def _check_count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= INT32_MAX:
        raise FleetshardError(f"{name} must be an integer from 1 to {INT32_MAX}, not {value!r}", field=name)
    return value


@transaction.atomic
def create_job(req: JobRequest) -> Job:
    """Creates a job routed to the one shard that can run all of it.

    Refused (nothing created) when the job is malformed, asks for more than
    FLEETSHARD_MAX_HQES_PER_JOB host queue entries, spans shards, or asks for more distinct hosts
    than its shard has (a job never uses a host twice; see master.assignment.check_capacity)."""
    name = _check_text("the job name", req.name, "name", max_length=255).strip()
    if not name:
        raise FleetshardError("a job needs a name", field="name")
    _check_text("the command", req.command, "command", max_length=MAX_COMMAND_BYTES)
    if not req.command.strip():
        raise FleetshardError("a job needs a command", field="command")
    if len(req.command.encode()) > MAX_COMMAND_BYTES:
        # A longer one could never start anywhere (E2BIG), failing as infra and sending hosts to repair.
        raise FleetshardError(
            f"the command is {len(req.command.encode())} bytes in UTF-8; a shard runs at most "
            f"{MAX_COMMAND_BYTES} bytes (/bin/sh -c takes no longer argument)",
            field="command",
        )
    if not req.owner:
        raise FleetshardError("a job needs an owner", field="owner")
    priority = parse_priority(req.priority)
    timeout_mins = _check_count(req.timeout_mins, "timeout_mins")
    max_runtime_mins = _check_count(req.max_runtime_mins, "max_runtime_mins")
    if bool(req.meta_hosts) == bool(req.hosts):
        raise FleetshardError("give either meta-hosts (-m) or hosts (--hosts), and at least one", field="meta_hosts")
    for label_name, count in req.meta_hosts:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise FleetshardError(
                f"invalid meta-host count {count!r} for {label_name}: it must be at least 1", field="meta_hosts"
            )
    meta_hosts = merge_meta_hosts(req.meta_hosts)
    hostnames = _check_names("host", req.hosts) if req.hosts else []
    # Counted before anything is looked up or built: `board:b*100000` must cost nothing.
    wanted = sum(count for _, count in meta_hosts) + len(hostnames)
    if wanted > max_hqes_per_job():
        raise FleetshardError(
            f"a job may have at most {max_hqes_per_job()} host queue entries; this one asks for {wanted}",
            field="meta_hosts" if meta_hosts else "hosts",
        )
    keyvals = _check_string_map("keyval", req.keyvals, "keyvals")
    parent = None
    if req.parent_id is not None:
        parent = Job.objects.filter(id=req.parent_id).first()
        if parent is None:
            raise NotFound(f"unknown parent job {req.parent_id}", field="parent")
    deps = get_labels(_check_names("label", req.dependency_labels)) if req.dependency_labels else []
    if hostnames:
        specs = [HQESpec(host=h) for h in get_hosts(hostnames)]
        shard = route_job(specs, deps)
    else:
        labels = get_labels(_check_names("label", [n for n, _ in meta_hosts]))
        counts = {label: count for label, (_, count) in zip(labels, meta_hosts, strict=True)}
        shard = route_job([HQESpec(meta_host=label) for label in labels], deps)
        check_capacity(shard, counts, deps)
        specs = [HQESpec(meta_host=label) for label, count in counts.items() for _ in range(count)]
    job = Job.objects.create(
        name=name,
        owner=req.owner,
        priority=priority,
        command=req.command,
        timeout_mins=timeout_mins,
        max_runtime_mins=max_runtime_mins,
        keyvals=keyvals,
        parent=parent,
        shard=shard,
    )
    job.dependency_labels.set(deps)
    HostQueueEntry.objects.bulk_create(
        [HostQueueEntry(job=job, host=spec.host, meta_host=spec.meta_host) for spec in specs]
    )
    return job


@transaction.atomic
def abort_jobs(job_ids: Sequence[int]) -> list[Job]:
    """Marks jobs aborted; the shard kills or cancels their HQEs and reports them Aborted."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        raise FleetshardError("give at least one job id", field="ids")
    jobs = {j.id: j for j in Job.objects.select_for_update().filter(id__in=ids)}
    missing = [str(i) for i in ids if i not in jobs]
    if missing:
        raise NotFound(f"unknown job{'s' if len(missing) > 1 else ''} {', '.join(missing)}", field="ids")
    finished = [f"{i} ({jobs[i].status})" for i in ids if jobs[i].status not in JobStatus.ACTIVE]
    if finished:
        raise Refused(f"job{'s' if len(finished) > 1 else ''} {', '.join(finished)} already finished", field="ids")
    Job.objects.filter(id__in=ids, aborted=False).update(aborted=True, version=F("version") + 1)
    return list(Job.objects.filter(id__in=ids).order_by("id"))


# People


@transaction.atomic
def create_personal_token(username: str, *, admin: bool = False, description: str = "") -> tuple[Token, str]:
    """Creates the user if missing (staff and superuser with admin) and a new token, returned once."""
    if not username or len(username) > 150:
        raise FleetshardError("a username needs 1-150 characters", field="username")
    user, _ = get_user_model().objects.get_or_create(username=username)
    if admin and not (user.is_staff and user.is_superuser):
        user.is_staff = user.is_superuser = True
        user.save(update_fields=["is_staff", "is_superuser"])
    return issue_token(user=user, description=description or f"personal token of {username}")


@transaction.atomic
def create_shard_token(hostname: str, *, description: str = "") -> tuple[Token, str]:
    """Another heartbeat token for a shard (to rotate one: create, deploy, then revoke the old)."""
    shard = get_shard(hostname)
    return issue_token(shard=shard, description=(description or f"heartbeat token of {hostname}")[:255])


@transaction.atomic
def revoke_token(token_id: int) -> None:
    deleted, _ = Token.objects.filter(id=token_id).delete()
    if not deleted:
        raise NotFound(f"unknown token {token_id}", field="id")
