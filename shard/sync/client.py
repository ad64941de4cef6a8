"""The shard's heartbeat client: send what the shard knows and has done, apply what the master answers.

Between heartbeats a second thread long-polls the master (docs/protocol.md, "Waiting for news"); news
for this shard, or a run that started or ended here (`nudge`), cuts the wait short, so the master's
changes reach the shard and the shard's reach the master in well under a second, not an interval.
"""

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ReadTimeoutError
from urllib3.util.retry import Retry

from common.constants import CLIENT_VERSION, MAX_UPDATES_PER_HEARTBEAT, PROTOCOL_VERSION
from common.loop import Backoff, run_until_stopped
from common.network import request_failure
from common.wire import ID_MAX, HeartbeatResponse, WireError
from shard.outbox import committed_seq, outbox_depth, pending, pending_host_events
from shard.sync.discovery import discovery_request, note_ack
from shard.sync.ingest import IngestResult, apply_response, known_hosts, known_jobs
from shard.sync.instance import ensure_instance, renew_instance

log = logging.getLogger(__name__)

# A failed heartbeat is retried within this long (common/loop.py: jittered, so shards that failed
# together do not return together): a master back from a restart hears from every shard within it.
MAX_BACKOFF_S = 5.0
MIN_INTERVAL_S = 0.1
# A burst of changes (runs starting or ending together, news) makes one heartbeat: after the first
# the client waits this long, and heartbeats woken early are at least MIN_NUDGED_GAP_S apart.
COALESCE_S = 0.05
MIN_NUDGED_GAP_S = 0.25
# How long the master holds a wait; the read timeout allows for it.
WAIT_S = 30.0
# The shortest round of the long-poll loop without news.
MIN_WAIT_CYCLE_S = 1.0
# How often the loops look at their stop event while nothing wakes them.
STOP_CHECK_S = 0.5


class HeartbeatFailed(Exception):
    """This heartbeat did not go through; the next one repeats it."""


class ProtocolRefused(HeartbeatFailed):
    """The master does not speak this client's protocol: retrying cannot help."""


class InstanceRefused(ProtocolRefused):
    """Another instance of this shard (another database with the same token) is live: run nothing."""


class TokenRefused(ProtocolRefused):
    """The master refused this shard's token (401: unknown or revoked; 403: a personal token, or another
    shard's): no retry makes it valid, so the shard or worker manager exits with the reason, where it
    used to retry for ever. A ProtocolRefused, so every loop that lets that through lets this through."""


def jittered(interval: float) -> float:
    return interval * random.uniform(0.9, 1.1)


class MasterUnavailable(Exception):
    """The master cannot take this request now (unreachable, a 5xx, the token refused): what it
    carried stays on the shard for a later pass."""


class RecordFailed(MasterUnavailable):
    """The master answered but failed on, or cannot take yet, this one record (a 500, a 409): the
    record waits its own backoff (shard/uploads/record_tries.py) and the others go on."""


class RecordTimedOut(RecordFailed):
    """The master took the record but gave no answer within the read timeout: slow on this one (a
    large file on a busy master), so it waits its own backoff like a 500. Two in a row, with no answer
    between, are the master's (ReadTimeouts.check): an outage."""


class ReadTimeouts:
    """A sender's record timeouts in a row: the first is the record's, a second with no answer
    between is the master's (hung, its database locked), which stops the pass as any outage does."""

    def __init__(self) -> None:
        self.last: RecordTimedOut | None = None

    def check(self, post: Callable[[], requests.Response]) -> requests.Response:
        try:
            resp = post()
        except RecordTimedOut as exc:
            if self.last is not None:
                self.last = None
                raise MasterUnavailable(f"{exc} (and on the record before it)") from exc
            self.last = exc
            raise
        self.last = None
        return resp


# Answers that say the master (or the proxy before it) is down, not that this record is wrong.
OUTAGE_CODES = frozenset({401, 502, 503, 504})


def unavailable(code: int, message: str) -> MasterUnavailable:
    """The error for an answer no rule took: an outage for all records, or a failure of this one."""
    return (MasterUnavailable if code in OUTAGE_CODES else RecordFailed)(message)


