"""`fleetshard notify ...` against a live server: the secret once, a test delivered to a real receiver,
deliveries listed, and people kept to their own subscriptions."""

import json

import pytest

from master.models import AuditRecord
from master.notify.models import Subscription
from master.notify.sender import Sender
from tests.cli.conftest import fails, ok
from tests.master.notify.receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receiver(settings):
    settings.FLEETSHARD_NOTIFY_ALLOW_PRIVATE = True
    r = Receiver()
    yield r
    r.close()


def test_add_list_test_deliveries_remove(cli, server, receiver):
    added = json.loads(
        ok(
            cli(
                "--json",
                "notify",
                "add",
                "--url",
                receiver.url,
                "--event",
                "job.ended",
                "--event",
                "host.missing",
                "--label",
                "board:a",
                "--format",
                "slack",
            )
        ).stdout
    )
    assert set(added) == {"id", "url", "email", "events", "label", "owner", "format", "created_on", "secret"}
    assert (added["events"], added["label"], added["format"]) == (["job.ended", "host.missing"], "board:a", "slack")
    assert len(added["secret"]) == 64
    listed = json.loads(ok(cli("--json", "notify", "list")).stdout)
    assert [s["id"] for s in listed] == [added["id"]] and "secret" not in listed[0]
    assert receiver.url in ok(cli("notify", "list")).stdout

    assert "Queued a test notification" in ok(cli("notify", "test", str(added["id"]))).stdout
    sender = Sender()
    try:
        sender.drain(10)
    finally:
        sender.close()
    assert receiver.delivered() == [{"text": "Job 0 (fleetshard test notification) of  ended Completed"}]
    (delivery,) = json.loads(ok(cli("--json", "notify", "deliveries", str(added["id"]))).stdout)
    assert (delivery["event"], delivery["status"], delivery["attempts"], delivery["response_status"]) == (
        "job.ended",
        "delivered",
        1,
        200,
    )
    assert delivery["delivery"] == receiver.got[0]["headers"]["X-Fleetshard-Delivery"]

    ok(cli("notify", "remove", str(added["id"])))
    assert not Subscription.objects.exists()
    actions = list(AuditRecord.objects.order_by("id").values_list("actor", "action"))
    assert actions[-3:] == [
        ("boss", "notification.add"),
        ("boss", "notification.test"),
        ("boss", "notification.remove"),
    ]


def test_an_email_subscription_and_bad_input(cli, server):
    added = json.loads(ok(cli("--json", "notify", "add", "--email", "ana@example.org", "--event", "job.ended")).stdout)
    assert (added["url"], added["email"]) == ("", "ana@example.org")
    fails(cli("notify", "add", "--url", "ftp://x.example.org/", "--event", "job.ended"), "must be http or https")
    fails(cli("notify", "add", "--event", "job.ended"), "give one of --url or --email", code=2)
    fails(cli("notify", "add", "--url", "https://x.example.org/", "--event", "job.begun"), "job.begun", code=2)


def test_people_see_and_change_only_their_own_subscriptions(cli, server):
    mine = json.loads(
        ok(
            cli(
                "--json",
                "notify",
                "add",
                "--url",
                "https://x.example.org/",
                "--event",
                "job.ended",
                token=server.user_token,
            )
        ).stdout
    )
    staffs = json.loads(
        ok(cli("--json", "notify", "add", "--url", "https://y.example.org/", "--event", "job.ended")).stdout
    )
    assert [s["id"] for s in json.loads(ok(cli("--json", "notify", "list", token=server.user_token)).stdout)] == [
        mine["id"]
    ]
    assert len(json.loads(ok(cli("--json", "notify", "list")).stdout)) == 2
    fails(cli("notify", "remove", str(staffs["id"]), token=server.user_token), f"unknown subscription {staffs['id']}")
    fails(cli("notify", "deliveries", "999"), "unknown subscription 999")
    ok(cli("notify", "remove", str(mine["id"])))  # staff may remove anyone's
