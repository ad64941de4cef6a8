"""Jobs: creating them (routed to the one shard that can run them) and aborting them."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import F

from common.ab import VARIANT_INPUT, ABPlan
from common.blobs import BadInput, InputRef, parse_inputs
from common.constants import (
    DEFAULT_MAX_RUNTIME_MINS,
    DEFAULT_PRIORITY,
    DEFAULT_TIMEOUT_MINS,
    MAX_COMMAND_BYTES,
    JobStatus,
)
from common.errors import FleetshardError, NotFound, Refused
from common.models import HostQueueEntry, Job
from master.access.audit import ActingUser, record
from master.blobs.models import Blob
from master.blobs.store import touch_blobs
from master.services.assignment import HQESpec, check_capacity, route_job
from master.services.shared import INT32_MAX, check_names, check_string_map, check_text, get_hosts, get_labels
from master.sync.notifier import shards_changed


def max_hqes_per_job() -> int:
    return int(settings.FLEETSHARD_MAX_HQES_PER_JOB)


@dataclass
class JobRequest:
    """A job to create, in typed values: the edges that read people's syntax (`board:x*3`, `high`)
    turn it into these first (master.api.serializers)."""

    name: str
    owner: str
    command: str
    meta_hosts: list[tuple[str, int]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    dependency_labels: list[str] = field(default_factory=list)
    priority: int = DEFAULT_PRIORITY
    timeout_mins: int = DEFAULT_TIMEOUT_MINS
    max_runtime_mins: int = DEFAULT_MAX_RUNTIME_MINS
    keyvals: dict[str, str] = field(default_factory=dict)
    parent_id: int | None = None
    ab: ABPlan | None = None
    # [{"name", "digest", "size", "kind"}]: blobs already on the master (common/blobs.py).
    inputs: list[dict[str, object]] = field(default_factory=list)
    rerun_of_id: int | None = None


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


def _check_priority(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > INT32_MAX:
        raise FleetshardError(
            f"invalid priority {value!r}: it must be an integer between {-INT32_MAX} and {INT32_MAX}",
            field="priority",
        )
    return value


@transaction.atomic
def create_job(req: JobRequest, *, acting_user: ActingUser) -> Job:
    """Creates a job routed to the one shard that can run all of it.

    Refused (nothing created) when the job is malformed, asks for more than
    FLEETSHARD_MAX_HQES_PER_JOB host queue entries, spans shards, or asks for more distinct hosts
    than its shard has (a job never uses a host twice; see master.services.assignment.check_capacity)."""
    name = check_text("the job name", req.name, "name", max_length=255).strip()
    if not name:
        raise FleetshardError("a job needs a name", field="name")
    check_text("the command", req.command, "command", max_length=MAX_COMMAND_BYTES)
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
    priority = _check_priority(req.priority)
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
    hostnames = check_names("host", req.hosts) if req.hosts else []
    # Counted before anything is looked up or built: `board:b*100000` must cost nothing.
    wanted = sum(count for _, count in meta_hosts) + len(hostnames)
    if wanted > max_hqes_per_job():
        raise FleetshardError(
            f"a job may have at most {max_hqes_per_job()} host queue entries; this one asks for {wanted}",
            field="meta_hosts" if meta_hosts else "hosts",
        )
    keyvals = check_string_map("keyval", req.keyvals, "keyvals")
    inputs = _check_inputs(req.inputs)
    if req.ab is not None and any(i.name == VARIANT_INPUT for i in inputs):
        # Each variant's runs see their own build under this name: another input there would collide.
        raise FleetshardError(
            f"input name {VARIANT_INPUT}: an A/B job's runs see their variant's own input under that name; "
            "give the input another name",
            field="inputs",
        )
    parent = None
    if req.parent_id is not None:
        parent = Job.objects.filter(id=req.parent_id).first()
        if parent is None:
            raise NotFound(f"unknown parent job {req.parent_id}", field="parent")
    deps = get_labels(check_names("label", req.dependency_labels)) if req.dependency_labels else []
    if hostnames:
        specs = [HQESpec(host=h) for h in get_hosts(hostnames)]
        shard = route_job(specs, deps)
    else:
        labels = get_labels(check_names("label", [n for n, _ in meta_hosts]))
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
        rerun_of_id=req.rerun_of_id,
        shard=shard,
        ab=req.ab.to_json() if req.ab is not None else {},
        inputs=[i.to_wire() for i in inputs],
    )
    job.dependency_labels.set(deps)
    HostQueueEntry.objects.bulk_create(
        [HostQueueEntry(job=job, host=spec.host, meta_host=spec.meta_host) for spec in specs]
    )
    shards_changed([shard.id])
    record(
        "job.create",
        acting_user=acting_user,
        targets=[job, shard],
        details={
            "owner": req.owner,
            "priority": priority,
            "meta_hosts": [[n, c] for n, c in meta_hosts],
            "hosts": hostnames,
            "dependency_labels": [d.name for d in deps],
            **({"ab": req.ab.to_json()} if req.ab is not None else {}),
            **({"inputs": [f"{i.name}={i.digest}" for i in inputs]} if inputs else {}),
            **({"rerun_of": req.rerun_of_id} if req.rerun_of_id is not None else {}),
        },
    )
    return job


def _check_inputs(items: object) -> list[InputRef]:
    """The job's inputs, each a blob the master holds with that size (the CLI uploads it first)."""
    if not items:
        return []
    try:
        inputs = parse_inputs(items, int(settings.FLEETSHARD_MAX_INPUT_BYTES))
    except BadInput as exc:
        raise FleetshardError(str(exc), field="inputs") from None
    sizes = dict(Blob.objects.filter(digest__in={i.digest for i in inputs}).values_list("digest", "size"))
    for ref in inputs:
        if sizes.get(ref.digest) != ref.size:
            raise FleetshardError(
                f"input {ref.name}: the master has no blob {ref.digest} of {ref.size} bytes: upload it first "
                "(PUT /api/v1/blobs/DIGEST; `fleetshard job create --input` does)",
                field="inputs",
            )
    touch_blobs(sorted(sizes))
    return inputs


