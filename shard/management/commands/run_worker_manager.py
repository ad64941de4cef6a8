"""Runs the shard's worker manager (docs/design.md, "Elastic workers") until SIGTERM or SIGINT.

It is the shard's always-on presence: it holds the shard's heartbeat, so work reaches the shard's
database with no worker running, and each tick it starts or stops workers through its backend.
Workers outlive it: a restarted manager finds them through the backend.
"""

import logging
import os
import signal
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections, connection

from common.loop import Backoff, run_until_stopped
from common.schema import check_migrated
from common.wire import MAX_POOL_LABELS
from shard.elastic.backends import BACKENDS, NOT_BUILT, Backend, LocalBackend, SlurmBackend, SlurmOptions, WorkerSpec
from shard.elastic.manager import Metrics, WorkerManager, pool_key, queued_for
from shard.elastic.policy import Limits
from shard.elastic.sbatch import sbatch_option_refusal
from shard.management.commands.run_shard import shard_token
from shard.run.workers import MAX_SLOTS, announce_pool, free_slots, sync_worker_hosts
from shard.sync.client import HeartbeatClient
from shard.sync.leader import HeartbeatLeadership, heartbeat_loop, lock_key, worker_mode_refusal

log = logging.getLogger("shard.worker_manager")

MAX_LABELS = MAX_POOL_LABELS


