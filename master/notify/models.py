"""Notification subscriptions, the event outbox and each event's deliveries (docs/notifications.md).
Defined here, registered through master.models.

An event row is written in the transaction that causes it (master.notify.events), so an event is
sent exactly when its cause committed, and survives a master that dies before sending it. The sender
fans each event out into one delivery per matching subscription, then delivers each subscription's
deliveries oldest first: a delivery's `uuid` is the receiver's dedup key, the same on every retry.
"""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from common.models import Shard

EVENTS = (
    "regression.new",
    "regression.fixed",
    "host.repair_failed",
    "host.missing",
    "shard.offline",
    "job.ended",
)
FORMATS = ("json", "slack")
MAX_URL = 2000


class Subscription(models.Model):
    """Who hears of which events: a webhook `url` or an `email` address, filtered by label and owner."""

    url = models.CharField(max_length=MAX_URL, blank=True, default="")
    email = models.CharField(max_length=254, blank=True, default="")
    events = models.JSONField(default=list, help_text="The event names sent to this subscription.")
    label = models.CharField(max_length=255, blank=True, default="", help_text="Only events about this label.")
    owner = models.CharField(max_length=150, blank=True, default="", help_text="Only events about this owner's jobs.")
    format = models.CharField(max_length=8, default="json", choices=[(f, f) for f in FORMATS])
    # Kept as is: the sender signs every body with it (HMAC needs the secret, not a digest of it).
    secret = models.CharField(max_length=64)
    # A user's subscriptions go with them (master.services.users records each; CASCADE catches a user
    # deleted any other way), and send nothing while they are inactive. None: added by the system.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="subscriptions"
    )
    created_on = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "master"
        ordering = ["id"]

    def __str__(self) -> str:
        return f"subscription {self.id} to {self.target}"

    @property
    def target(self) -> str:
        return self.url or f"mailto:{self.email}"


class NotificationEvent(models.Model):
    """One event in the outbox; `fanned_out` once the sender has made its deliveries."""

    kind = models.CharField(max_length=32)
    labels = models.JSONField(default=list, help_text="The labels the event is about (a subscription's --label).")
    owner = models.CharField(max_length=150, blank=True, default="", help_text="The owner of the job it is about.")
    data = models.JSONField(default=dict)
    created_on = models.DateTimeField(default=timezone.now)
    fanned_out = models.BooleanField(default=False)

    class Meta:
        app_label = "master"
        ordering = ["id"]
        indexes = [
            models.Index(fields=["id"], condition=models.Q(fanned_out=False), name="notifyevent_pending_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.id}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # retried for FLEETSHARD_NOTIFY_GIVE_UP_S, then given up


class Delivery(models.Model):
    """One event to one subscription, with the outcome of its last attempt."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(NotificationEvent, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_on = models.DateTimeField(default=timezone.now)
    created_on = models.DateTimeField(default=timezone.now)
    finished_on = models.DateTimeField(null=True, blank=True)
    response_status = models.IntegerField(null=True, blank=True)
    # At most RESPONSE_KEPT bytes of the receiver's answer, decoded with replacement.
    response_body = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        app_label = "master"
        ordering = ["id"]
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(
                fields=["subscription", "id"],
                condition=models.Q(status="pending"),
                name="delivery_pending_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"delivery {self.uuid} ({self.status})"


class ShardOfflineNotice(models.Model):
    """A shard the sender found silent and announced; deleted once it heartbeats again, so the next
    outage is announced too."""

    shard = models.OneToOneField(Shard, on_delete=models.CASCADE, primary_key=True, related_name="offline_notice")
    since = models.DateTimeField()

    class Meta:
        app_label = "master"

    def __str__(self) -> str:
        return f"shard {self.shard_id} offline since {self.since:%Y-%m-%d %H:%M:%S}"
