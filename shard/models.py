"""Shard-only state: the outbox of updates for the master, the dead letters, and the shard's singleton.

Only the shard app creates these tables; the master's database never has them.
"""

from django.db import models
from django.utils import timezone


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

    def __str__(self) -> str:
        return f"shard state (last seq {self.last_seq})"
