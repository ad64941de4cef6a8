"""A fleet simulator: N shards x H hosts x J jobs speaking the real protocol over HTTP to a real master.

Run: `.venv/bin/python bench/fleet.py [--shards 100] [--hosts 200] [--jobs 50] [--steady 30] [--capacity 10]`
with DATABASE_URL naming a PostgreSQL server (any database on it; default postgres://postgres@127.0.0.1:5432/postgres).
It creates a throwaway database, fills it (bulk inserts), starts `manage.py serve` on it, and then, from
this one process (asyncio, a minimal HTTP/1.1 client with keep-alive), measures:

1. cold sync: every shard, --sync-clients of them at a time, heartbeats with empty lists until it holds all
   its hosts and jobs; the time, and the CPU it cost a shard (the master, PostgreSQL, this simulator);
2. steady state at the real rate: each shard heartbeats every interval (10 s, jittered, random phase)
   with its full known lists, and holds a long-poll between heartbeats (not with --no-waits); heartbeat
   latency p50/p99, measured after --warmup seconds;
3. dispatch: jobs created on the master (through `master.services`, as the REST API does) at random
   moments for random shards; the time until that shard's heartbeat answer carries the job;
4. held long-polls: the fewest the fleet held at once once synced (client side), and the master's
   database connections meanwhile;
5. closed-loop capacity: C clients heartbeating back to back (full lists, no sleep), then the same C
   clients sending an authenticated no-op (`GET /api/v1/heartbeat/wait?timeout=0`), in alternating
   rounds of the same run; the medians of the rounds, and of their ratios.
The database is dropped at the end.
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import (  # noqa: E402
    DEFAULT_PG,
    admin_connection,
    cpu_seconds,
    create_database,
    fill_fleet_rows,
    say,
)

# A minimal HTTP/1.1 client: one connection, keep-alive, Content-Length or chunked bodies.


class HTTPError(Exception):
    pass


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None

    async def request(
        self, method: str, path: str, token: str, body: bytes = b"", timeout: float = 120
    ) -> tuple[int, bytes]:
        for attempt in (1, 2):
            fresh = self.writer is None
            if fresh:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            try:
                return await asyncio.wait_for(self._exchange(method, path, token, body), timeout)
            except (ConnectionError, asyncio.IncompleteReadError, HTTPError):
                await self.close()
                if fresh or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _exchange(self, method: str, path: str, token: str, body: bytes) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise HTTPError("connection closed")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            data = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readline()).strip(), 16)
                if size == 0:
                    await self.reader.readline()
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            data = b"".join(parts)
        else:
            data = await self.reader.read()
            await self.close()
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, data


# The simulated shard.


@dataclass
class SimShard:
    hostname: str
    token: str
    instance: str = field(default_factory=lambda: str(uuid.uuid4()))
    hosts: dict[int, int] = field(default_factory=dict)
    jobs: dict[int, int] = field(default_factory=dict)
    first_seen: dict[int, float] = field(default_factory=dict)
    encoded: bytes = b""

    def body(self) -> bytes:
        """The heartbeat's body, encoded anew only after an answer changed the known lists: at 5,000 shards
        the simulator's own JSON would otherwise take a core from the master it measures."""
        if not self.encoded:
            self.encoded = self._encode()
        return self.encoded

    def _encode(self) -> bytes:
        return json.dumps(
            {
                "protocol": 1,
                "shard": self.hostname,
                "instance": self.instance,
                "client_version": "fleet-bench",
                "known_hosts": [{"id": i, "version": v, "status": "Ready"} for i, v in self.hosts.items()],
                "known_jobs": [{"id": i, "version": v} for i, v in self.jobs.items()],
                "updates": [],
            }
        ).encode()

    def ingest(self, data: bytes) -> bool:
        answer = json.loads(data)
        now = time.monotonic()
        if answer["hosts"] or answer["removed_host_ids"] or answer["jobs"]:
            self.encoded = b""
        for host in answer["hosts"]:
            self.hosts[host["id"]] = host["version"]
        for host_id in answer["removed_host_ids"]:
            self.hosts.pop(host_id, None)
        for job in answer["jobs"]:
            self.jobs[job["id"]] = job["version"]
            self.first_seen.setdefault(job["id"], now)
        return bool(answer["more"])


