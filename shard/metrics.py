"""The shard's own /metrics and /healthz, served by `run_shard` on FLEETSHARD_METRICS_BIND (off by default).

The figures are read from the shard's database at each scrape (five queries whatever its size), so
they are right across restarts and when several `run_shard` processes share one database; only the
heartbeat failures are this process's own count. The server is plain `http.server` in daemon
threads: no token, so bind it to loopback or an interface only Prometheus reaches.
"""

import json
import logging
import math
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.db import DatabaseError, connection
from django.db.models import Count
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from common.constants import CLIENT_VERSION, HostStatus, HQEStatus
from common.models import Host, HostQueueEntry
from shard.models import DeadLetter, OutboxEntry, ShardState
from shard.sync.client import HeartbeatClient

log = logging.getLogger(__name__)

# A scrape or probe that sends nothing for this long is dropped: a stuck client holds no thread.
REQUEST_TIMEOUT_S = 10.0
# At most this many requests read the database at once; more get a 503 rather than a thread each.
MAX_CONCURRENT = 4
# At most this many connections hold a thread at once (each for up to REQUEST_TIMEOUT_S per read);
# more are closed as soon as they are accepted, so a client opening connections cannot take the
# threads (systemd's TasksMax counts them with the shard's jobs).
MAX_CONNECTIONS = 16


def outcome(status: str, failure: str) -> str:
    """How a run ended, as one label value: Completed, Failed/test, Failed/timeout, Failed/infra, Aborted..."""
    return f"{status}/{failure}" if status == HQEStatus.FAILED and failure else status


class ShardCollector(Collector):
    def __init__(self, client: HeartbeatClient, shard: str) -> None:
        self.client = client
        self.shard = shard

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["shard"]
        info = GaugeMetricFamily("fleetshard_shard_info", "This shard process's version", labels=["shard", "version"])
        info.add_metric([self.shard, CLIENT_VERSION], 1)
        yield info

        accepted = GaugeMetricFamily(
            "fleetshard_shard_accepted", "1 once the master accepted this shard's database instance", labels=labels
        )
        accepted.add_metric([self.shard], 1 if self.client.accepted.is_set() else 0)
        yield accepted

        outbox = GaugeMetricFamily(
            "fleetshard_shard_outbox_entries", "Updates waiting for the master's ack", labels=labels
        )
        outbox.add_metric([self.shard], OutboxEntry.objects.count())
        yield outbox

        dead = GaugeMetricFamily(
            "fleetshard_shard_dead_letters", "Updates the master rejected, kept for operators", labels=labels
        )
        dead.add_metric([self.shard], DeadLetter.objects.count())
        yield dead

        singleton = (
            ShardState.objects.filter(id=1).values_list("last_heartbeat_ok", "purged_started", "purged_ended").first()
        )
        state, purged_started, purged_ended = singleton if singleton is not None else (None, 0, {})
        last = GaugeMetricFamily(
            "fleetshard_shard_last_heartbeat_ok_timestamp_seconds",
            "When the master last answered a heartbeat of this shard (NaN: never)",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "fleetshard_shard_heartbeat_age_seconds",
            "Seconds since the master last answered a heartbeat of this shard (+Inf: never)",
            labels=labels,
        )
        last.add_metric([self.shard], state.timestamp() if state else math.nan)
        age.add_metric([self.shard], (timezone.now() - state).total_seconds() if state else math.inf)
        yield from (last, age)

        failures = CounterMetricFamily(
            "fleetshard_shard_heartbeat_failures",
            "Heartbeats that did not go through since this process started",
            labels=labels,
        )
        failures.add_metric([self.shard], self.client.failures_total)
        yield failures

        by_status: dict[str, int] = dict.fromkeys(HQEStatus.ACTIVE, 0)
        # The purge's tallies first: the counters count every run, deleted history included.
        ended: dict[str, int] = {str(key): int(n) for key, n in (purged_ended or {}).items()}
        started = purged_started
        rows = HostQueueEntry.objects.values("status", "failure").annotate(n=Count("id"), s=Count("started_on"))
        for row in rows.order_by():
            started += row["s"]
            if row["status"] in HQEStatus.ACTIVE:
                by_status[row["status"]] += row["n"]
            else:
                key = outcome(row["status"], row["failure"])
                ended[key] = ended.get(key, 0) + row["n"]
        runs = GaugeMetricFamily(
            "fleetshard_shard_runs", "This shard's HQEs not ended, by state", labels=["shard", "state"]
        )
        for status, n in by_status.items():
            runs.add_metric([self.shard, status], n)
        yield runs
        started_total = CounterMetricFamily(
            "fleetshard_shard_runs_started",
            "HQEs this shard started (its database's count, purged ones included)",
            labels=labels,
        )
        started_total.add_metric([self.shard], started)
        yield started_total
        ended_total = CounterMetricFamily(
            "fleetshard_shard_runs_ended", "HQEs that ended on this shard, by outcome", labels=["shard", "outcome"]
        )
        for key in sorted(ended):
            ended_total.add_metric([self.shard, key], ended[key])
        yield ended_total

        hosts_by_status = dict.fromkeys(HostStatus.ALL, 0)
        for host_row in Host.objects.values("status").annotate(n=Count("id")).order_by():
            hosts_by_status[host_row["status"]] = hosts_by_status.get(host_row["status"], 0) + host_row["n"]
        hosts = GaugeMetricFamily("fleetshard_shard_hosts", "This shard's hosts by status", labels=["shard", "status"])
        for status, n in hosts_by_status.items():
            hosts.add_metric([self.shard, status], n)
        yield hosts


def parse_bind(bind: str) -> tuple[str, int]:
    """HOST:PORT or [IPV6]:PORT; a ValueError naming what is wrong otherwise."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"FLEETSHARD_METRICS_BIND must be HOST:PORT (e.g. 127.0.0.1:9464), not {bind!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


class _Handler(BaseHTTPRequestHandler):
    server: "MetricsServer"
    timeout = REQUEST_TIMEOUT_S
    server_version = "fleetshard-shard"
    sys_version = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self.server.slots.acquire(blocking=False):
            self._send(503, "text/plain; charset=utf-8", b"busy: too many requests at once\n")
            return
        try:
            self._get()
        finally:
            self.server.slots.release()

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, self.server.scrape())
            elif path == "/healthz":
                self._send(200, "application/json", json.dumps({"status": "ok"}).encode())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: /metrics or /healthz\n")
        except DatabaseError as exc:
            log.warning("metrics: the shard's database failed: %s", exc)
            self._send(503, "text/plain; charset=utf-8", b"the shard's database cannot be read\n")
        finally:
            connection.close()

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        log.debug("metrics: %s " + format, self.address_string(), *args)


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, bind: str, client: HeartbeatClient, shard: str) -> None:
        host, port = parse_bind(bind)
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ShardCollector(client, shard))
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.acquire(blocking=False):
            log.debug("metrics: %s refused, %d connections already open", client_address[0], MAX_CONNECTIONS)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A log line instead of socketserver's traceback on stderr (no JSON line, and noise): a client
        that hung up is routine, anything else is logged with its exception."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("metrics: %s went away: %s", client_address[0], exc)
        else:
            log.error("metrics: a request from %s failed", client_address[0], exc_info=True)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="metrics", daemon=True)
        thread.start()
        return thread
