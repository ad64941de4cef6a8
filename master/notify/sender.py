"""The sender: fans the outbox out into deliveries and delivers them (docs/notifications.md).

One sender works at a time across all masters: it holds a lock for as long as it runs (PostgreSQL: a
session advisory lock on a connection of its own, released by the server if the master dies; SQLite,
one machine: an exclusive lock on a file in the data directory). The others wait for the lock.

Each subscription's deliveries go oldest first, one at a time: a delivery that fails is retried with
backoff (doubling from FLEETSHARD_NOTIFY_BACKOFF_S, at most FLEETSHARD_NOTIFY_BACKOFF_MAX_S) and holds
the ones behind it until it succeeds or, FLEETSHARD_NOTIFY_GIVE_UP_S (24 h) after the event, is given up
(`failed`). Subscriptions are served by a pool of threads, one subscription per thread at a time, so a
slow or dead receiver holds only its own subscription: the others wait at most for a free thread.
Each subscription keeps its connection to its receiver alive between deliveries (webhook.Connection).

Fan-out is one INSERT ... SELECT per batch of events, matching subscriptions in SQL, so an event
costs no Python per subscription; a subscription whose creator is inactive gets nothing.

The sender also finds shards that went offline: no heartbeat for three intervals (the shard list's
`offline`), looked for on every pass. Each outage is announced once (ShardOfflineNotice).
"""

import contextlib
import fcntl
import logging
import queue
import random
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import close_old_connections, connection, connections, transaction
from django.db.models import F, Min, Q
from django.utils import timezone

from common.models import Shard, offline_after_s
from master.notify import events, formats, webhook
from master.notify.models import Delivery, DeliveryStatus, NotificationEvent, ShardOfflineNotice, Subscription

log = logging.getLogger(__name__)

LOCK_KEY = 0x6E6F74696679  # "notify"
FAN_OUT_BATCH = 1000
# At most about this many deliveries made per fan-out transaction: fewer events when there are many
# subscriptions.
FAN_OUT_DELIVERIES = 200_000
# How many deliveries of one subscription a thread sends before it lets the others have a turn.
SLICE = 500
FETCH = 100
# A retry due within this many seconds keeps its thread (the subscription can do nothing else meanwhile).
INLINE_RETRY_S = 1.0


def _setting(name: str, default: Any) -> Any:
    value: Any = getattr(settings, name, default)
    return value


def allow_private() -> bool:
    return bool(_setting("FLEETSHARD_NOTIFY_ALLOW_PRIVATE", False))


def backoff_s(attempts: int) -> float:
    """The wait before attempt `attempts + 1`: doubling, capped, with a tenth of jitter."""
    base = float(_setting("FLEETSHARD_NOTIFY_BACKOFF_S", 10.0))
    cap = float(_setting("FLEETSHARD_NOTIFY_BACKOFF_MAX_S", 3600.0))
    wait = min(cap, base * 2 ** min(max(attempts - 1, 0), 30))
    return float(wait * (1 + 0.1 * random.random()))


class SenderLock:
    """The one-sender-at-a-time lock; `held()` says whether this process still holds it."""

    def __init__(self) -> None:
        self._conn: Any = None
        self._waiting: Any = None
        self._file: TextIO | None = None

    def acquire(self) -> bool:
        if self.held():
            return True
        if connection.vendor == "postgresql":
            # One connection kept for trying, so a master waiting for the lock does not connect anew each time.
            if self._waiting is None:
                wrapper = connections.create_connection("default")
                self._waiting = wrapper.get_new_connection(wrapper.get_connection_params())
                self._waiting.autocommit = True
            try:
                with self._waiting.cursor() as cur:
                    cur.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY])
                    got = bool(cur.fetchone()[0])
            except Exception:
                self._waiting.close()
                self._waiting = None
                raise
            if got:
                self._conn, self._waiting = self._waiting, None
            return got
        path = Path(settings.DATA_DIR) / "notify-sender.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115  # kept open as long as the lock is held
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        self._file = handle
        return True

    def held(self) -> bool:
        if self._file is not None:
            return True
        if self._conn is None:
            return False
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT 1")
            return True
        except Exception:
            self.release()
            return False

    def release(self) -> None:
        if self._waiting is not None:
            with contextlib.suppress(Exception):
                self._waiting.close()
            self._waiting = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        if self._file is not None:
            self._file.close()
            self._file = None


