"""What a hostile receiver, job name or address does to the sender: each is one failed attempt,
recorded and retried later, never a hot loop, a stalled subscription or a connection to a private
address (docs/notifications.md, "Safety")."""

import socket
import time

import pytest
from django.core import mail

from master.notify import events, sender, webhook
from master.notify.models import Delivery, Subscription
from tests.master.notify.receiver import Receiver
from tests.master.notify.test_sender import drain, fast, receivers, subscribe  # noqa: F401  # fixtures
from tests.support import wait_until


def raw(answer: bytes):
    def behaviour(handler) -> None:
        handler.wfile.write(answer)
        handler.wfile.flush()
        handler.close_connection = True

    return behaviour


def test_a_nul_in_the_receivers_status_line_is_one_recorded_failure(transactional_db, fast, receivers):  # noqa: F811
    fast.FLEETSHARD_NOTIFY_BACKOFF_S = fast.FLEETSHARD_NOTIFY_BACKOFF_MAX_S = 60
    r = receivers(default=raw(b"\x00garbage\x00\r\n\r\n"))
    sub = subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": 1})])
    drain(timeout=1.5)
    d = Delivery.objects.get(subscription=sub)
    assert d.status == "pending" and d.attempts == 1 and len(r.got) == 1
    assert "BadStatusLine" in d.error and "\x00" not in d.error and "\ufffdgarbage" in d.error


def test_a_job_name_with_line_breaks_still_mails_on_one_subject_line(transactional_db, fast, settings):  # noqa: F811
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    subscribe(email="ana@example.org", events=["job.ended"])
    data = {"job": 7, "name": "x\r\nBcc: eve@example.org\u2028y", "owner": "ana", "status": "Failed"}
    events.emit([events.Event("job.ended", data, [], "ana")])
    drain(timeout=5)
    (message,) = mail.outbox
    assert message.subject == "[fleetshard] Job 7 (x Bcc: eve@example.org y) of ana ended Failed"
    assert message.recipients() == ["ana@example.org"]
    assert Delivery.objects.get().status == "delivered"


def test_an_event_that_cannot_be_formatted_is_a_failed_attempt_not_a_loop(transactional_db, fast, receivers):  # noqa: F811
    fast.FLEETSHARD_NOTIFY_BACKOFF_S = fast.FLEETSHARD_NOTIFY_BACKOFF_MAX_S = 60
    r = receivers()
    sub = subscribe(r.url, events=["regression.new"], format="slack")
    events.emit([events.Event("regression.new", {"test": "t", "before_s": None, "after_s": "x"})])
    drain(timeout=1.5)
    d = Delivery.objects.get(subscription=sub)
    assert d.status == "pending" and d.attempts == 1 and d.error.startswith("cannot send: TypeError")
    assert r.got == []


def test_with_many_subscriptions_fewer_events_are_fanned_out_per_transaction(db, monkeypatch):
    monkeypatch.setattr(sender, "FAN_OUT_DELIVERIES", 25)
    for _ in range(10):
        subscribe("http://example.org/hook", events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": i}) for i in range(5)])
    assert [sender.fan_out(), sender.fan_out(), sender.fan_out(), sender.fan_out()] == [2, 2, 1, 0]
    assert Delivery.objects.count() == 50


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://[fec0::1]/hook", "fec0::1 is a site-local address"),
        ("http://[2002:7f00:1::]/hook", "6to4 address of 127.0.0.1"),
        ("http://[2002:a9fe:a9fe::]/hook", "6to4 address of 169.254.169.254"),
        ("http://[::ffff:169.254.169.254]/hook", "169.254.169.254 is a link-local"),
        ("http://0x7f.1:0/hook", "port must be 1-65535, not 0"),
    ],
)
def test_addresses_refused_even_when_private_ones_are_allowed_are_never_connected(monkeypatch, url, reason):
    def no_socket(*args, **kwargs):
        raise AssertionError("a socket was made for a refused address")

    monkeypatch.setattr(socket, "socket", no_socket)
    outcome = webhook.post(url, b"{}", {}, allow_private=True, timeout_s=1)
    assert not outcome.ok and outcome.status is None and reason in outcome.error


