"""What makes the sender fast enough for hundreds of events a second (docs/notifications.md, "Delivery"):
a subscription's connection kept alive between deliveries (and given up when it may not be), one
watchdog thread for every deadline, name resolution inside the deadline, and the queries of a batch."""

import select
import socket
import threading
import time

from master.notify import events, sender, webhook
from master.notify.models import Delivery
from tests.master.notify.receiver import Receiver
from tests.master.notify.test_sender import drain, fast, receivers, subscribe  # noqa: F401  # fixtures
from tests.support import wait_until


def post(r: Receiver, kept: webhook.Connection | None, body: bytes = b"{}") -> webhook.Outcome:
    return webhook.post(r.url, body, {}, allow_private=True, timeout_s=2.0, connection=kept)


def long_answer(handler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "2048")
    handler.end_headers()
    handler.wfile.write(b"y" * 2048)


def answer_then_hang_up(handler) -> None:
    """A complete keep-alive answer, then the connection closed, as a receiver closing an idle one does."""
    handler.send_response(200)
    handler.send_header("Content-Length", "2")
    handler.end_headers()
    handler.wfile.write(b"ok")
    handler.wfile.flush()
    handler.close_connection = True


def test_a_kept_connection_carries_every_request_and_none_is_kept_without_one(receivers):  # noqa: F811
    r = receivers(keep_alive=True)
    kept = webhook.Connection()
    assert all(post(r, kept).ok for _ in range(5))
    assert len({g["port"] for g in r.got}) == 1
    assert all(post(r, None).ok for _ in range(3))
    assert len({g["port"] for g in r.got[5:]}) == 3 and all(g["headers"]["Connection"] == "close" for g in r.got[5:])
    kept.close()


def test_a_connection_is_not_kept_after_an_answer_read_only_in_part_or_one_that_closes(receivers):  # noqa: F811
    r = receivers([long_answer], keep_alive=True)
    kept = webhook.Connection()
    first = post(r, kept)
    assert first.ok and len(first.body) == webhook.RESPONSE_KEPT  # the rest is never read: a new connection
    assert post(r, kept).ok and post(r, kept).ok
    assert [g["port"] for g in r.got][1] != r.got[0]["port"] and r.got[1]["port"] == r.got[2]["port"]
    old = receivers()  # HTTP/1.0: the receiver closes every connection
    assert post(old, kept).ok and post(old, kept).ok and old.got[0]["port"] != old.got[1]["port"]
    kept.close()


def test_a_kept_connection_the_receiver_closed_is_replaced_and_the_request_sent_once(receivers):  # noqa: F811
    r = receivers([answer_then_hang_up], keep_alive=True)
    kept = webhook.Connection()
    assert post(r, kept, b'{"n": 1}').ok
    # The receiver's close has reached this side (the kept socket reads its end): the receiver's thread
    # closes it after the answer, which a loaded machine may run later than any fixed pause.
    wait_until(lambda: select.select([kept._sock], [], [], 0)[0], timeout=10, interval=0.01, what="the close")
    second = post(r, kept, b'{"n": 2}')
    assert second.ok, second
    assert [g["body"] for g in r.got] == [b'{"n": 1}', b'{"n": 2}'] and r.got[0]["port"] != r.got[1]["port"]
    kept.close()


def test_a_connection_older_than_keep_s_is_made_again(receivers, monkeypatch):  # noqa: F811
    r = receivers(keep_alive=True)
    kept = webhook.Connection()
    monkeypatch.setattr(webhook, "KEEP_S", 0.0)  # every connection too old: its name resolved and checked again
    assert post(r, kept).ok and post(r, kept).ok
    assert r.got[0]["port"] != r.got[1]["port"]
    kept.close()


def test_a_refusal_still_applies_to_a_subscription_with_a_kept_connection(receivers):  # noqa: F811
    r = receivers(keep_alive=True)
    kept = webhook.Connection()
    assert post(r, kept).ok
    refused = webhook.post(r.url, b"{}", {}, allow_private=False, timeout_s=2.0, connection=kept)
    assert not refused.ok and "loopback" in refused.error and len(r.got) == 1
    kept.close()