def _fan_out_sql(vendor: str, events: int) -> str:
    """INSERT ... SELECT of one pending delivery per event among `events` ids and matching subscription
    (its event, its label among the event's, its owner the event's; created by now; its creator, if any,
    active), in the events' order: a subscription's deliveries are sent by id, and both databases number
    the rows as the SELECT orders them (tests/master/notify/test_fan_out.py holds them to it)."""
    d, e, s = Delivery._meta.db_table, NotificationEvent._meta.db_table, Subscription._meta.db_table
    user = User._meta.db_table
    if vendor == "postgresql":
        uuid = "gen_random_uuid()"
        kind = "s.events @> jsonb_build_array(e.kind)"
        label = "e.labels @> jsonb_build_array(s.label)"
    else:
        # SQLite keeps a UUID as 32 hex digits; this one is random, shaped as version 4.
        uuid = (
            "lower(hex(randomblob(6))) || '4' || substr(lower(hex(randomblob(2))), 2) "
            "|| substr('89ab', 1 + (random() & 3), 1) || substr(lower(hex(randomblob(2))), 2) "
            "|| lower(hex(randomblob(6)))"
        )
        kind = "EXISTS (SELECT 1 FROM json_each(s.events) AS k WHERE k.value = e.kind)"
        label = "EXISTS (SELECT 1 FROM json_each(e.labels) AS l WHERE l.value = s.label)"
    ids = ", ".join(["%s"] * events)
    return (
        f"INSERT INTO {d} (uuid, subscription_id, event_id, status, attempts, next_attempt_on, created_on, "
        "response_body, error) "
        f"SELECT {uuid}, s.id, e.id, 'pending', 0, %s, e.created_on, '', '' FROM {e} AS e, {s} AS s "
        f"WHERE e.id IN ({ids}) AND s.created_on <= %s AND {kind} AND (s.label = '' OR {label}) "
        "AND (s.owner = '' OR s.owner = e.owner) "
        "AND (s.created_by_id IS NULL OR EXISTS "
        f"(SELECT 1 FROM {user} AS u WHERE u.id = s.created_by_id AND u.is_active)) "
        "ORDER BY e.id, s.id"
    )


