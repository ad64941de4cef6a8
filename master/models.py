"""Master-only state. The audit trail: every change a person (or the system) makes on the master.

Each master service writes its record in the same transaction as the change, so a change that fails
leaves no record and a record always describes a change that happened.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from common.models import Shard


class AuditRecord(models.Model):
    """One change: who made it, when, what it was, and why (when a reason was given)."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    # Null for changes the system makes by itself, and once the user is deleted; `actor` stays.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_records"
    )
    actor = models.CharField(max_length=150, db_index=True, help_text="The username at the time, or 'system'.")
    action = models.CharField(max_length=64, help_text="What was done, as TOPIC.VERB (e.g. host.lock).")
    reason = models.TextField(blank=True, default="")
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action}"


class AuditTarget(models.Model):
    """An object an audit record touched: kept by kind and name so it outlives the object itself."""

    record = models.ForeignKey(AuditRecord, on_delete=models.CASCADE, related_name="targets")
    kind = models.CharField(max_length=16)
    object_id = models.BigIntegerField(null=True, blank=True)
    name = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["kind", "name"], name="audit_target_kind_name_idx"),
            models.Index(fields=["kind", "object_id"], name="audit_target_kind_id_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name or self.object_id}"


class Token(models.Model):
    """An API credential: a person's (REST API) or a shard's (heartbeat). Only a digest is stored."""

    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16, help_text="The first characters, to tell tokens apart.")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens"
    )
    shard = models.ForeignKey(Shard, null=True, blank=True, on_delete=models.CASCADE, related_name="tokens")
    description = models.CharField(max_length=255, blank=True, default="")
    created_on = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_on"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(user__isnull=False, shard__isnull=True) | Q(user__isnull=True, shard__isnull=False)),
                name="token_for_user_xor_shard",
            )
        ]

    def __str__(self) -> str:
        owner = f"shard {self.shard}" if self.shard_id else f"user {self.user}"
        return f"{self.prefix}… ({owner})"

    @property
    def kind(self) -> str:
        return "shard" if self.shard_id else "personal"


# Benchmark results live in their own module; Django finds an app's models here.
from master.blobs.models import Artifact, Blob  # noqa: E402
from master.logs.models import RunLog, RunLogChunk  # noqa: E402
from master.notify.models import Delivery, NotificationEvent, ShardOfflineNotice, Subscription  # noqa: E402
from master.results.models import (  # noqa: E402
    DirtySeries,
    Regression,
    RegressionStatus,
    RejectedResult,
    TestEntry,
    TestRun,
)
from master.timeline.models import Interval, RunTrace, TraceChange, TraceDay, TracePiece  # noqa: E402

__all__ = [
    "Artifact",
    "Blob",
    "AuditRecord",
    "AuditTarget",
    "Delivery",
    "DirtySeries",
    "Interval",
    "NotificationEvent",
    "Regression",
    "RegressionStatus",
    "RejectedResult",
    "RunLog",
    "RunLogChunk",
    "RunTrace",
    "ShardOfflineNotice",
    "Subscription",
    "TestEntry",
    "TestRun",
    "Token",
    "TraceChange",
    "TraceDay",
    "TracePiece",
]
