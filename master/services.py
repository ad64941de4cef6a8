"""The master's domain changes. Each is one transaction; the API, the CLI, the admin and tests call these.

A change a shard must see raises the record's `version`, so the next heartbeat re-sends it.
"""

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common.constants import PRIORITY_NAMES, HQEStatus, JobStatus
from common.errors import FleetshardError, NotFound, Refused
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry, Job, Label, Shard, Token
from common.tokens import issue_token
from master.assignment import HQESpec, route_job, shard_for_labels

_NAME_RE = re.compile(r"^[^\s,*]+$")
# Found by fuzzing (tests/fuzz/test_regressions.py): int() takes '1_0' and '٣', and a count or a
# priority of any size reached the database (a 5xx) or made a job of 100,000 HQEs.
_ASCII_INTEGER_RE = re.compile(r"[+-]?[0-9]+")
_PRIORITY_MAX = 2**31 - 1
MAX_HQES_PER_JOB = 500


def _check_names(kind: str, names: Sequence[str]) -> list[str]:
    if not names:
        raise FleetshardError(f"give at least one {kind} name", field=kind)
    for name in names:
        if not name or len(name) > 255 or not _NAME_RE.match(name):
            raise FleetshardError(
                f"invalid {kind} name {name!r}: use 1-255 characters without spaces, commas or '*'", field=kind
            )
    return list(dict.fromkeys(names))


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


def _reassign(hosts: Iterable[Host]) -> None:
    """Recomputes each host's shard from its labels; raises (rolling back) on a two-shard host."""
    for host in hosts:
        labels = list(Label.objects.select_related("shard").filter(hosts=host))
        shard = shard_for_labels(host.hostname, labels)
        if shard != host.shard:
            host.shard = shard
            host.version = F("version") + 1
            host.save(update_fields=["shard", "version"])


def _bump_hosts(hosts: Iterable[Host]) -> None:
    Host.objects.filter(id__in=[h.id for h in hosts]).update(version=F("version") + 1)


# Labels


@transaction.atomic
def create_labels(names: Sequence[str]) -> list[Label]:
    names = _check_names("label", names)
    existing = list(Label.objects.filter(name__in=names).values_list("name", flat=True))
    if existing:
        raise Refused(f"{_plural('label', existing)} already exist{'' if len(existing) > 1 else 's'}", field="name")
    return [Label.objects.create(name=name) for name in names]


@transaction.atomic
def delete_labels(names: Sequence[str]) -> None:
    labels = get_labels(_check_names("label", names), lock=True)
    for label in labels:
        in_use = Job.objects.filter(status__in=JobStatus.ACTIVE).filter(
            id__in=HostQueueEntry.objects.filter(meta_host=label).values("job_id")
        ) | Job.objects.filter(status__in=JobStatus.ACTIVE, dependency_labels=label)
        job_ids = sorted({j.id for j in in_use})
        if job_ids:
            raise Refused(f"label {label.name} is used by active jobs {', '.join(map(str, job_ids))}", field="name")
    hosts = list(Host.objects.filter(labels__in=labels).distinct())
    Label.objects.filter(id__in=[label.id for label in labels]).delete()
    _bump_hosts(hosts)
    _reassign(hosts)


@transaction.atomic
def add_label_to_hosts(label_name: str, hostnames: Sequence[str]) -> list[Host]:
    (label,) = get_labels([label_name])
    hosts = get_hosts(_check_names("host", hostnames), lock=True)
    changed = [h for h in hosts if label not in h.labels.all()]
    for host in changed:
        host.labels.add(label)
    _bump_hosts(changed)
    _reassign(changed)
    return get_hosts(hostnames)