def post_bytes(
    session: requests.Session, url: str, params: dict[str, Any], data: bytes, timeout: tuple[float, float]
) -> requests.Response:
    """POSTs `data` as an octet stream (a result file, a job trace, a log chunk); MasterUnavailable
    when no answer came back, RecordTimedOut when the master took it but did not answer in time."""
    try:
        return session.post(
            url, params=params, data=data, headers={"Content-Type": "application/octet-stream"}, timeout=timeout
        )
    except requests.RequestException as exc:
        if _read_timed_out(exc):
            raise RecordTimedOut(f"the master did not answer within {timeout[1]:g} s") from exc
        raise MasterUnavailable(f"cannot reach the master: {request_failure(exc)}") from exc


def _read_timed_out(exc: requests.RequestException) -> bool:
    """Whether the request was sent and its answer did not come in time (the session's Retry, with no
    read retries, reports that as a ConnectionError around urllib3's ReadTimeoutError)."""
    if isinstance(exc, requests.ReadTimeout):
        return True
    cause = exc.args[0] if exc.args else None
    return isinstance(getattr(cause, "reason", None), ReadTimeoutError)


def master_session(token: str) -> requests.Session:
    """A session speaking to the master as this shard; one per thread (a session is not thread-safe)."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    # Only failed connects are retried here: the request never reached the master. Anything
    # else is retried by the caller's loop, which is safe because every shard request is idempotent.
    retry = Retry(total=2, connect=2, read=0, status=0, other=0, backoff_factor=0.2, allowed_methods=None)
    session.mount("http://", HTTPAdapter(max_retries=retry))
    session.mount("https://", HTTPAdapter(max_retries=retry))
    return session


class HeartbeatClient:
    def __init__(self, master_url: str, shard_hostname: str, token: str, timeout_s: float | None = None) -> None:
        if not master_url or not shard_hostname or not token:
            raise ValueError("the master URL, the shard's hostname and its token are all required")
        self.url = master_url.rstrip("/") + "/api/v1/heartbeat"
        self.shard_hostname = shard_hostname
        self.timeout = (5.0, timeout_s or settings.FLEETSHARD_REQUEST_TIMEOUT_S)
        self.interval = settings.FLEETSHARD_HEARTBEAT_INTERVAL_S
        self.instance: str | None = None
        # Set once the master has accepted this shard database's instance: until then the shard
        # touches no run, process or host (docs/protocol.md, "Shard instances").
        self.accepted = threading.Event()
        self.master_url = master_url.rstrip("/")
        self.token = token
        self.session = master_session(token)
        # Heartbeats that did not go through since this process started (the shard's /metrics).
        self.failures_total = 0
        # When (monotonic) a heartbeat was last answered and applied: the master works.
        self.last_ok: float | None = None
        self.wait_url = self.url + "/wait"
        # Set to heartbeat now: news from the master, or a run that started or ended here.
        self.nudge = threading.Event()
        # When the last heartbeat was sent (monotonic), and how many were: the long-poll says how
        # long ago, and waits for the next heartbeat after news before it asks again.
        self._beat = threading.Condition()
        self._last_sent: float | None = None
        self._beats = 0
        self._watcher: threading.Thread | None = None
        # Why the last long-poll found no master to hold it (logged once per fallback, not per try).
        self.wait_refused = ""
        # Run before each request by the process holding the heartbeat (shard.run.workers folds the live
        # elastic workers' hosts into the discovered set); set by the commands that run a shard.
        self.before_request: Callable[[], object] | None = None

    def build_request(self) -> dict[str, Any]:
        if self.before_request is not None:
            self.before_request()
        if self.instance is None:
            self.instance = ensure_instance()
        # Events only up to a seq read before the updates: a job's end and its host's Cleaning committed
        # between the two reads would send the event without the update, and the master, seeing the run
        # still open, would drop the Cleaning for good.
        committed = committed_seq()
        updates = pending(MAX_UPDATES_PER_HEARTBEAT)
        cut = committed + 1
        if len(updates) == MAX_UPDATES_PER_HEARTBEAT:
            cut = min(cut, updates[-1]["seq"])
        return {
            "protocol": PROTOCOL_VERSION,
            "shard": self.shard_hostname,
            "instance": self.instance,
            "client_version": CLIENT_VERSION,
            "known_hosts": known_hosts(),
            "known_jobs": known_jobs(),
            "updates": updates,
            "host_events": pending_host_events(MAX_UPDATES_PER_HEARTBEAT, before=cut),
            "outbox_depth": outbox_depth(),
            # At least every seq sent, so a body sent again as it was never looks like a rollback.
            "last_seq": max([committed, *(u["seq"] for u in updates)]),
            **discovery_request(),
        }

    def exchange(self, body: dict[str, Any]) -> HeartbeatResponse:
        with self._beat:
            self._last_sent = time.monotonic()
        try:
            resp = self.session.post(self.url, json=body, timeout=self.timeout)
        except requests.RequestException as exc:
            raise HeartbeatFailed(f"cannot reach the master at {self.master_url}: {request_failure(exc)}") from exc
        if resp.status_code == 409:
            if field_of(resp) == "instance":
                raise InstanceRefused(f"the master refused this shard database: {error_of(resp)}")
            if field_of(resp) == "last_seq":
                seen = detail_of(resp).get("seq_seen")
                # A master that does not say which seq it saw is taken at its word.
                renewed = renew_instance(body["instance"], seen if type(seen) is int else ID_MAX)
                if renewed is None:
                    raise HeartbeatFailed(
                        f"this heartbeat (last seq {body.get('last_seq')}) was overtaken by a newer one of this shard "
                        f"database, which sent seq {seen}: the next one is built anew"
                    )
                self.instance = renewed
                raise InstanceRefused(
                    f"the master refused this shard database: {error_of(resp)}; it takes the new instance id "
                    f"{self.instance}"
                )
            raise ProtocolRefused(f"the master refused protocol {PROTOCOL_VERSION}: {error_of(resp)}")
        if resp.status_code in (401, 403):
            raise TokenRefused(
                f"the master at {self.master_url} refused this shard's token ({resp.status_code}: {error_of(resp)}): "
                "check FLEETSHARD_SHARD_TOKEN (an administrator makes a new one with "
                f"`fleetshard token create --shard {self.shard_hostname}`)"
            )
        if resp.status_code != 200:
            raise HeartbeatFailed(f"the master at {self.master_url} answered HTTP {resp.status_code}: {error_of(resp)}")
        try:
            response = HeartbeatResponse.parse(resp.json())
        except ValueError as exc:
            raise HeartbeatFailed(f"the master's answer is not JSON: {exc}") from exc
        except (WireError, RecursionError) as exc:
            raise HeartbeatFailed(f"the master's answer is not a protocol 1 heartbeat response: {exc}") from exc
        for problem in response.skipped:
            log.warning("skipped a record of the master's answer: %s", problem)
        return response

    def tick(self) -> tuple[HeartbeatResponse, IngestResult]:
        """One heartbeat: build, send, apply. Nothing is dropped locally unless the answer is applied."""
        body = self.build_request()
        response = self.exchange(body)
        result = apply_response(response, sent_events=[e["seq"] for e in body["host_events"]])
        note_ack(body, response.discovered_ack)
        # A master (or something posing as one) cannot spin the shard in a tight loop.
        self.interval = max(MIN_INTERVAL_S, float(response.heartbeat_interval_s or self.interval))
        self.accepted.set()
        self.last_ok = time.monotonic()
        with self._beat:
            self._beats += 1
            self._beat.notify_all()
        return response, result

    def pause(self, stop: threading.Event, delay: float) -> None:
        """Waits `delay` seconds, or less once nudged; then a short while more so a burst is one heartbeat."""
        deadline = time.monotonic() + delay
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.nudge.wait(min(left, STOP_CHECK_S)):
                self.nudge.clear()
                since = time.monotonic() - (self._last_sent or 0.0)
                stop.wait(max(COALESCE_S, MIN_NUDGED_GAP_S - since))
                self.nudge.clear()
                return

    def wait_for_news(self, session: requests.Session) -> bool | None:
        """One long-poll: True on news, False when the master's wait ended without; None when the master
        cannot hold waits (an older master, a 503): then the interval alone paces the heartbeats, and
        `wait_refused` says why."""
        with self._beat:
            since = None if self._last_sent is None else max(0.0, time.monotonic() - self._last_sent)
        params = {"timeout": f"{WAIT_S:g}"}
        if since is not None:
            params["since"] = f"{since:.3f}"
        try:
            resp = session.get(self.wait_url, params=params, timeout=(5.0, WAIT_S + 15.0))
        except requests.RequestException as exc:
            self.wait_refused = f"cannot reach {self.wait_url}: {request_failure(exc)}"
            return None
        if resp.status_code != 200:
            self.wait_refused = f"the master answered {resp.status_code}: {error_of(resp)}"
            return None
        try:
            news = resp.json().get("news")
        except (ValueError, AttributeError):
            news = None
        if not isinstance(news, bool):
            self.wait_refused = "the master's answer to a wait has no news field"
            return None
        return news

    def watch(self, stop: threading.Event) -> None:
        """Long-polls until `stop`; nudges the heartbeat on news. A master that cannot hold waits is
        asked again only after an interval, so a shard never hammers it."""
        session = master_session(self.token)
        falling_back = False
        try:
            while not stop.is_set():
                with self._beat:
                    beats = self._beats
                asked = time.monotonic()
                news = self.wait_for_news(session)
                if stop.is_set():
                    return
                if falling_back and news is not None:
                    log.info("the master holds long-polls again: news reaches this shard at once")
                    falling_back = False
                if news is False:
                    # A master that answers at once without news must not spin this loop.
                    stop.wait(MIN_WAIT_CYCLE_S - (time.monotonic() - asked))
                    continue
                if news is None:
                    if not falling_back:
                        log.warning(
                            "no long-poll (%s); heartbeating every %g s until the master holds waits again",
                            self.wait_refused,
                            self.interval,
                        )
                        falling_back = True
                    stop.wait(jittered(self.interval))
                    continue
                if news:
                    self.nudge.set()
                    # The news is the master's until a heartbeat fetched it: ask again only after one.
                    deadline = time.monotonic() + self.interval * 2
                    with self._beat:
                        while self._beats == beats and not stop.is_set() and time.monotonic() < deadline:
                            self._beat.wait(STOP_CHECK_S)
        finally:
            session.close()

    def run(self, stop: threading.Event, on_ingest: Callable[[], None] | None = None) -> None:
        """Heartbeats until `stop` is set, long-polling between heartbeats; raises ProtocolRefused, which
        no retry can fix. `on_ingest` is called when an answer brought jobs or hosts."""
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self.watch, args=(stop,), name="heartbeat-wait", daemon=True)
            self._watcher.start()

        def step() -> float:
            # A connection broken by a database restart is dropped here and reopened by the next query.
            close_old_connections()
            response, result = self.tick()
            if result.jobs or result.hosts or result.removed_hosts or result.rejected:
                log.info("heartbeat: %s", result)
            if on_ingest is not None and (result.jobs or result.hosts or result.removed_hosts):
                on_ingest()
            self.pause(stop, 0.0 if response.more else jittered(self.interval))
            return 0.0

        def failed(exc: BaseException) -> None:
            self.failures_total += 1

        run_until_stopped(
            step,
            stop,
            what="heartbeat",
            log=log,
            backoff=Backoff(base_s=1.0, cap_s=MAX_BACKOFF_S),
            expected=(HeartbeatFailed, DatabaseError),
            fatal=(ProtocolRefused,),
            on_error=failed,
        )


def run_once_accepted(
    client: HeartbeatClient,
    stop: threading.Event,
    step: Callable[[], float | None],
    *,
    what: str,
    logger: logging.Logger,
    backoff: Backoff,
    wait: Callable[[float], None] | None = None,
) -> None:
    """An upload loop (logs, results) of its own thread: waits until the master accepts this shard
    instance, then runs `step` until `stop` (common/loop.py), and closes the thread's connection."""
    try:
        while not stop.is_set() and not client.accepted.is_set():
            stop.wait(0.2)
        run_until_stopped(
            step,
            stop,
            what=what,
            log=logger,
            backoff=backoff,
            expected=(MasterUnavailable, DatabaseError),
            verb="paused",
            wait=wait,
        )
    finally:
        connection.close()


def detail_of(resp: requests.Response) -> dict[str, Any]:
    """The master's error `detail`, or {} for an answer that has none."""
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        return {}
    return detail if isinstance(detail, dict) else {}


def field_of(resp: requests.Response) -> object:
    return detail_of(resp).get("field")


def error_of(resp: requests.Response) -> str:
    """The master's one-line reason, or the HTTP reason phrase for an answer that is not its JSON (a
    proxy's HTML page would spread over the log)."""
    try:
        message = resp.json().get("error")
    except (ValueError, AttributeError):
        message = None
    text = str(message) if message else (resp.reason or "no reason given")
    return " ".join(text.split())[:300]
