"""The shared data model. Master and shard use the same schema; on a shard, ids are the master's.

State only one role keeps lives in that role's app: master/models.py, shard/models.py.
"""

from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

from common.constants import (
    DEFAULT_MAX_RUNTIME_MINS,
    DEFAULT_PRIORITY,
    DEFAULT_TIMEOUT_MINS,
    OFFLINE_AFTER_INTERVALS,
    FailureClass,
    HostOrigin,
    HostStatus,
    HQEStatus,
    JobStatus,
)


def offline_after_s() -> float:
    """How long a shard may stay silent and still count as online (and keep its instance, docs/protocol.md)."""
    return OFFLINE_AFTER_INTERVALS * settings.FLEETSHARD_HEARTBEAT_INTERVAL_S


def _choices(values: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(v, v) for v in values]


class Shard(models.Model):
    hostname = models.CharField(max_length=255, unique=True)
    created_on = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    client_version = models.CharField(max_length=64, blank=True, default="")
    known_hosts_count = models.PositiveIntegerField(default=0)
    known_jobs_count = models.PositiveIntegerField(default=0)
    last_updates_count = models.PositiveIntegerField(default=0)
    # Updates waiting in the shard's outbox, as its last heartbeat said (null: it did not say).
    outbox_depth = models.PositiveBigIntegerField(null=True, blank=True)
    updates_applied = models.PositiveBigIntegerField(
        default=0, help_text="Updates applied since the shard was created."
    )
    # The shard database the master last heard from (docs/protocol.md, "Shard instances").
    instance = models.CharField(max_length=36, blank=True, default="")
    instance_since = models.DateTimeField(null=True, blank=True)
    # The highest seq that instance has sent: a database restored from a backup counts from below it.
    seq_seen = models.BigIntegerField(default=0)
    # Discovery (master/sync/discovery.py): the last discovered set applied, what it refused, and the pools
    # the shard announced (docs/protocol.md, "discovered").
    discovered_generation = models.BigIntegerField(default=0)
    discovered_rejected = models.JSONField(default=list, blank=True)
    discovered_count = models.PositiveIntegerField(default=0)
    pools = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    def is_online(self, now: datetime | None = None) -> bool:
        if self.last_heartbeat is None:
            return False
        now = now or timezone.now()
        return (now - self.last_heartbeat).total_seconds() <= offline_after_s()

    @property
    def status(self) -> str:
        return "online" if self.is_online() else "offline"


class Label(models.Model):
    name = models.CharField(max_length=255, unique=True)
    shard = models.ForeignKey(Shard, null=True, blank=True, on_delete=models.SET_NULL, related_name="labels")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Host(models.Model):
    hostname = models.CharField(max_length=255, unique=True)
    labels = models.ManyToManyField(Label, blank=True, related_name="hosts")
    attributes = models.JSONField(default=dict, blank=True)
    locked = models.BooleanField(default=False)
    lock_reason = models.CharField(max_length=1024, blank=True, default="")
    status = models.CharField(max_length=32, choices=_choices(HostStatus.ALL), default=HostStatus.READY)
    shard = models.ForeignKey(Shard, null=True, blank=True, on_delete=models.SET_NULL, related_name="hosts")
    version = models.PositiveIntegerField(default=1)
    origin = models.CharField(max_length=16, choices=_choices(HostOrigin.ALL), default=HostOrigin.DECLARED)
    # The shard whose discovery registered or confirmed the host, and when its set last held it.
    discovered_by = models.ForeignKey(
        Shard, null=True, blank=True, on_delete=models.SET_NULL, related_name="discovered_hosts"
    )
    last_seen = models.DateTimeField(null=True, blank=True)
    # Timeline totals count a host's idle time from here, not from a window's start before it existed
    # (hosts made before this field count as old: common migration 0011).
    created_on = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["hostname"]
        indexes = [
            # A shard's hosts in id order (a cold sync), and its quiet heartbeat's holdings read from
            # this index alone on PostgreSQL, however the shard's rows lie in the table (common migration 0014).
            models.Index(fields=["shard", "id"], include=["version", "status"], name="host_shard_holdings_idx"),
            # The fleet overview's hosts by shard, status and lock: read from this index alone.
            models.Index(fields=["shard", "status", "locked"], name="host_shard_status_idx"),
            # The host list sorted by status, a page at a time (ties by id, in the same direction).
            models.Index(fields=["status", "id"], name="host_status_idx"),
        ]
        # PostgreSQL also has a trigram index on UPPER(hostname) for the host list's search (common
        # migration 0012): a part of a name found without reading every host.

    def __str__(self) -> str:
        return self.hostname


