"""`fleetshard notify ...`: notification subscriptions (docs/notifications.md)."""

import click

from cli.action import Run, action
from cli.inputs import Id
from cli.output import Column, when

EVENTS = ("regression.new", "regression.fixed", "host.repair_failed", "host.missing", "shard.offline", "job.ended")

SUBSCRIPTION_COLUMNS: list[Column] = [
    ("Id", "id"),
    ("To", lambda s: s["url"] or f"mailto:{s['email']}"),
    ("Events", lambda s: ", ".join(s["events"])),
    ("Label", "label"),
    ("Owner", "owner"),
    ("Format", "format"),
    ("Created", when("created_on")),
]
DELIVERY_COLUMNS: list[Column] = [
    ("Delivery", "delivery"),
    ("Event", "event"),
    ("Status", "status"),
    ("Attempts", "attempts"),
    ("Created", when("created_on")),
    ("Next try", lambda d: when("next_attempt_on")(d) if d["status"] == "pending" else ""),
    ("HTTP", "response_status"),
    ("Error", "error"),
]


@click.group()
def notify() -> None:
    """Notifications: a webhook or an email for regressions, failed repairs, missing hosts, offline shards
    and ended jobs."""


@notify.command("add")
@click.option("--url", metavar="URL", help="A webhook (http or https) to POST each event to.")
@click.option("--email", metavar="ADDRESS", help="An email address to mail each event to.")
@click.option(
    "--event", "events", multiple=True, required=True, type=click.Choice(EVENTS), help="An event to hear of (repeat)."
)
@click.option("--label", default="", metavar="L", help="Only events about label L.")
@click.option("--owner", default="", metavar="U", help="Only events about the jobs of U.")
@click.option("--format", "fmt", type=click.Choice(["json", "slack"]), default="json", help="The webhook body.")
@action
def notify_add(
    run: Run, url: str | None, email: str | None, events: tuple[str, ...], label: str, owner: str, fmt: str
) -> None:
    """Subscribe a webhook (--url) or an email address (--email); a webhook's signing secret is printed once."""
    if bool(url) == bool(email):
        raise click.UsageError("give one of --url or --email")
    body = {"url": url or "", "email": email or "", "events": list(events), "label": label, "owner": owner}
    body["format"] = fmt
    obj = run.api.post("/notifications/", body)
    target = obj["url"] or obj["email"]
    run.done(
        obj, f"Added subscription {obj['id']} for {target}. Its signing secret, shown only this once:\n{obj['secret']}"
    )


@notify.command("list")
@action
def notify_list(run: Run) -> None:
    """List subscriptions (yours; staff see everyone's)."""
    run.rows(run.api.list("/notifications/"), SUBSCRIPTION_COLUMNS, "subscriptions")


@notify.command("remove")
@click.argument("subscription_id", metavar="ID", type=Id("subscription"))
@action
def notify_remove(run: Run, subscription_id: int) -> None:
    """Remove a subscription: what it has not yet been sent is dropped."""
    run.api.request("DELETE", f"/notifications/{subscription_id}/")
    run.done({"removed": subscription_id}, f"Removed subscription {subscription_id}")


@notify.command("test")
@click.argument("subscription_id", metavar="ID", type=Id("subscription"))
@action
def notify_test(run: Run, subscription_id: int) -> None:
    """Send a test event to a subscription (see `notify deliveries ID` for how it went)."""
    delivery = run.api.post(f"/notifications/{subscription_id}/test/")
    run.done(
        delivery, f"Queued a test notification to subscription {subscription_id} (delivery {delivery['delivery']})"
    )


@notify.command("deliveries")
@click.argument("subscription_id", metavar="ID", type=Id("subscription"))
@action
def notify_deliveries(run: Run, subscription_id: int) -> None:
    """A subscription's latest deliveries, newest first: status, attempts, the last error."""
    rows = run.api.get(f"/notifications/{subscription_id}/deliveries/")
    run.rows(rows, DELIVERY_COLUMNS, "deliveries")
