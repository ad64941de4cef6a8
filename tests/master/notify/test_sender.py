"""Notifications end to end in one process: events written by their causes reach real loopback
receivers through the sender, in order, signed, retried with one delivery id, and hostile URLs and
receivers are refused or cut off without holding up anyone else (docs/notifications.md)."""

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from common.models import Host, Shard
from master import services
from master.models import AuditRecord
from master.notify import events, sender
from master.notify import services as notify
from master.notify.models import Delivery, NotificationEvent, Subscription
from master.results.models import Regression
from tests.master.notify.receiver import Receiver, flood, hang, redirect
from tests.support import wait_until

ALL = ["regression.new", "regression.fixed", "host.repair_failed", "host.missing", "shard.offline", "job.ended"]


@pytest.fixture
def fast(settings):
    settings.FLEETSHARD_NOTIFY_ALLOW_PRIVATE = True
    settings.FLEETSHARD_NOTIFY_BACKOFF_S = 0.05
    settings.FLEETSHARD_NOTIFY_BACKOFF_MAX_S = 0.2
    settings.FLEETSHARD_NOTIFY_TIMEOUT_S = 1.0
    return settings


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(*args, **kwargs) -> Receiver:
        made.append(Receiver(*args, **kwargs))
        return made[-1]

    yield make
    for r in made:
        r.close()


def subscribe(url="", email="", events=ALL, **kwargs) -> Subscription:
    new = notify.NewSubscription(url=url, email=email, events=events, **kwargs)
    return notify.add_subscription(new, acting_user=None)


def drain(timeout=30.0):
    s = sender.Sender()
    try:
        s.drain(timeout)
    finally:
        s.close()


def job_ended(fleet, heartbeat, name="smoke", status="Completed"):
    job = fleet.job(name)
    hqe = job.hqes.get()
    resp = heartbeat(fleet.lab1, fleet.token1)
    host = next(h for h in resp["hosts"] if h["hostname"] == "a1")
    seq = hqe.id * 10
    heartbeat(
        fleet.lab1,
        fleet.token1,
        updates=[
            {"seq": seq, "hqe": hqe.id, "job": job.id, "status": "Running", "host": host["id"]},
            {"seq": seq + 1, "hqe": hqe.id, "job": job.id, "status": status, "exit_code": 0},
        ],
    )
    return job


