"""Shard-only state: the outbox of updates for the master, the dead letters, the shard's singleton, and
the scheduler's bookkeeping of hosts and runs beside the shared rows (common.models) they belong to.

Only the shard app creates these tables; the master's database never has them.
"""

from django.db import models
from django.utils import timezone

from common.models import Host, HostQueueEntry


class OutboxEntry(models.Model):
    """An HQE status change waiting for the master's ack."""

    seq = models.BigIntegerField(unique=True)
    hqe_id = models.BigIntegerField()
    job_id = models.BigIntegerField(db_index=True)
    payload = models.JSONField()
    created_on = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["seq"]
        verbose_name_plural = "outbox entries"

    def __str__(self) -> str:
        return f"update {self.seq} of HQE {self.hqe_id}"


class HostEvent(models.Model):
    """A host status change waiting for the master (docs/protocol.md, "host_events"): the timeline's
    Cleaning and Repairing come from these. Numbered from the outbox's seqs, so updates and events
    keep one order; recorded in the transaction of the change itself."""

    seq = models.BigIntegerField(unique=True)
    host_id = models.BigIntegerField()
    status = models.CharField(max_length=32)
    at = models.DateTimeField()

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"event {self.seq}: host {self.host_id} {self.status}"


class DeadLetter(models.Model):
    """An update the master rejected, kept for operators."""

    seq = models.BigIntegerField()
    hqe_id = models.BigIntegerField()
    job_id = models.BigIntegerField()
    payload = models.JSONField()
    error = models.TextField()
    created_on = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"rejected update {self.seq} of HQE {self.hqe_id}"


class ShardState(models.Model):
    """The singleton: the outbox counter, which must never reuse a seq even when empty."""

    last_seq = models.BigIntegerField(default=0)
    last_heartbeat_ok = models.DateTimeField(null=True, blank=True)
    # This database's instance id, and the physical identity it was taken for: a copied database
    # (another file, another cluster or oid) no longer matches and takes a new instance id.
    instance = models.CharField(max_length=36, blank=True, default="")
    identity = models.CharField(max_length=255, blank=True, default="")
    # Runs the purge deleted: started, and ended by outcome. /metrics adds them to what the HQE rows
    # count, so its counters never go down when history goes (Prometheus reads a drop as a reset).
    purged_started = models.BigIntegerField(default=0)
    purged_ended = models.JSONField(default=dict, blank=True)
    # The latest `at` of a host event: events never go back in time from it, so a clock stepping back
    # cannot leave a status open on the master's timeline (docs/protocol.md, "Host events").
    event_clock = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"shard state (last seq {self.last_seq})"


class HostState(models.Model):
    """What only the shard knows of a host: which scheduler process holds it, and whether it may get work.

    Every host the shard holds has one (shard.sync.ingest creates it with the host). The scheduler claims and
    releases a host by conditional UPDATEs on this row and the host's, under shard.locks.shard_write.
    """

    host = models.OneToOneField(Host, primary_key=True, on_delete=models.CASCADE, related_name="state")
    # The scheduler process handling the host, from its claim until it is Ready (or Repair Failed) again.
    runner = models.CharField(max_length=255, blank=True, default="")
    # The config version whose repair failed; a newer version from the master makes the shard try again.
    repair_failed_version = models.PositiveIntegerField(null=True, blank=True)
    # The master no longer assigns this host: it finishes its job and is dropped once idle.
    retired = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"state of host {self.host_id}"


class Run(models.Model):
    """The scheduler's record of an HQE it took: who runs it, its process and its results directory.

    Created in the claim's transaction, so an HQE has at most one, and never sent to the master.
    """

    hqe = models.OneToOneField(HostQueueEntry, primary_key=True, on_delete=models.CASCADE, related_name="run")
    runner = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    results_dir = models.CharField(max_length=1024, blank=True, default="")

    def __str__(self) -> str:
        return f"run of HQE {self.hqe_id}"


def run_of(hqe: HostQueueEntry) -> Run | None:
    """The HQE's run record, None for one never claimed; free once the query said select_related("run")."""
    try:
        return hqe.run
    except Run.DoesNotExist:
        return None


class WorkerPool(models.Model):
    """A worker manager's pool (shard.elastic): when it last started a worker, kept here so that a
    restarted manager still keeps starts `--min-seconds-between-workers` apart. How many workers it
    has is never stored: the backend's list is the truth."""

    key = models.CharField(max_length=255, unique=True)
    last_start = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"worker pool {self.key}"


class WorkerRegistration(models.Model):
    """An elastic worker (`run_shard --worker-id ID --slots N`) and the hosts it brings, written in one
    transaction. The heartbeat's holder folds the live ones into the discovered set (shard/run/workers.py)."""

    worker_id = models.CharField(max_length=64, unique=True)
    runner = models.CharField(max_length=255)
    hosts = models.JSONField(default=list)
    registered_at = models.DateTimeField(auto_now_add=True)
    # A clean exit: its hosts are sent as released (the master deletes them) rather than vanished.
    released = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"worker {self.worker_id}"


class DiscoveryState(models.Model):
    """The singleton of discovery (shard/sync/discovery.py): the shard's whole discovered set, its generation,
    the generation the master last acked (with what it refused), and each source's last run."""

    generation = models.BigIntegerField(default=0)
    hosts = models.JSONField(default=list, blank=True)
    acked_generation = models.BigIntegerField(default=0)
    rejected = models.JSONField(default=list, blank=True)
    # Hostnames that left the set and have not come back: kept Missing whatever else moves them.
    missing = models.JSONField(default=list, blank=True)
    # Source name -> {"at", "ok", "hosts", "error"}: what the shard admin shows.
    sources = models.JSONField(default=dict, blank=True)
    # Live elastic workers' hosts (shard/run/workers.py), sent with `hosts` as one set.
    worker_hosts = models.JSONField(default=list, blank=True)
    # [hostname, generation] of workers' hosts that left cleanly: sent as `released` until acked.
    released = models.JSONField(default=list, blank=True)
    # The pools the worker managers announce, and the list the master last took.
    pools = models.JSONField(default=list, blank=True)
    pools_sent = models.JSONField(default=None, null=True, blank=True)

    def __str__(self) -> str:
        return f"discovery (generation {self.generation}, acked {self.acked_generation})"