RECONNECT_EVERY = 20


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Fleet:
    def __init__(self, host: str, port: int, shards: list[SimShard], interval: float) -> None:
        self.host, self.port, self.shards, self.interval = host, port, shards, interval
        self.latencies: list[float] = []
        self.waiting = 0
        self.errors: dict[str, int] = {}
        self.stop = asyncio.Event()
        self.nudges: dict[str, asyncio.Event] = {s.hostname: asyncio.Event() for s in shards}
        self.last_sent: dict[str, float] = {}

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    async def heartbeat(self, conn: Connection, shard: SimShard, timeout: float = 120) -> float:
        self.last_sent[shard.hostname] = time.monotonic()
        began = time.perf_counter()
        status, data = await conn.request("POST", "/api/v1/heartbeat", shard.token, shard.body(), timeout)
        took = time.perf_counter() - began
        if status != 200:
            raise HTTPError(f"heartbeat {status}: {data[:200]!r}")
        more = shard.ingest(data)
        return took if not more else -took

    async def cold_sync(self, shard: SimShard) -> None:
        conn = Connection(self.host, self.port)
        try:
            while await self.heartbeat(conn, shard, timeout=900) < 0:
                pass
        finally:
            await conn.close()

    async def beat_loop(self, shard: SimShard) -> None:
        conn = Connection(self.host, self.port)
        nudge = self.nudges[shard.hostname]
        try:
            await asyncio.sleep(random.uniform(0, self.interval))
            while not self.stop.is_set():
                try:
                    took = await self.heartbeat(conn, shard)
                    self.latencies.append(abs(took))
                except Exception as exc:
                    self.error(f"heartbeat: {type(exc).__name__}: {exc}"[:120])
                nudge.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(nudge.wait(), self.interval * random.uniform(0.9, 1.1))
        finally:  # cancelled too: a socket left open would keep the master holding its wait
            await conn.close()

    async def wait_loop(self, shard: SimShard) -> None:
        conn = Connection(self.host, self.port)
        try:
            await self._wait_loop(shard, conn)
        finally:
            await conn.close()

    async def _wait_loop(self, shard: SimShard, conn: Connection) -> None:
        while not self.stop.is_set():
            since = time.monotonic() - self.last_sent.get(shard.hostname, time.monotonic())
            self.waiting += 1
            try:
                status, data = await conn.request(
                    "GET", f"/api/v1/heartbeat/wait?timeout=30&since={since:.3f}", shard.token, timeout=60
                )
            except Exception as exc:
                self.error(f"wait: {type(exc).__name__}")
                status, data = 0, b""
            finally:
                self.waiting -= 1
            if status != 200:
                if status:
                    self.error(f"wait {status}")
                await asyncio.sleep(self.interval)
                continue
            if json.loads(data).get("news"):
                sent = self.last_sent.get(shard.hostname, 0.0)
                self.nudges[shard.hostname].set()
                while self.last_sent.get(shard.hostname, 0.0) == sent and not self.stop.is_set():
                    await asyncio.sleep(0.01)


async def closed_loop(host: str, port: int, clients: int, seconds: float, request: Any) -> float:
    """Requests per second from `clients` sending back to back. Each reconnects every RECONNECT_EVERY
    requests: the master's workers share one listening socket, so which worker serves a kept-alive
    connection is settled when it is accepted, and a few long-lived connections could all land on one
    worker and measure half the server."""
    done = 0
    deadline = time.monotonic() + seconds

    async def one(n: int) -> None:
        nonlocal done
        conn = Connection(host, port)
        sent = 0
        while time.monotonic() < deadline:
            status = await request(conn, n)
            if status == 200:
                done += 1
            sent += 1
            if sent % RECONNECT_EVERY == 0:
                await conn.close()
        await conn.close()

    began = time.monotonic()
    await asyncio.gather(*(one(n) for n in range(clients)))
    return done / (time.monotonic() - began)