def test_each_event_type_reaches_a_real_receiver_signed(fleet_committed, heartbeat, fast, receivers):
    fleet = fleet_committed
    r = receivers()
    sub = subscribe(r.url)
    job = job_ended(fleet, heartbeat)
    a2 = Host.objects.get(hostname="a2")
    heartbeat(fleet.lab1, fleet.token1, known_hosts=[{"id": a2.id, "version": a2.version, "status": "Repair Failed"}])
    events.host_missing([Host.objects.get(hostname="a3").id])
    Shard.objects.filter(id=fleet.lab2.id).update(last_heartbeat=timezone.now() - timedelta(hours=1))
    reg = Regression.objects.create(
        test="t", entry="e", label="board:a", start=timezone.now(), before_s=1.0, after_s=1.3, change_pct=30.0
    )
    events.regression_confirmed(reg, timezone.now())
    events.regression_fixed(reg, timezone.now())
    drain()
    got = r.delivered()
    kinds = [b["event"] for b in got]
    assert sorted(kinds) == sorted(ALL), kinds
    by_kind = {b["event"]: b for b in got}
    assert by_kind["job.ended"]["data"]["job"] == job.id and by_kind["job.ended"]["data"]["status"] == "Completed"
    assert by_kind["host.repair_failed"]["data"]["host"] == "a2"
    assert by_kind["host.missing"]["data"]["host"] == "a3"
    assert by_kind["shard.offline"]["data"]["shard"] == "lab2"
    assert by_kind["regression.new"]["data"]["regression"] == reg.id
    for request in r.got:
        body, headers = request["body"], request["headers"]
        expected = "sha256=" + hmac.new(sub.secret.encode(), body, hashlib.sha256).hexdigest()
        assert headers["X-Fleetshard-Signature"] == expected
        assert headers["X-Fleetshard-Event"] == json.loads(body)["event"]
        assert headers["X-Fleetshard-Delivery"] == json.loads(body)["delivery"]
    assert set(Delivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_a_job_ends_once_and_a_shard_offline_is_announced_once_per_outage(fleet_committed, heartbeat, fast, receivers):
    fleet = fleet_committed
    r = receivers()
    subscribe(r.url, events=["job.ended", "shard.offline"])
    job_ended(fleet, heartbeat)
    Shard.objects.filter(id=fleet.lab2.id).update(last_heartbeat=timezone.now() - timedelta(hours=1))
    drain()
    drain()
    assert sorted(b["event"] for b in r.delivered()) == ["job.ended", "shard.offline"]
    heartbeat(fleet.lab2, fleet.token2)  # back online: the next outage is announced again
    sender.look_for_offline_shards()
    Shard.objects.filter(id=fleet.lab2.id).update(last_heartbeat=timezone.now() - timedelta(hours=1))
    drain()
    assert sorted(b["event"] for b in r.delivered()) == ["job.ended", "shard.offline", "shard.offline"]


def test_filters_by_label_and_owner(fleet_committed, heartbeat, fast, receivers):
    fleet = fleet_committed
    mine, other_label, other_owner = receivers(), receivers(), receivers()
    subscribe(mine.url, events=["job.ended"], label="board:a", owner="ana")
    subscribe(other_label.url, events=["job.ended"], label="board:b")
    subscribe(other_owner.url, events=["job.ended"], owner="bob")
    job_ended(fleet, heartbeat)
    drain()
    assert [b["event"] for b in mine.delivered()] == ["job.ended"]
    assert other_label.got == [] and other_owner.got == []


def test_a_receiver_failing_then_timing_out_then_down_gets_every_event_in_order_with_one_id_each(
    transactional_db, fast, receivers
):
    r = receivers([500, hang(3.0), 500])
    sub = subscribe(r.url, events=["host.missing"])
    port = r.server.server_address[1]
    for i in range(5):
        events.emit([events.Event("host.missing", {"n": i})])
    drain(timeout=20)
    # Down for a while: nothing listens on the port; then up again on the same port.
    r.close()
    for i in range(5, 8):
        events.emit([events.Event("host.missing", {"n": i})])
    s = sender.Sender()

    def refused_twice() -> Delivery | None:
        """The first pending delivery once it was refused twice: passes until then, not for a fixed
        second, which a loaded machine may fill with a single attempt."""
        s.step()
        s.wait_busy(1.0)
        first = Delivery.objects.filter(subscription=sub, status="pending").order_by("id").first()
        return first if first is not None and first.attempts >= 2 else None

    failed = wait_until(refused_twice, timeout=20, interval=0.05, what="a delivery refused twice")
    s.close()
    assert "ConnectionRefused" in failed.error
    up = receivers_on(port)
    try:
        drain(timeout=20)
        bodies = r.delivered() + up.delivered()
    finally:
        up.close()
    delivered = [b for b in bodies if b["data"]["n"] is not None]
    ids_by_n: dict[int, set[str]] = {}
    for b in delivered:
        ids_by_n.setdefault(b["data"]["n"], set()).add(b["delivery"])
    assert all(len(ids) == 1 for ids in ids_by_n.values()), ids_by_n
    final = [json.loads(g["body"])["data"]["n"] for g in up.got]
    firsts = []
    for n in [json.loads(g["body"])["data"]["n"] for g in r.got] + final:
        if not firsts or firsts[-1] != n:
            firsts.append(n)
    assert firsts == sorted(set(firsts)) == list(range(8)), firsts
    assert set(Delivery.objects.filter(subscription=sub).values_list("status", flat=True)) == {"delivered"}


def receivers_on(port: int) -> Receiver:
    """A receiver on a given port (the one a down receiver had)."""
    import http.server

    rcv = Receiver()
    rcv.server.shutdown()
    rcv.server.server_close()
    handler = rcv.server.RequestHandlerClass
    rcv.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    rcv.server.daemon_threads = True
    rcv.thread = threading.Thread(target=rcv.server.serve_forever, daemon=True)
    rcv.thread.start()
    return rcv


def test_a_delivery_given_up_after_the_window_is_failed_and_the_next_goes(transactional_db, fast, receivers):
    fast.FLEETSHARD_NOTIFY_GIVE_UP_S = 1.0  # several tries (0.05 s, doubling to 0.2 s) even on a busy machine
    r = receivers(default=500)
    sub = subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": 0})])
    drain(timeout=5)
    d = Delivery.objects.get(subscription=sub)
    assert d.status == "failed" and d.error == "HTTP 500" and d.response_body == "ok" and d.attempts >= 2


def test_email_goes_through_djangos_mail(fleet_committed, heartbeat, fast, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    subscribe(email="ana@example.org", events=["job.ended"])
    job = job_ended(fleet_committed, heartbeat)
    drain()
    (message,) = mail.outbox
    assert message.to == ["ana@example.org"]
    assert f"Job {job.id} (smoke) of ana ended Completed" in message.subject
    assert '"event": "job.ended"' in message.body


def test_slack_format_is_a_message(fleet_committed, heartbeat, fast, receivers):
    r = receivers()
    subscribe(r.url, events=["job.ended"], format="slack")
    job = job_ended(fleet_committed, heartbeat)
    drain()
    assert r.delivered() == [{"text": f"Job {job.id} (smoke) of ana ended Completed"}]


def test_a_master_killed_before_sending_delivers_after_restart(transactional_db, fast, receivers):
    """The event is in the database once its cause committed: a sender started later (the restarted
    master's) delivers it. (The process kill itself is in bench/notify.py's restart run.)"""
    r = receivers()
    subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": 1})])
    s = sender.Sender()
    s.step()  # fanned out, maybe in flight: then the master dies
    s.close()
    drain()
    assert [b["data"]["n"] for b in r.delivered()] == [1]


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="two senders at once need PostgreSQL's advisory lock")
def test_two_senders_never_deliver_one_event_twice_at_once(transactional_db, fast, receivers):
    r = receivers()
    subscribe(r.url, events=["host.missing"])
    for i in range(50):
        events.emit([events.Event("host.missing", {"n": i})])
    a, b = sender.Sender(), sender.Sender()
    assert a.lock.acquire() and not b.lock.acquire()
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,)) for s in (a, b)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(r.got) >= 50, timeout=20, interval=0.1, what="50 deliveries")
    finally:
        stop.set()
    for t in threads:
        t.join(10)
    ns = [b["data"]["n"] for b in r.delivered()]
    assert ns == list(range(50))