@transaction.atomic
def rerun_job(job_id: int, *, owner: str, acting_user: ActingUser) -> Job:
    """A new job with the spec of job `job_id` (its command, hosts or meta-hosts, dependencies,
    priority, times, keyvals, parent, A/B plan and inputs), owned by `owner`, with `rerun_of` naming the first. It is
    routed anew: the hosts and labels must still be there and on one shard."""
    job = Job.objects.filter(id=job_id).prefetch_related("dependency_labels").first()
    if job is None:
        raise NotFound(f"unknown job {job_id}", field="id")
    meta_hosts: dict[str, int] = {}
    hosts: list[str] = []
    for hqe in job.hqes.select_related("host", "meta_host").order_by("id"):
        if hqe.meta_host is not None:
            meta_hosts[hqe.meta_host.name] = meta_hosts.get(hqe.meta_host.name, 0) + 1
        elif hqe.host is not None:
            hosts.append(hqe.host.hostname)
        else:
            raise Refused(
                f"job {job_id} cannot run again: the host or label of its entry {hqe.id} was deleted", field="id"
            )
    if not meta_hosts and not hosts:
        raise Refused(f"job {job_id} has no entries to run again", field="id")
    return create_job(
        JobRequest(
            name=job.name,
            owner=owner,
            command=job.command,
            meta_hosts=list(meta_hosts.items()),
            hosts=hosts,
            dependency_labels=[label.name for label in job.dependency_labels.all()],
            priority=job.priority,
            timeout_mins=job.timeout_mins,
            max_runtime_mins=job.max_runtime_mins,
            keyvals=dict(job.keyvals or {}),
            parent_id=job.parent_id if job.parent_id and Job.objects.filter(id=job.parent_id).exists() else None,
            # A rerun of an A/B job is an A/B job, and its runs read the same inputs (blobs by digest).
            ab=ABPlan.from_json(job.ab or {}),
            inputs=list(job.inputs or []),
            rerun_of_id=job.id,
        ),
        acting_user=acting_user,
    )


@transaction.atomic
def abort_jobs(job_ids: Sequence[int], *, acting_user: ActingUser) -> list[Job]:
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
    fresh = [i for i in ids if not jobs[i].aborted]
    if fresh:
        # A job asked to abort again is not aborted again: only the first request is a change to record.
        Job.objects.filter(id__in=fresh, aborted=False).update(aborted=True, version=F("version") + 1)
        shards_changed(jobs[i].shard_id for i in fresh)
        record("job.abort", acting_user=acting_user, targets=[jobs[i] for i in fresh])
    return list(Job.objects.filter(id__in=ids).order_by("id"))