def fan_out(now: datetime | None = None, limit: int = FAN_OUT_BATCH) -> int:
    """Makes the deliveries of up to `limit` outbox events, fewer when there are many subscriptions
    (at most about FAN_OUT_DELIVERIES deliveries per transaction), in one INSERT ... SELECT; returns how
    many events it read."""
    now = now or timezone.now()
    with transaction.atomic():
        subs = Subscription.objects.count()
        limit = max(1, min(limit, FAN_OUT_DELIVERIES // max(1, subs)))
        ids = list(
            NotificationEvent.objects.select_for_update(skip_locked=True)
            .filter(fanned_out=False)
            .order_by("id")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return 0
        at = connection.ops.adapt_datetimefield_value(now)
        with connection.cursor() as cursor:
            cursor.execute(_fan_out_sql(connection.vendor, len(ids)), [at, *ids, at])
        NotificationEvent.objects.filter(id__in=ids).update(fanned_out=True)
    return len(ids)


@transaction.atomic
def look_for_offline_shards(now: datetime | None = None) -> int:
    """Announces each shard silent for three intervals once per outage; returns how many it announced."""
    now = now or timezone.now()
    silence = offline_after_s()
    cutoff = now - timedelta(seconds=silence)
    ShardOfflineNotice.objects.filter(shard__last_heartbeat__gt=cutoff).delete()
    silent = (
        Shard.objects.filter(last_heartbeat__lte=cutoff, offline_notice__isnull=True)
        .prefetch_related("labels")
        .order_by("id")
    )
    count = 0
    for shard in silent:
        assert shard.last_heartbeat is not None
        ShardOfflineNotice.objects.create(shard=shard, since=now)
        events.shard_offline(shard, (now - shard.last_heartbeat).total_seconds(), now)
        count += 1
    return count


def attempt(delivery: Delivery, kept: webhook.Connection | None = None) -> webhook.Outcome:
    """One try of one delivery, on the subscription's `kept` connection if given; records nothing."""
    sub = delivery.subscription
    timeout = float(_setting("FLEETSHARD_NOTIFY_TIMEOUT_S", webhook.TIMEOUT_S))
    if sub.email:
        subject, text = formats.email(delivery)
        try:
            send_mail(subject, text, None, [sub.email], fail_silently=False)
        except Exception as exc:
            return webhook.Outcome(False, error=f"email: {type(exc).__name__}: {exc}"[:500])
        return webhook.Outcome(True)
    data = formats.body(delivery, sub.format)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "fleetshard-notify/1",
        "X-Fleetshard-Event": delivery.event.kind,
        "X-Fleetshard-Delivery": str(delivery.uuid),
        "X-Fleetshard-Signature": formats.signature(sub.secret, data),
    }
    return webhook.post(sub.url, data, headers, allow_private=allow_private(), timeout_s=timeout, connection=kept)


def _storable(text: str) -> str:
    """The receiver's words (an error can quote its status line) without NUL or lone surrogates,
    which PostgreSQL refuses: an unwritable outcome would leave the delivery due and retried at once, forever."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def _apply(delivery: Delivery, outcome: webhook.Outcome, now: datetime) -> None:
    """The attempt's outcome on `delivery` in memory: delivered, retried later, or given up."""
    give_up = float(_setting("FLEETSHARD_NOTIFY_GIVE_UP_S", 86400.0))
    delivery.attempts += 1
    delivery.response_status = outcome.status
    delivery.response_body = _storable(outcome.body[: webhook.RESPONSE_KEPT])
    delivery.error = _storable(outcome.error[:1000])
    if outcome.ok:
        delivery.status, delivery.finished_on = DeliveryStatus.DELIVERED, now
    else:
        retry_on = now + timedelta(seconds=backoff_s(delivery.attempts))
        if retry_on > delivery.created_on + timedelta(seconds=give_up):
            delivery.status, delivery.finished_on = DeliveryStatus.FAILED, now
        else:
            delivery.next_attempt_on = retry_on


_RECORDED = ("attempts", "response_status", "response_body", "error", "status", "next_attempt_on", "finished_on")


def _write_failure(delivery: Delivery) -> None:
    """A failed attempt, written at once (when to retry, or that it was given up)."""
    changes = {f: getattr(delivery, f) for f in _RECORDED}
    Delivery.objects.filter(id=delivery.id, status=DeliveryStatus.PENDING).update(**changes)


def _write_delivered(deliveries: list[Delivery]) -> None:
    """Deliveries delivered since their failures (if any) were written: those the receiver answered
    alike (the usual run of `200 ok`s) in one UPDATE, finished when the last of them was, so a busy
    subscription costs one commit per batch. Only to deliveries still pending: one removed or given up
    meanwhile stays as it is."""
    groups: dict[tuple[int | None, str], list[Delivery]] = {}
    for d in deliveries:
        groups.setdefault((d.response_status, d.response_body), []).append(d)
    for (status, body), group in groups.items():
        Delivery.objects.filter(id__in=[d.id for d in group], status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.DELIVERED,
            finished_on=group[-1].finished_on,
            attempts=F("attempts") + 1,  # this one; the failed ones before it were written as they failed
            response_status=status,
            response_body=body,
            error="",
        )


def send_subscription(subscription_id: int, still_held: Any = None, kept: webhook.Connection | None = None) -> int:
    """Sends the due deliveries of one subscription, oldest first (on its `kept` connection, if given),
    until one fails for longer than a moment or SLICE were attempted; returns how many attempts it made.

    Successes are written once per fetched batch (a failure at once): a master that dies in between
    sends those again, with the same delivery ids."""
    done = 0
    while done < SLICE:
        batch = list(
            Delivery.objects.filter(subscription_id=subscription_id, status=DeliveryStatus.PENDING)
            .select_related("event", "subscription")
            .order_by("id")[:FETCH]
        )
        if not batch:
            break
        delivered: list[Delivery] = []
        try:
            for head in batch:
                while True:
                    if still_held is not None and not still_held():
                        return done
                    if head.next_attempt_on > timezone.now() or done >= SLICE:
                        return done
                    try:
                        outcome = attempt(head, kept)
                    except Exception as exc:  # an attempt that cannot be made is a failed one, retried later
                        log.exception("notification delivery %s could not be attempted", head.uuid)
                        outcome = webhook.Outcome(False, error=f"cannot send: {type(exc).__name__}: {exc}"[:500])
                    _apply(head, outcome, timezone.now())
                    done += 1
                    if outcome.ok:
                        delivered.append(head)
                        break
                    _write_delivered(delivered)
                    _write_failure(head)
                    delivered = []
                    if head.status != DeliveryStatus.PENDING:
                        break
                    # By id: a webhook's URL is often its credential (Slack's are), not for the log.
                    sub_id = head.subscription_id
                    log.info("notification delivery %s to subscription %s failed: %s", head.uuid, sub_id, outcome.error)
                    wait = (head.next_attempt_on - timezone.now()).total_seconds()
                    if wait > INLINE_RETRY_S:
                        return done
                    # A retry due within a moment is waited for here: handed back, it would wait for the next pass.
                    time.sleep(max(0.0, wait))
        finally:
            _write_delivered(delivered)
    return done


def due_subscriptions(now: datetime | None = None) -> list[int]:
    """Subscriptions whose oldest pending delivery is due (and whose creator, if any, is active)."""
    now = now or timezone.now()
    heads = (
        Delivery.objects.filter(status=DeliveryStatus.PENDING)
        .values("subscription_id")
        .annotate(head=Min("id"))
        .order_by()
        .values_list("head", flat=True)
    )
    active = Q(subscription__created_by__isnull=True) | Q(subscription__created_by__is_active=True)
    return sorted(
        Delivery.objects.filter(active, id__in=list(heads), next_attempt_on__lte=now).values_list(
            "subscription_id", flat=True
        )
    )


class Sender:
    """The sender's passes: `step` once (the thread in `serve`, `manage.py send_notifications`), or
    `drain` until nothing is due (tests). Its threads each keep their database connection; each
    subscription keeps its receiver's connection (closed once idle for webhook.IDLE_S)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or int(_setting("FLEETSHARD_NOTIFY_WORKERS", 8))
        self.busy: set[int] = set()  # subscriptions handed to a thread and not finished yet
        self.lock = SenderLock()
        self.kept: dict[int, webhook.Connection] = {}
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Condition()
        self._wake = threading.Event()  # a thread finished: the next pass need not wait for the poll
        self._checked = 0.0
        self._closing = threading.Event()

    def _worker(self) -> None:
        try:
            while (subscription_id := self._queue.get()) is not None:
                attempts = 0
                try:
                    attempts = self._work(subscription_id)
                finally:
                    with self._idle:
                        self.busy.discard(subscription_id)
                        self._idle.notify_all()
                    if attempts:  # more may be due at once; a turn that could do nothing waits for the poll
                        self._wake.set()
        finally:
            connection.close()

    def _work(self, subscription_id: int) -> int:
        close_old_connections()
        try:
            return send_subscription(subscription_id, self._still_held, self.kept[subscription_id])
        except Exception:
            log.exception("sending the notifications of subscription %s failed", subscription_id)
            connection.close()
            return 0

    def _still_held(self) -> bool:
        return not self._closing.is_set() and (self.lock._file is not None or self.lock._conn is not None)

    def step(self) -> int:
        """One pass under the lock: offline shards, fan-out, and the due subscriptions handed to free
        threads. Returns how many subscriptions it started (0 without the lock)."""
        if not self.lock.acquire():
            return 0
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._worker, name=f"notify-send-{i}", daemon=True) for i in range(self.workers)
            ]
            for thread in self._threads:
                thread.start()
        if time.monotonic() - self._checked >= 1.0:
            look_for_offline_shards()
            self._checked = time.monotonic()
            self._close_idle()
        started_fan_out = time.monotonic()
        while fan_out() and time.monotonic() - started_fan_out < 1.0:
            pass
        started = 0
        for sub_id in due_subscriptions():
            with self._idle:
                if sub_id in self.busy or len(self.busy) >= self.workers:
                    continue
                self.busy.add(sub_id)
            self.kept.setdefault(sub_id, webhook.Connection())
            self._queue.put(sub_id)
            started += 1
        return started

    def _close_idle(self) -> None:
        """Closes the receivers' connections no subscription used for webhook.IDLE_S."""
        with self._idle:
            idle = [k for k, c in self.kept.items() if k not in self.busy and c.idle_s() >= webhook.IDLE_S]
        for sub_id in idle:
            self.kept.pop(sub_id).close()

    def wait_busy(self, timeout: float) -> None:
        with self._idle:
            self._idle.wait_for(lambda: not self.busy, timeout)

    def drain(self, timeout: float = 30.0) -> None:
        """Passes until every delivery is delivered or given up and no thread is busy, or `timeout`
        passed (`send_notifications --once`, tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            started = self.step()
            self.wait_busy(deadline - time.monotonic())
            if not self.busy and not _unfanned():
                if not Delivery.objects.filter(status=DeliveryStatus.PENDING).exists():
                    return
                if not started:
                    time.sleep(0.02)

    def run(self, stop: threading.Event) -> None:
        """Until `stop` is set: a pass every FLEETSHARD_NOTIFY_POLL_S while holding the lock, and at once
        when a thread finished its turn; without the lock, a try for it every few seconds."""
        poll = float(_setting("FLEETSHARD_NOTIFY_POLL_S", 0.25))
        while not stop.is_set():
            close_old_connections()
            self._wake.clear()
            try:
                held = self.step() >= 0 and self._still_held()
            except Exception:
                log.exception("notification sender: a pass failed; trying again")
                connection.close()
                held = self._still_held()
            if held:
                self._wake.wait(poll)
            else:
                stop.wait(max(poll, 2.0))
        self.close()

    def close(self) -> None:
        """Stops the threads after their attempt in flight (one retrying inline would otherwise go on
        for up to SLICE attempts), closes the receivers' connections, then lets go of the lock."""
        self._closing.set()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        for kept in self.kept.values():
            kept.close()
        self.kept.clear()
        self.lock.release()
        connection.close()


def _unfanned() -> bool:
    return NotificationEvent.objects.filter(fanned_out=False).exists()


def start_sender_thread() -> tuple[threading.Thread, threading.Event]:
    """Starts the sender in a daemon thread (`serve` does, in each worker: one of them holds the lock)."""
    stop = threading.Event()
    sender = Sender()
    thread = threading.Thread(target=sender.run, args=(stop,), name="notify-sender", daemon=True)
    thread.start()
    return thread, stop


def oldest_undelivered_s(now: datetime | None = None) -> float:
    """The age of the oldest event not yet delivered (pending fan-out or delivery), 0 when none."""
    now = now or timezone.now()
    oldest = [
        NotificationEvent.objects.filter(fanned_out=False).aggregate(t=Min("created_on"))["t"],
        Delivery.objects.filter(Q(status=DeliveryStatus.PENDING)).aggregate(t=Min("created_on"))["t"],
    ]
    known = [t for t in oldest if t is not None]
    return max(0.0, (now - min(known)).total_seconds()) if known else 0.0