async def drain(host: str, port: int, token: str, limit_s: float = 300) -> float:
    """Waits until the master has worked off what the stopped fleet left queued (a saturated master
    keeps answering requests whose clients are gone), so the capacity runs measure only themselves."""
    began = time.monotonic()
    conn = Connection(host, port)
    while time.monotonic() - began < limit_s:
        t0 = time.monotonic()
        await conn.request("GET", "/api/v1/heartbeat/wait?timeout=0", token)
        if time.monotonic() - t0 < 0.05:
            break
        await asyncio.sleep(0.5)
    await conn.close()
    return time.monotonic() - began


# Set-up: the database, the fleet's rows, the master.


def fill(n_shards: int, n_hosts: int, n_jobs: int) -> list[SimShard]:
    """The fleet's rows as the services would leave them: shards and their tokens by the service (the one
    call a shard takes), hosts, labels and queued jobs by INSERT ... SELECT (the services would take hours
    at a million hosts), then vacuumed as autovacuum would leave them."""
    from django.db import transaction
    from django.utils import timezone

    from common.models import Label
    from master import services
    from master.models import Token

    sims = []
    for s in range(n_shards):
        with transaction.atomic():
            label = Label.objects.create(name=f"board:fleet{s}")
            shard, token = services.create_shard(f"fleet{s}.lab", [label.name], acting_user=None)
        sims.append(SimShard(shard.hostname, token))
    fill_fleet_rows(n_hosts, n_jobs)
    # In service: every shard's token was used lately (a master started now reads them all at its
    # first request, docs/design.md, "The token cache"), as the master is restarted under a live fleet.
    Token.objects.filter(shard__isnull=False).update(last_used=timezone.now())
    return sims


def master_connections(dbname: str) -> int:
    conn = admin_connection()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


async def steady_state(
    args: argparse.Namespace, fleet: "Fleet", sims: list[SimShard], dbname: str, figures: dict[str, Any]
) -> None:
    """Steps 2-4: the fleet at its real rate, then stopped (its sockets closed)."""
    from master import services

    tasks = [asyncio.create_task(fleet.beat_loop(s)) for s in sims]
    if not args.no_waits:
        tasks += [asyncio.create_task(fleet.wait_loop(s)) for s in sims]
    # Every shard heartbeated once and holds its wait; at thousands of shards, also until each serving
    # process has looked up most shards' tokens once (a cold token cache is a master's first minutes).
    await asyncio.sleep(max(args.warmup, args.interval * 1.2))
    fleet.latencies.clear()
    held: list[int] = []
    connections: list[int] = []
    dispatch: list[float] = []
    label_of = {s.hostname: f"board:fleet{s.hostname[5:].split('.')[0]}" for s in sims}
    deadline = time.monotonic() + args.steady
    next_job = time.monotonic() + random.uniform(0.2, 1.0)
    created: list[tuple[SimShard, int, float]] = []
    while time.monotonic() < deadline:
        held.append(fleet.waiting)
        if len(connections) < 5 and len(held) % 20 == 0:
            connections.append(await asyncio.to_thread(master_connections, dbname))
        if time.monotonic() >= next_job:
            shard = random.choice(sims)

            def create(hostname: str = shard.hostname) -> int:
                from django.db import connection

                try:
                    return services.create_job(
                        services.JobRequest(
                            name="dispatch", owner="bench", command="true", meta_hosts=[(label_of[hostname], 1)]
                        ),
                        acting_user=None,
                    ).id
                finally:
                    connection.close()

            t0 = time.monotonic()
            job_id = await asyncio.to_thread(create)
            created.append((shard, job_id, t0))
            next_job = time.monotonic() + random.uniform(0.2, 1.0)
        await asyncio.sleep(0.05)
    await asyncio.sleep(2.0)
    for shard, job_id, t0 in created:
        seen = shard.first_seen.get(job_id)
        dispatch.append(seen - t0 if seen is not None else float("inf"))
    figures["steady_n"] = len(fleet.latencies)
    figures["steady_p50_ms"] = pct(fleet.latencies, 0.5) * 1000
    figures["steady_p99_ms"] = pct(fleet.latencies, 0.99) * 1000
    figures["held_min"] = min(held)
    figures["held_median"] = statistics.median(held)
    figures["master_db_connections_max"] = max(connections) if connections else None
    figures["dispatch_n"] = len(dispatch)
    figures["dispatch_p50_s"] = pct(dispatch, 0.5)
    figures["dispatch_max_s"] = max(dispatch) if dispatch else float("nan")
    fleet.stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    figures["errors"] = dict(fleet.errors)