@transaction.atomic
def remove_label_from_hosts(label_name: str, hostnames: Sequence[str]) -> list[Host]:
    (label,) = get_labels([label_name])
    hosts = get_hosts(_check_names("host", hostnames), lock=True)
    without = [h.hostname for h in hosts if label not in h.labels.all()]
    if without:
        raise FleetshardError(f"label {label.name} is not on {_plural('host', without)}", field="hosts")
    for host in hosts:
        host.labels.remove(label)
    _bump_hosts(hosts)
    _reassign(hosts)
    return get_hosts(hostnames)


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
    hostnames = _check_names("host", hostnames)
    existing = list(Host.objects.filter(hostname__in=hostnames).values_list("hostname", flat=True))
    if existing:
        raise Refused(f"{_plural('host', existing)} already exist{'' if len(existing) > 1 else 's'}", field="hostname")
    label_objs = get_labels(labels) if labels else []
    for key in attributes or {}:
        if not key or not re.match(r"^[A-Za-z0-9_.-]+$", key):
            raise FleetshardError(
                f"invalid attribute name {key!r}: use letters, digits, '_', '.', '-'", field="attributes"
            )
    if lock_reason and not locked:
        raise FleetshardError("a lock reason needs --lock", field="lock_reason")
    hosts = []
    for hostname in hostnames:
        shard = shard_for_labels(hostname, label_objs)
        host = Host.objects.create(
            hostname=hostname,
            attributes=dict(attributes or {}),
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
    (hostname,) = _check_names("shard", [hostname])
    if Shard.objects.filter(hostname=hostname).exists():
        raise Refused(f"shard {hostname} already exists", field="hostname")
    shard = Shard.objects.create(hostname=hostname)
    if labels:
        add_labels_to_shard(hostname, labels)
    # The description column holds 255 characters; a hostname may use all of them.
    _, raw = issue_token(shard=shard, description=f"heartbeat token of {hostname}"[:255])
    return shard, raw


@transaction.atomic
def add_labels_to_shard(hostname: str, label_names: Sequence[str]) -> Shard:
    shard = get_shard(hostname, lock=True)
    labels = get_labels(_check_names("label", label_names), lock=True)
    for label in labels:
        if label.shard_id is not None and label.shard_id != shard.id:
            raise Refused(f"label {label.name} already belongs to shard {label.shard.hostname}", field="labels")  # type: ignore[union-attr]
    Label.objects.filter(id__in=[label.id for label in labels]).update(shard=shard)
    _reassign(
        Host.objects.filter(
            id__in=Host.labels.through.objects.filter(label__in=labels).values("host_id")
        ).select_for_update()
    )
    return shard


@transaction.atomic
def remove_label_from_shard(hostname: str, label_name: str) -> Shard:
    shard = get_shard(hostname, lock=True)
    (label,) = get_labels([label_name], lock=True)
    if label.shard_id != shard.id:
        raise FleetshardError(f"label {label.name} does not belong to shard {shard.hostname}", field="labels")
    Label.objects.filter(id=label.id).update(shard=None)
    _reassign(Host.objects.filter(labels=label).select_for_update())
    return shard


@transaction.atomic
def delete_shards(hostnames: Sequence[str]) -> None:
    """Unassigns the shards' labels and hosts; their active jobs can no longer run, so they end Aborted."""
    shards = [get_shard(h, lock=True) for h in _check_names("shard", hostnames)]
    for shard in shards:
        active_jobs = list(Job.objects.filter(shard=shard, status__in=JobStatus.ACTIVE).values_list("id", flat=True))
        HostQueueEntry.objects.filter(job_id__in=active_jobs, status__in=HQEStatus.ACTIVE).update(
            status=HQEStatus.ABORTED, finished_on=timezone.now()
        )
        Job.objects.filter(id__in=active_jobs).update(aborted=True, version=F("version") + 1)
        refresh_job_statuses(active_jobs)
        Host.objects.filter(shard=shard).update(shard=None, version=F("version") + 1)
        shard.delete()


# Jobs


def parse_priority(value: str | int) -> int:
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip().lower()
        if text in PRIORITY_NAMES:
            return PRIORITY_NAMES[text]
        if not _ASCII_INTEGER_RE.fullmatch(text):
            names = ", ".join(f"{k}={v}" for k, v in PRIORITY_NAMES.items())
            raise FleetshardError(f"invalid priority {value!r}: use an integer or one of {names}", field="priority")
        number = int(text) if len(text) <= 20 else 2**63  # longer is out of range anyway (and int() is slow)
    if abs(number) > _PRIORITY_MAX:
        raise FleetshardError(
            f"invalid priority {value!r}: it must be between -{_PRIORITY_MAX} and {_PRIORITY_MAX}", field="priority"
        )
    return number


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
    """`board:pixel7*3,board:x` -> [("board:pixel7", 3), ("board:x", 1)]."""
    result = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, star, count = item.partition("*")
        if star and not (count.isascii() and count.isdigit()):
            raise FleetshardError(
                f"invalid meta-host {item!r}: the count after '*' must be a whole number in ASCII digits",
                field="meta_hosts",
            )
        n = (int(count) if len(count) <= 20 else 2**63) if star else 1  # longer is over MAX_HQES_PER_JOB anyway
        result.append((name, n))
    return result


@transaction.atomic
def create_job(req: JobRequest) -> Job:
    if not req.name.strip():
        raise FleetshardError("a job needs a name", field="name")
    if not req.command.strip():
        raise FleetshardError("a job needs a command", field="command")
    if not req.owner:
        raise FleetshardError("a job needs an owner", field="owner")
    priority = parse_priority(req.priority)
    for name in ("timeout_mins", "max_runtime_mins"):
        value = getattr(req, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise FleetshardError(f"{name} must be a positive integer, not {value!r}", field=name)
    if bool(req.meta_hosts) == bool(req.hosts):
        raise FleetshardError("give either meta-hosts (-m) or hosts (--hosts), and at least one", field="meta_hosts")
    for name, count in req.meta_hosts:
        if count < 1:
            raise FleetshardError(
                f"invalid meta-host count {count} for {name}: it must be at least 1", field="meta_hosts"
            )
    if not isinstance(req.keyvals, dict) or not all(isinstance(k, str) and k for k in req.keyvals):
        raise FleetshardError("keyvals must map non-empty names to values", field="keyvals")
    parent = None
    if req.parent_id is not None:
        parent = Job.objects.filter(id=req.parent_id).first()
        if parent is None:
            raise NotFound(f"unknown parent job {req.parent_id}", field="parent")
    wanted = sum(count for _, count in req.meta_hosts) + len(req.hosts)
    if wanted > MAX_HQES_PER_JOB:
        raise FleetshardError(
            f"a job may have at most {MAX_HQES_PER_JOB} host queue entries; this one asks for {wanted}",
            field="meta_hosts",
        )
    deps = get_labels(req.dependency_labels) if req.dependency_labels else []
    specs: list[HQESpec] = []
    if req.hosts:
        specs = [HQESpec(host=h) for h in get_hosts(_check_names("host", req.hosts))]
    else:
        metas = dict(zip([n for n, _ in req.meta_hosts], get_labels([n for n, _ in req.meta_hosts]), strict=False))
        specs = [HQESpec(meta_host=metas[name]) for name, count in req.meta_hosts for _ in range(count)]
    shard = route_job(list(dict.fromkeys(specs)), deps)
    job = Job.objects.create(
        name=req.name.strip(),
        owner=req.owner,
        priority=priority,
        command=req.command,
        timeout_mins=req.timeout_mins,
        max_runtime_mins=req.max_runtime_mins,
        keyvals={str(k): str(v) for k, v in req.keyvals.items()},
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