def test_refused_addresses_are_recorded_and_never_connected(transactional_db, settings, receivers):
    settings.FLEETSHARD_NOTIFY_ALLOW_PRIVATE = False
    settings.FLEETSHARD_NOTIFY_BACKOFF_S = 60
    r = receivers()
    subs = [
        subscribe("http://127.0.0.1:9/x", events=["host.missing"]),
        subscribe("http://169.254.169.254/latest/meta-data/", events=["host.missing"]),
        subscribe("http://localhost:9/x", events=["host.missing"]),
        subscribe(r.url, events=["host.missing"]),
    ]
    events.emit([events.Event("host.missing", {"n": 1})])
    drain(timeout=1)
    errors = {d.subscription_id: d.error for d in Delivery.objects.all()}
    assert "127.0.0.1 is a loopback address" in errors[subs[0].id]
    assert "169.254.169.254 is a link-local" in errors[subs[1].id]
    assert "localhost resolves to" in errors[subs[2].id] and "loopback address" in errors[subs[2].id]
    assert "loopback" in errors[subs[3].id] and r.got == []
    assert Delivery.objects.filter(response_status__isnull=False).count() == 0


def test_link_local_is_refused_even_when_private_addresses_are_allowed(transactional_db, fast):
    fast.FLEETSHARD_NOTIFY_BACKOFF_S = 60
    sub = subscribe("http://169.254.169.254/latest/meta-data/", events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": 1})])
    drain(timeout=1)
    assert "169.254.169.254 is a link-local" in Delivery.objects.get(subscription=sub).error


def test_a_redirect_to_a_private_address_is_not_followed(transactional_db, fast, receivers):
    target = receivers()
    r = receivers(default=redirect("http://169.254.169.254/latest/meta-data/"))
    sub = subscribe(r.url, events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": 1})])
    fast.FLEETSHARD_NOTIFY_BACKOFF_S = 60
    drain(timeout=1)
    d = Delivery.objects.get(subscription=sub)
    assert d.status == "pending" and d.response_status == 302
    assert "redirect refused" in d.error and "169.254.169.254" in d.error
    assert target.got == []


def test_a_gigabyte_answer_is_cut_at_a_kibibyte_and_a_slow_receiver_holds_up_only_itself(
    transactional_db, fast, receivers
):
    sent: list[int] = []
    big = receivers(default=flood(1 << 30, sent))
    slow = receivers(default=hang(5.0))
    quick = receivers()
    named = (("big", big), ("slow", slow), ("quick", quick))
    subs = {name: subscribe(r.url, events=["host.missing"]) for name, r in named}
    events.emit([events.Event("host.missing", {"n": 1})])
    started = time.monotonic()
    s = sender.Sender()
    try:
        s.step()
        wait_until(lambda: quick.got, timeout=5, interval=0.01, what="the quick receiver's delivery")
        quick_after = time.monotonic() - started
        s.wait_busy(5)
    finally:
        s.close()
    assert quick.got and quick_after < 1.0, quick_after
    d = Delivery.objects.get(subscription=subs["big"])
    assert d.status == "delivered" and len(d.response_body) == 1024 and set(d.response_body) == {"x"}
    assert sent and sent[0] < 1 << 28, sent  # the receiver was cut off long before its gigabyte
    slow_d = Delivery.objects.get(subscription=subs["slow"])
    assert slow_d.status == "pending" and "no complete answer within 1 s" in slow_d.error


def test_subscriptions_are_audited_and_the_secret_is_long(transactional_db):
    sub = subscribe("https://hooks.example.org/x", events=["job.ended"], label="board:a")
    assert len(sub.secret) == 64
    notify.remove_subscription(sub.id, acting_user=None)
    assert list(AuditRecord.objects.order_by("id").values_list("action", flat=True)) == [
        "notification.add",
        "notification.remove",
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"url": "ftp://x.example.org/"}, "must be http or https"),
        ({"url": "http://u:p@x.example.org/"}, "user name or password"),
        ({"url": "https://x.example.org/", "email": "a@b.org"}, "either a webhook url or an email"),
        ({"email": "not-an-address"}, "invalid email address"),
        ({"email": "ana@localhost"}, "needs a mail domain, not 'localhost'"),
        ({"email": "ana@LocalHost"}, "needs a mail domain, not 'localhost'"),
        ({"email": "ana@db.localhost"}, "not 'db.localhost'"),
        ({"email": "ana@[127.0.0.1]"}, r"not '\[127.0.0.1\]' \(no localhost, no address in brackets\)"),
        ({"email": "ana@mailhost"}, "invalid email address 'ana@mailhost'"),
        ({"url": "https://x.example.org/", "events": ["job.started"]}, "unknown event 'job.started'"),
        ({"url": "https://x.example.org/", "events": []}, "at least one event"),
        ({"url": "https://x.example.org/", "label": "a\x00"}, "NUL"),
    ],
)
def test_bad_subscriptions_are_refused_naming_what_is_wrong(transactional_db, kwargs, message):
    from common.errors import FleetshardError

    kwargs.setdefault("events", ["job.ended"])
    with pytest.raises(FleetshardError, match=message):
        notify.add_subscription(notify.NewSubscription(**kwargs), acting_user=None)
    assert not Subscription.objects.exists() and not AuditRecord.objects.exists()


def test_no_event_is_written_when_nothing_happens(fleet_committed, heartbeat):
    heartbeat(fleet_committed.lab1, fleet_committed.token1)
    assert not NotificationEvent.objects.exists()
    assert connection.vendor in ("postgresql", "sqlite")
    assert services is not None