async def simulate(
    args: argparse.Namespace, port: int, sims: list[SimShard], dbname: str, master_pid: int
) -> dict[str, Any]:

    fleet = Fleet("127.0.0.1", port, sims, args.interval)
    figures: dict[str, Any] = {}

    # As shards come back after a master's restart: all of them, but at most --sync-clients at once (the
    # master answers a few at a time whatever the number queued; thousands at once would only wait).
    gate = asyncio.Semaphore(args.sync_clients)

    async def sync(shard: SimShard) -> None:
        async with gate:
            await fleet.cold_sync(shard)

    before = cpu_seconds(master_pid, dbname)
    began = time.monotonic()
    await asyncio.gather(*(sync(s) for s in sims))
    figures["cold_sync_s"] = time.monotonic() - began
    spent = [(b - a) / len(sims) * 1000 for a, b in zip(before, cpu_seconds(master_pid, dbname), strict=True)]
    figures["cold_sync_cpu_ms_per_shard"] = {"master": spent[0], "postgresql": spent[1], "simulator": spent[2]}
    say(
        f"cold sync: {len(sims)} shards in {figures['cold_sync_s']:.1f} s; CPU a shard: master {spent[0]:.1f} ms, "
        f"PostgreSQL {spent[1]:.1f} ms, simulator {spent[2]:.1f} ms"
    )
    assert all(len(s.hosts) == args.hosts and len(s.jobs) == args.jobs for s in sims), "cold sync incomplete"

    if args.steady > 0:
        await steady_state(args, fleet, sims, dbname, figures)
    else:
        say("steady state skipped (--steady 0): capacity only")
        nan = float("nan")
        figures.update(steady_n=0, steady_p50_ms=nan, steady_p99_ms=nan, held_min=None, dispatch_n=0)
        figures.update(dispatch_p50_s=nan, dispatch_max_s=nan)
    bodies = [(s.token, s.body()) for s in sims]

    async def beat(conn: Connection, n: int) -> int:
        token, body = bodies[(n + random.randrange(len(bodies))) % len(bodies)]
        status, _ = await conn.request("POST", "/api/v1/heartbeat", token, body)
        return status

    async def noop(conn: Connection, n: int) -> int:
        token, _ = bodies[(n + random.randrange(len(bodies))) % len(bodies)]
        status, _ = await conn.request("GET", "/api/v1/heartbeat/wait?timeout=0", token)
        return status

    figures["drain_s"] = await drain("127.0.0.1", port, bodies[0][0])
    # Rounds of each in turn: the machine's speed drifts (other tenants, the database's own work), and
    # the ratio of neighbouring rounds is what compares the two.
    rounds = []
    for _ in range(args.rounds):
        beats = await closed_loop("127.0.0.1", port, args.clients, args.capacity / args.rounds, beat)
        noops = await closed_loop("127.0.0.1", port, args.clients, args.capacity / args.rounds, noop)
        rounds.append((beats, noops, beats / noops))
    figures["capacity_rounds"] = [[round(b), round(n), round(r, 2)] for b, n, r in rounds]
    figures["capacity_heartbeats_per_s"] = statistics.median(b for b, _, _ in rounds)
    figures["capacity_noop_per_s"] = statistics.median(n for _, n, _ in rounds)
    figures["capacity_ratio"] = statistics.median(r for _, _, r in rounds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--interval", type=float, default=10.0, help="the heartbeat interval the master sets")
    parser.add_argument(
        "--steady", type=float, default=30.0, help="seconds of steady state measured (0: none, capacity only)"
    )
    parser.add_argument("--capacity", type=float, default=30.0, help="seconds of each closed-loop measure, in all")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds the closed-loop seconds are cut into")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds of steady state not measured")
    parser.add_argument("--no-waits", action="store_true", help="shards only heartbeat: no long-poll held")
    parser.add_argument("--sync-clients", type=int, default=32, help="shards cold-syncing at once")
    parser.add_argument("--waits", type=int, default=None, help="the master's --waits a worker (default: serve's own)")
    parser.add_argument(
        "--workers", type=int, default=None, help="the master's gunicorn workers (default: serve's own, 2 per core + 1)"
    )
    args = parser.parse_args()

    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        os.environ["DATABASE_URL"] = DEFAULT_PG
    # Two connections a shard (heartbeats and the long-poll), here and in the master it starts.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    dbname = f"fleet_bench_{uuid.uuid4().hex[:8]}"
    url = create_database(dbname)
    data_dir = Path(tempfile.mkdtemp(prefix="fleetshard-fleet-"))
    # FLEETSHARD_TOKEN_CACHE passes through, to measure the master with its token cache off (0).
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_") or k == "FLEETSHARD_TOKEN_CACHE"}
    env.update(
        DATABASE_URL=url,
        FLEETSHARD_ROLE="master",
        FLEETSHARD_DATA_DIR=str(data_dir),
        DJANGO_SETTINGS_MODULE="server.settings",
        FLEETSHARD_HEARTBEAT_INTERVAL_S=str(args.interval),
        FLEETSHARD_DETECT_IN_SERVE="0",
        SECRET_KEY="fleet-bench",
    )
    os.environ.update(env)
    master = None
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, check=True, capture_output=True
        )
        import django

        django.setup()
        began = time.monotonic()
        sims = fill(args.shards, args.hosts, args.jobs)
        say(f"filled {args.shards} shards x {args.hosts} hosts x {args.jobs} jobs in {time.monotonic() - began:.1f} s")
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = open(data_dir / "master.log", "wb")  # noqa: SIM115
        master = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--bind", f"127.0.0.1:{port}"]
            + ([] if args.workers is None else ["--workers", str(args.workers)])
            + ([] if args.waits is None else ["--waits", str(args.waits)]),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        import requests

        for _ in range(300):
            try:
                if requests.get(f"http://127.0.0.1:{port}/admin/login/", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        load = os.getloadavg()
        say(f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        figures = asyncio.run(simulate(args, port, sims, dbname, master.pid))
        say(json.dumps(figures, indent=1, default=str))
        f = figures
        say(
            f"| {args.shards} x {args.hosts} ({args.shards * args.hosts:,} hosts), {args.jobs} jobs/shard | "
            f"cold sync {f['cold_sync_s']:.1f} s | steady p50 {f['steady_p50_ms']:.0f} ms, "
            f"p99 {f['steady_p99_ms']:.0f} ms ({f['steady_n']} heartbeats) | "
            f"capacity {f['capacity_heartbeats_per_s']:.0f}/s vs no-op {f['capacity_noop_per_s']:.0f}/s "
            f"= {f['capacity_ratio']:.2f} | held waits min {f['held_min']} of {args.shards} | "
            f"dispatch p50 {f['dispatch_p50_s'] * 1000:.0f} ms, max {f['dispatch_max_s'] * 1000:.0f} ms "
            f"({f['dispatch_n']} jobs) |"
        )
    finally:
        if master is not None:
            master.terminate()
            try:
                master.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(master.pid, 9)
        from django.db import connections

        connections.close_all()
        conn = admin_connection()
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.close()


if __name__ == "__main__":
    main()