def test_one_watchdog_thread_serves_every_attempts_deadline(receivers, monkeypatch):  # noqa: F811
    r = receivers(keep_alive=True)
    kept = webhook.Connection()
    post(r, kept)  # the first attempt in this process starts the watchdog
    started: list[str] = []
    start = threading.Thread.start

    def noted(thread: threading.Thread) -> None:
        if threading.current_thread() is threading.main_thread():  # not the receiver's own threads
            started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", noted)
    assert all(post(r, kept).ok for _ in range(20)) and all(post(r, None).ok for _ in range(5))
    assert started == []
    assert [t.name for t in threading.enumerate()].count("notify-deadlines") == 1
    assert webhook._process.watchdog()._alarms == set()  # an attempt that ended in time leaves nothing behind
    kept.close()


def test_a_name_that_does_not_resolve_in_time_ends_the_attempt_at_its_deadline(monkeypatch):
    real = socket.getaddrinfo

    def slow(host, *args, **kwargs):
        if host == "slow.example.org":
            time.sleep(3)  # a name server that does not answer
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    started = time.monotonic()
    outcome = webhook.post("https://slow.example.org/hook", b"{}", {}, allow_private=False, timeout_s=0.5)
    took = time.monotonic() - started
    # Before the name server's 3 s answer, with room for a loaded machine.
    assert not outcome.ok and outcome.error == "cannot resolve slow.example.org within 0.5 s" and took < 2.5, took


def test_a_batch_of_deliveries_costs_one_read_and_one_write(db, fast, receivers, django_assert_num_queries):  # noqa: F811
    r = receivers(keep_alive=True)
    sub = subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": i}) for i in range(sender.FETCH + 20)])
    sender.fan_out()
    kept = webhook.Connection()
    # Two batches: each read, then written in one UPDATE; the third read finds nothing.
    with django_assert_num_queries(5):
        assert sender.send_subscription(sub.id, kept=kept) == sender.FETCH + 20
    assert set(Delivery.objects.values_list("status", "attempts")) == {("delivered", 1)}
    assert len({g["port"] for g in r.got}) == 1
    kept.close()


def test_a_failure_is_written_at_once_with_the_successes_before_it(db, fast, receivers, django_assert_num_queries):  # noqa: F811
    fast.FLEETSHARD_NOTIFY_BACKOFF_S = fast.FLEETSHARD_NOTIFY_BACKOFF_MAX_S = 60  # not retried in this call
    r = receivers([200, 200, 500], keep_alive=True)
    sub = subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": i}) for i in range(5)])
    sender.fan_out()
    # The read, the two delivered in one UPDATE, the failure in another; then it waits for its retry.
    with django_assert_num_queries(3):
        assert sender.send_subscription(sub.id) == 3
    rows = list(Delivery.objects.order_by("id").values_list("status", "attempts", "error"))
    assert rows == [("delivered", 1, ""), ("delivered", 1, ""), ("pending", 1, "HTTP 500"), *[("pending", 0, "")] * 2]


def test_a_delivery_that_failed_then_succeeded_counts_every_attempt(db, fast, receivers):  # noqa: F811
    r = receivers([500, 500], keep_alive=True)  # retried inline: fast's backoff is well under a second
    sub = subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": i}) for i in range(3)])
    sender.fan_out()
    assert sender.send_subscription(sub.id) == 5
    rows = list(Delivery.objects.order_by("id").values_list("status", "attempts", "response_status", "error"))
    assert rows == [("delivered", 3, 200, ""), ("delivered", 1, 200, ""), ("delivered", 1, 200, "")]


def test_due_subscriptions_is_two_queries(db, django_assert_num_queries):
    subs = [subscribe(f"http://example.org/{i}", events=["host.missing"]) for i in range(3)]
    events.emit([events.Event("host.missing", {"n": i}) for i in range(4)])
    sender.fan_out()
    with django_assert_num_queries(2):
        assert sender.due_subscriptions() == sorted(s.id for s in subs)


def test_a_subscription_keeps_its_connection_across_turns(transactional_db, fast, receivers, monkeypatch):  # noqa: F811
    monkeypatch.setattr(sender, "SLICE", 7)  # six turns, on whichever thread is free
    monkeypatch.setattr(sender, "FETCH", 5)
    r = receivers(keep_alive=True)
    subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": i}) for i in range(40)])
    drain(timeout=30)
    assert [g["port"] for g in r.got] == [r.got[0]["port"]] * 40
    assert [b["data"]["n"] for b in r.delivered()] == list(range(40))