class Command(BaseCommand):
    help = "Keep this shard's elastic workers between a minimum and a maximum while matching work is queued."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", required=True, help=f"where workers run: {', '.join(BACKENDS)}")
        parser.add_argument("--min-workers", type=int, default=0)
        parser.add_argument("--max-workers", type=int, required=True)
        parser.add_argument("--min-seconds-between-workers", type=float, default=5.0)
        parser.add_argument(
            "--idle-seconds", type=float, default=60.0, help="a worker exits after this long with no run"
        )
        parser.add_argument(
            "--slots-per-worker", type=int, default=1, help="hosts each worker brings (run_shard --slots)"
        )
        parser.add_argument("--label", action="append", default=[], help="count only HQEs with this label (repeatable)")
        parser.add_argument("--once", action="store_true", help="one tick, without heartbeating, then exit")
        parser.add_argument("--tick-seconds", type=float, default=5.0)
        parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on 127.0.0.1")
        parser.add_argument("--slurm-partition", default="")
        parser.add_argument("--slurm-account", default="")
        parser.add_argument("--slurm-time-limit", default="", help="sbatch --time, e.g. 4:00:00")
        parser.add_argument(
            "--slurm-sbatch-option", action="append", default=[], help="one more sbatch option (repeatable)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "shard":
            raise CommandError("run_worker_manager needs the shard's settings (FLEETSHARD_ROLE=shard)")
        name = options["backend"]
        if name in NOT_BUILT:
            raise CommandError(NOT_BUILT[name])
        if name not in BACKENDS:
            raise CommandError(f"--backend must be one of {', '.join(BACKENDS)}, not {name[:50]!r}")
        try:
            limits = Limits(options["min_workers"], options["max_workers"], options["min_seconds_between_workers"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        idle, tick = options["idle_seconds"], options["tick_seconds"]
        if not 0 < idle < 10**9:
            raise CommandError(f"--idle-seconds must be a number of seconds above 0, not {idle:g}")
        if not 0.1 <= tick <= 3600:
            raise CommandError(f"--tick-seconds must be between 0.1 and 3600, not {tick:g}")
        if not 0 <= options["metrics_port"] < 65536:
            raise CommandError(f"--metrics-port must be a TCP port (0: none), not {options['metrics_port']}")
        labels = [label.strip() for label in options["label"]]
        if (
            any(not label or len(label) > 255 or not label.isprintable() for label in labels)
            or len(labels) > MAX_LABELS
        ):
            raise CommandError(
                f"each --label must be a label's name (1 to 255 printable characters), {MAX_LABELS} at most"
            )
        slots = options["slots_per_worker"]
        if not 1 <= slots <= MAX_SLOTS:
            raise CommandError(f"--slots-per-worker must be between 1 and {MAX_SLOTS}, not {slots}")
        for option in options["slurm_sbatch_option"]:
            why = sbatch_option_refusal(option)
            if why:
                raise CommandError(f"--slurm-sbatch-option {option!r}: {why}")
        refusal = worker_mode_refusal()
        if refusal:
            raise CommandError(f"run_worker_manager: {refusal}")
        hostname = settings.FLEETSHARD_SHARD_HOSTNAME
        if not hostname:
            raise CommandError("set FLEETSHARD_SHARD_HOSTNAME to run a shard's worker manager")
        check_migrated()
        # Workers inherit this environment: one metrics port each would clash, so they serve none.
        os.environ.pop("FLEETSHARD_METRICS_BIND", None)
        key = pool_key(hostname, labels)
        spec = WorkerSpec(
            pool=key,
            # `-m server.manage` works from a checkout and from an installed wheel alike.
            command=(
                sys.executable,
                "-m",
                "server.manage",
                "run_shard",
                f"--exit-when-idle={idle:g}",
                f"--slots={slots}",
                *(f"--label={label}" for label in labels),
            ),
            cwd=settings.BASE_DIR,
            log_dir=settings.DATA_DIR / "workers" / key,
            worker_id=True,
        )
        backend: Backend
        if name == "slurm":
            slurm = SlurmOptions(
                options["slurm_partition"],
                options["slurm_account"],
                options["slurm_time_limit"],
                tuple(options["slurm_sbatch_option"]),
            )
            backend = SlurmBackend(spec, slurm)
        else:
            backend = LocalBackend(spec)
        metrics = Metrics()
        manager = WorkerManager(
            backend,
            limits,
            key,
            lambda: queued_for(labels).count(),
            metrics=metrics,
            slots=slots,
            free=lambda active: free_slots(slots, active),
        )
        if labels:
            announce_pool(labels, limits.max_workers * slots)
        else:
            log.warning("no --label: the pool is not announced, so the master accepts its jobs only once hosts exist")
        if options["once"]:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [lock_key(key)])
                (free,) = cursor.fetchone()
                if not free:
                    raise CommandError(f"another worker manager runs pool {key} now: --once does nothing")
                try:
                    manager.tick()
                finally:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_key(key)])
            return
        self.serve(manager, metrics, tick, options["metrics_port"], labels)

    def serve(self, manager: WorkerManager, metrics: Metrics, tick_s: float, port: int, labels: list[str]) -> None:
        token = shard_token(None)
        if not (settings.FLEETSHARD_MASTER_URL and token):
            raise CommandError("set FLEETSHARD_MASTER_URL and FLEETSHARD_SHARD_TOKEN: the manager heartbeats")
        client = HeartbeatClient(settings.FLEETSHARD_MASTER_URL, settings.FLEETSHARD_SHARD_HOSTNAME, token)
        client.before_request = sync_worker_hosts
        if port:
            from prometheus_client import start_http_server

            try:
                start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
            except OSError as exc:
                raise CommandError(f"--metrics-port {port}: {exc}") from exc
        stop = threading.Event()
        fatal: list[str] = []

        def refused(why: str) -> None:
            fatal.append(why)
            stop.set()

        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
        leadership = HeartbeatLeadership(
            stop, settings.FLEETSHARD_HEARTBEAT_INTERVAL_S, what="the shard's heartbeat", on_outbox=client.nudge.set
        )
        # One manager per pool ticks; another one of the same pool waits as a standby.
        pool = HeartbeatLeadership(stop, tick_s, key=lock_key(manager.key), what=f"worker pool {manager.key}")
        pool.start()
        heartbeat = threading.Thread(
            target=heartbeat_loop, args=(client, leadership, refused), name="heartbeat", daemon=True
        )
        heartbeat.start()
        log.info(
            "worker manager of %s: %s backend, pool %s, labels %s, workers %d to %d, a tick every %g s",
            settings.FLEETSHARD_SHARD_HOSTNAME,
            manager.backend.name,
            manager.key,
            labels or "(any)",
            manager.limits.min_workers,
            manager.limits.max_workers,
            tick_s,
        )

        def step() -> float:
            if not pool.held.is_set():
                return min(tick_s, 0.5)
            close_old_connections()
            manager.tick()
            return tick_s

        run_until_stopped(
            step, stop, what="worker manager tick", log=log, backoff=Backoff(base_s=tick_s, cap_s=max(tick_s, 30.0))
        )
        heartbeat.join(timeout=client.timeout[1] + 10)
        if fatal:
            raise CommandError(f"stopping: {fatal[0]}")
        log.info("worker manager stopped; its workers exit once idle")