class Job(models.Model):
    name = models.CharField(max_length=255)
    owner = models.CharField(max_length=150)
    priority = models.IntegerField(default=DEFAULT_PRIORITY)
    command = models.TextField()
    timeout_mins = models.PositiveIntegerField(default=DEFAULT_TIMEOUT_MINS)
    max_runtime_mins = models.PositiveIntegerField(default=DEFAULT_MAX_RUNTIME_MINS)
    dependency_labels = models.ManyToManyField(Label, blank=True, related_name="dependent_jobs")
    keyvals = models.JSONField(default=dict, blank=True)
    # An A/B job's plan (common/ab.py): its variants and repeats; {} for a plain job.
    ab = models.JSONField(default=dict, blank=True)
    # No database constraint: a shard holds a job's parent id without holding the parent.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children", db_constraint=False
    )
    aborted = models.BooleanField(default=False)
    # The job this one runs again (`job rerun`, the admin's Rerun): same spec, a new job. Kept as it
    # was when that job is purged (no update on delete: a purge's cost stays its own rows).
    rerun_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="reruns", db_constraint=False
    )
    shard = models.ForeignKey(Shard, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    version = models.PositiveIntegerField(default=1)
    created_on = models.DateTimeField(default=timezone.now)
    # Derived from the HQEs; stored so lists and the heartbeat can filter on it.
    status = models.CharField(max_length=32, choices=_choices(JobStatus.ALL), default=JobStatus.QUEUED)
    # Shard-side: the parent's keyvals (the response's suite_keyvals), since the shard has no parent row.
    suite_keyvals = models.JSONField(default=dict, blank=True)
    # Blobs its runs read at $FLEETSHARD_INPUT_DIR/NAME: [{"name", "digest", "size", "kind"}] (common/blobs.py).
    inputs = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # A shard's active jobs, and its heartbeat's holdings from this index alone on PostgreSQL.
            models.Index(
                fields=["shard", "status"], include=["id", "version", "priority"], name="job_shard_holdings_idx"
            ),
            models.Index(fields=["status"], name="job_status_idx"),
            models.Index(fields=["owner"], name="job_owner_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.id}-{self.name}"


class HostQueueEntry(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="hqes")
    # No database constraint: a shard may hold a named-host HQE before the host itself arrives.
    host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="hqes", db_constraint=False
    )
    meta_host = models.ForeignKey(
        Label, null=True, blank=True, on_delete=models.SET_NULL, related_name="meta_host_hqes"
    )
    status = models.CharField(max_length=32, choices=_choices(HQEStatus.ALL), default=HQEStatus.QUEUED)
    failure = models.CharField(max_length=16, choices=_choices(FailureClass.ALL), blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    started_on = models.DateTimeField(null=True, blank=True)
    finished_on = models.DateTimeField(null=True, blank=True)
    log_tail = models.TextField(blank=True, default="")
    # Master: the highest outbox seq applied to this HQE (duplicates are at or below it).
    last_seq = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["id"]
        verbose_name = "host queue entry"
        verbose_name_plural = "host queue entries"
        indexes = [
            models.Index(fields=["status"], name="hqe_status_idx"),
            models.Index(fields=["host", "status"], name="hqe_host_status_idx"),
        ]

    def __str__(self) -> str:
        return f"HQE {self.id} of job {self.job_id}"

    @property
    def is_active(self) -> bool:
        return self.status in HQEStatus.ACTIVE