def test_ipv6_loopback_is_allowed_with_private_addresses_as_ipv4_loopback_is():
    assert webhook.address_refusal("::1", True) is None
    assert "loopback" in (webhook.address_refusal("::1", False) or "")


def test_a_failing_webhooks_url_and_secret_stay_out_of_the_log(transactional_db, fast, receivers, caplog):  # noqa: F811
    fast.FLEETSHARD_NOTIFY_BACKOFF_S = fast.FLEETSHARD_NOTIFY_BACKOFF_MAX_S = 60
    r = receivers(default=500)
    sub = subscribe(r.url + "/T0001/B0001/sEcReTpAtH", events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": 1})])
    with caplog.at_level("DEBUG"):
        drain(timeout=1.5)
    assert f"to subscription {sub.id} failed: HTTP 500" in caplog.text
    assert "sEcReTpAtH" not in caplog.text and sub.secret not in caplog.text


def trickle(handler) -> None:
    try:
        for b in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 100:
            handler.wfile.write(bytes([b]))
            handler.wfile.flush()
            time.sleep(0.1)
    except OSError:
        pass


def test_a_receiver_trickling_its_headers_is_cut_at_the_one_deadline(monkeypatch):
    r = Receiver(default=trickle)
    try:
        started = time.monotonic()
        outcome = webhook.post(r.url, b"{}", {}, allow_private=True, timeout_s=1.0)
        took = time.monotonic() - started
    finally:
        r.close()
    # Cut at its 1 s, not after the 10 s of trickled headers (with room for a loaded machine).
    assert not outcome.ok and outcome.error == "no complete answer within 1 s" and took < 5


def test_closing_the_sender_stops_a_thread_retrying_a_dead_receiver(transactional_db, fast, receivers):  # noqa: F811
    r = receivers(default=500)  # retried inline (fast's backoff is under a second), up to SLICE times
    subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": 1})])
    s = sender.Sender()
    s.step()
    wait_until(lambda: len(r.got) >= 2, timeout=5)
    started = time.monotonic()
    s.close()
    # After the attempt in flight, not SLICE (500) attempts: a loaded machine stretches the one, not the count.
    assert time.monotonic() - started < 5 and len(r.got) < 20


@pytest.mark.parametrize("answer", [b"HTTP/1.1 200 OK\r\nContent-Le", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"])
def test_a_receiver_closing_inside_its_headers_has_not_answered(answer):
    r = Receiver(default=raw(answer))
    try:
        outcome = webhook.post(r.url, b"{}", {}, allow_private=True, timeout_s=2.0)
    finally:
        r.close()
    assert not outcome.ok and outcome.error == "the answer ended inside its headers"


def test_a_complete_answer_without_a_body_is_delivered():
    r = Receiver(default=raw(b"HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n"))
    try:
        outcome = webhook.post(r.url, b"{}", {}, allow_private=True, timeout_s=2.0)
    finally:
        r.close()
    assert outcome.ok and outcome.status == 204


def test_the_audit_trail_keeps_a_webhooks_host_not_its_secret_path(db):
    """A chat webhook's path is its secret; the audit trail is read by every staff member."""
    from master.models import AuditRecord
    from master.notify.services import NewSubscription, add_subscription, remove_subscription

    url = "https://hooks.example.org/services/T000/B000/s3cr3tT0ken"
    sub = add_subscription(NewSubscription(url=url, events=["job.ended"]), acting_user=None)
    remove_subscription(sub.id, acting_user=None)
    targets = [r.details["target"] for r in AuditRecord.objects.filter(action__startswith="notification.")]
    assert targets == ["https://hooks.example.org/...", "https://hooks.example.org/..."]
    assert Subscription.objects.count() == 0
