"""Subscriptions: adding, removing and testing them (audited), for the API, the admin and the CLI."""

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.db import transaction

from common.errors import FleetshardError, NotFound
from master.access.audit import ActingUser, record
from master.notify import webhook
from master.notify.models import EVENTS, FORMATS, Delivery, NotificationEvent, Subscription
from master.services.shared import check_text

# Django's own validate_email lets `user@localhost` through; mail for this machine is no notification.
_EMAIL = EmailValidator(allowlist=[])


@dataclass(frozen=True)
class NewSubscription:
    url: str = ""
    email: str = ""
    events: Sequence[str] = ()
    label: str = ""
    owner: str = ""
    format: str = "json"


def _audit_details(sub: Subscription) -> dict[str, object]:
    """What the audit trail keeps of a subscription: a webhook's scheme and host only, since a chat
    webhook's path is itself its secret, and the trail is shown to every staff member."""
    target = sub.target
    if sub.url:
        parts = urlsplit(sub.url)
        target = f"{parts.scheme}://{parts.netloc}/..." if parts.path not in ("", "/") or parts.query else sub.url
    return {"subscription": sub.id, "target": target, "events": sub.events, "label": sub.label, "owner": sub.owner}


def _check(new: NewSubscription) -> None:
    if bool(new.url) == bool(new.email):
        raise FleetshardError("give either a webhook url or an email address", field="url")
    if new.url:
        try:
            webhook.check_url(new.url)
        except webhook.Refused as exc:
            raise FleetshardError(str(exc), field="url") from None
    if new.email:
        check_text("the email address", new.email, "email", max_length=254)
        domain = new.email.rpartition("@")[2].lower()
        if domain.startswith("[") or domain == "localhost" or domain.endswith(".localhost"):
            raise FleetshardError(
                f"an email address needs a mail domain, not {domain!r} (no localhost, no address in brackets)",
                field="email",
            )
        try:
            _EMAIL(new.email)
        except ValidationError:
            raise FleetshardError(f"invalid email address {new.email!r}", field="email") from None
    if not new.events:
        raise FleetshardError(f"give at least one event: {', '.join(EVENTS)}", field="events")
    unknown = [e for e in new.events if e not in EVENTS]
    if unknown:
        raise FleetshardError(f"unknown event {unknown[0]!r}: use {', '.join(EVENTS)}", field="events")
    if new.format not in FORMATS:
        raise FleetshardError(f"invalid format {new.format!r}: use json or slack", field="format")
    if new.email and new.format != "json":
        raise FleetshardError("--format applies to webhooks only", field="format")
    check_text("the label", new.label, "label", max_length=255)
    check_text("the owner", new.owner, "owner", max_length=150)


@transaction.atomic
def add_subscription(new: NewSubscription, *, acting_user: ActingUser) -> Subscription:
    """A new subscription; its `secret` is returned this once (the API shows it in this answer only).
    The URL's form is checked here; where it points is checked at each delivery."""
    _check(new)
    sub = Subscription.objects.create(
        url=new.url,
        email=new.email,
        events=list(dict.fromkeys(new.events)),
        label=new.label,
        owner=new.owner,
        format=new.format,
        secret=secrets.token_hex(32),
        created_by=acting_user if isinstance(acting_user, User) and acting_user.pk is not None else None,
    )
    record("notification.add", acting_user=acting_user, details=_audit_details(sub))
    return sub


def get_subscription(subscription_id: int) -> Subscription:
    sub = Subscription.objects.filter(id=subscription_id).first()
    if sub is None:
        raise NotFound(f"unknown subscription {subscription_id}", field="id")
    return sub


@transaction.atomic
def remove_subscription(subscription_id: int, *, acting_user: ActingUser) -> None:
    """Removes the subscription and its deliveries (pending ones are not sent)."""
    sub = get_subscription(subscription_id)
    record("notification.remove", acting_user=acting_user, details=_audit_details(sub))
    sub.delete()


@transaction.atomic
def remove_subscriptions_of(user: User, reason: str, *, acting_user: ActingUser) -> int:
    """Removes `user`'s subscriptions (what they have not been sent yet is dropped), each with a
    `notification.remove` record giving `reason`: a user deactivated or deleted hears nothing more, and
    what they subscribed to may name their private chat's webhook. Returns how many it removed."""
    subs = list(Subscription.objects.filter(created_by=user).order_by("id"))
    for sub in subs:
        record("notification.remove", acting_user=acting_user, reason=reason, details=_audit_details(sub))
    Subscription.objects.filter(id__in=[s.id for s in subs]).delete()
    return len(subs)


@transaction.atomic
def test_subscription(subscription_id: int, *, acting_user: ActingUser) -> Delivery:
    """Queues a test event for this subscription alone (sent as `job.ended` with `"test": true`, so a
    receiver sees a real event's shape), delivered by the sender like any other."""
    sub = get_subscription(subscription_id)
    data = {"test": True, "subscription": sub.id, "job": 0, "name": "fleetshard test notification"}
    event = NotificationEvent.objects.create(
        kind="job.ended",
        data={**data, "owner": "", "status": "Completed", "shard": None, "labels": []},
        fanned_out=True,
    )
    delivery = Delivery.objects.create(subscription=sub, event=event, created_on=event.created_on)
    record("notification.test", acting_user=acting_user, details=_audit_details(sub))
    return delivery
