"""The shard's heartbeat client: send what the shard knows and has done, apply what the master answers."""

import logging
import random
import threading
from typing import Any

import requests
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from common.constants import CLIENT_VERSION, MAX_UPDATES_PER_HEARTBEAT, PROTOCOL_VERSION
from common.network import request_failure
from common.wire import HeartbeatResponse, WireError
from shard.ingest import IngestResult, apply_response, known_hosts, known_jobs
from shard.instance import ensure_instance
from shard.outbox import outbox_depth, pending

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
MIN_INTERVAL_S = 0.1


class HeartbeatFailed(Exception):
    """This heartbeat did not go through; the next one repeats it."""


class ProtocolRefused(HeartbeatFailed):
    """The master does not speak this client's protocol: retrying cannot help."""


class InstanceRefused(ProtocolRefused):
    """Another instance of this shard (another database with the same token) is live: run nothing."""


def jittered(interval: float) -> float:
    return interval * random.uniform(0.9, 1.1)


def backoff(interval: float, failures: int) -> float:
    factor: int = 2 ** min(failures, 16)
    return min(MAX_BACKOFF_S, max(interval, 1.0) * factor)


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

    def build_request(self) -> dict[str, Any]:
        if self.instance is None:
            self.instance = ensure_instance()
        return {
            "protocol": PROTOCOL_VERSION,
            "shard": self.shard_hostname,
            "instance": self.instance,
            "client_version": CLIENT_VERSION,
            "known_hosts": known_hosts(),
            "known_jobs": known_jobs(),
            "updates": pending(MAX_UPDATES_PER_HEARTBEAT),
            "outbox_depth": outbox_depth(),
        }

    def exchange(self, body: dict[str, Any]) -> HeartbeatResponse:
        try:
            resp = self.session.post(self.url, json=body, timeout=self.timeout)
        except requests.RequestException as exc:
            raise HeartbeatFailed(f"cannot reach the master at {self.master_url}: {request_failure(exc)}") from exc
        if resp.status_code == 409:
            if field_of(resp) == "instance":
                raise InstanceRefused(f"the master refused this shard database: {error_of(resp)}")
            raise ProtocolRefused(f"the master refused protocol {PROTOCOL_VERSION}: {error_of(resp)}")
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
        response = self.exchange(self.build_request())
        result = apply_response(response)
        # A master (or something posing as one) cannot spin the shard in a tight loop.
        self.interval = max(MIN_INTERVAL_S, float(response.heartbeat_interval_s or self.interval))
        self.accepted.set()
        return response, result

    def run(self, stop: threading.Event) -> None:
        """Heartbeats until `stop` is set; raises ProtocolRefused, which no retry can fix."""
        failures = 0
        while not stop.is_set():
            # A connection broken by a database restart is dropped here and reopened by the next query.
            close_old_connections()
            try:
                response, result = self.tick()
            except ProtocolRefused:
                raise
            except (HeartbeatFailed, DatabaseError) as exc:
                failures += 1
                delay = backoff(self.interval, failures)
                log.warning("heartbeat failed (%s); retrying in %.1f s", exc, delay)
            else:
                failures = 0
                delay = 0.0 if response.more else jittered(self.interval)
                if result.jobs or result.hosts or result.removed_hosts or result.rejected:
                    log.info("heartbeat: %s", result)
            stop.wait(delay)


def field_of(resp: requests.Response) -> object:
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        return None
    return detail.get("field") if isinstance(detail, dict) else None


def error_of(resp: requests.Response) -> str:
    """The master's one-line reason, or the HTTP reason phrase for an answer that is not its JSON (a
    proxy's HTML page would spread over the log)."""
    try:
        message = resp.json().get("error")
    except (ValueError, AttributeError):
        message = None
    text = str(message) if message else (resp.reason or "no reason given")
    return " ".join(text.split())[:300]
