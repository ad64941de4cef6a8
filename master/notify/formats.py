"""What a delivery sends: the JSON body, a Slack message, or an email, and the signature over it."""

import hashlib
import hmac
import json
import re
from typing import Any

from master.notify.models import Delivery

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def summary(kind: str, data: dict[str, Any]) -> str:
    """One line for people (Slack, an email's subject)."""
    d = data
    if kind in ("regression.new", "regression.fixed"):
        what = "Regression" if kind == "regression.new" else "Regression fixed"
        label = f" [{d.get('label')}]" if d.get("label") else ""
        return (
            f"{what}: {d.get('test')} / {d.get('entry')}{label} +{d.get('change_pct', 0):.1f}% "
            f"({d.get('before_s'):.6g} s to {d.get('after_s'):.6g} s), regression {d.get('regression')}"
        )
    if kind == "host.repair_failed":
        return f"Host {d.get('host')} of shard {d.get('shard')} failed repair"
    if kind == "host.missing":
        return f"Host {d.get('host')} of shard {d.get('shard')} is missing"
    if kind == "shard.offline":
        return f"Shard {d.get('shard')} is offline: no heartbeat for {d.get('silent_s')} s"
    if kind == "job.ended":
        return f"Job {d.get('job')} ({d.get('name')}) of {d.get('owner')} ended {d.get('status')}"
    return kind


def payload(delivery: Delivery) -> dict[str, Any]:
    event = delivery.event
    return {
        "event": event.kind,
        "delivery": str(delivery.uuid),
        "id": event.id,
        "created_on": event.created_on.isoformat().replace("+00:00", "Z"),
        "data": event.data,
    }


def body(delivery: Delivery, fmt: str) -> bytes:
    """The webhook body: the event as JSON, or for `slack` an incoming webhook's message."""
    if fmt == "slack":
        text = summary(delivery.event.kind, delivery.event.data)
        return json.dumps({"text": text}, ensure_ascii=False).encode()
    return json.dumps(payload(delivery), ensure_ascii=False, sort_keys=True).encode()


def signature(secret: str, data: bytes) -> str:
    """`sha256=HEX(HMAC-SHA256(secret, body))`, as the receiver recomputes it."""
    return "sha256=" + hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def email(delivery: Delivery) -> tuple[str, str]:
    """(subject, text) of the email for a delivery."""
    event = delivery.event
    text = summary(event.kind, event.data)
    detail = json.dumps(payload(delivery), indent=2, ensure_ascii=False, sort_keys=True)
    # A job's or a test's name may hold line breaks: in a subject they would be refused (BadHeaderError)
    # at every retry, holding the subscription's later mail for a day.
    subject = " ".join(_CONTROL.sub(" ", f"[fleetshard] {text}").split())
    return subject[:200], f"{text}\n\n{detail}\n"
