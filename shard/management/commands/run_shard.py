"""Runs the shard until a signal: checks its settings and files, then hands over to `shard.process.ShardProcess`.

SIGTERM drains (FLEETSHARD_DRAIN_S seconds for running jobs), a second SIGTERM or a SIGINT stops at once.
"""

import argparse
import logging
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import import_string

from common.schema import check_migrated
from common.wire import MAX_POOL_LABELS
from shard.blobs.cache import BlobCache, Fetcher
from shard.config import SchedulerConfig
from shard.metrics import MetricsServer
from shard.process import ShardProcess
from shard.run.executor import Executor
from shard.run.isolation import (
    IsolationError,
    JobUser,
    describe_job_user,
    hide_environ,
    make_traversable,
    protect_data,
    read_token_file,
)
from shard.run.scheduler import Scheduler
from shard.run.workers import (
    RegistrationError,
    WorkerIdentity,
    delete_work_dirs,
    own_hosts,
    parse_size,
    register,
    release,
    sync_worker_hosts,
)
from shard.sync.client import HeartbeatClient
from shard.sync.discovery import DiscoveryLoop, default_labels, parse_sources
from shard.sync.leader import worker_mode_refusal

log = logging.getLogger("shard.run_shard")


def shard_token(user: JobUser | None) -> str:
    """The shard's token: from FLEETSHARD_SHARD_TOKEN_FILE (which jobs cannot read) or FLEETSHARD_SHARD_TOKEN."""
    if settings.FLEETSHARD_SHARD_TOKEN_FILE:
        if settings.FLEETSHARD_SHARD_TOKEN:
            raise CommandError("set FLEETSHARD_SHARD_TOKEN_FILE or FLEETSHARD_SHARD_TOKEN, not both")
        try:
            return read_token_file(Path(settings.FLEETSHARD_SHARD_TOKEN_FILE), user)
        except IsolationError as exc:
            raise CommandError(str(exc)) from exc
    return settings.FLEETSHARD_SHARD_TOKEN


def size_argument(text: str) -> int:
    """`--max-work-dir-size`: bytes, or KiB to TiB with CodaLab's suffixes (`500m`, `10g`)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def sqlite_file() -> list[Path]:
    db = settings.DATABASES["default"]
    return [Path(db["NAME"])] if db["ENGINE"].endswith("sqlite3") else []


class Command(BaseCommand):
    @staticmethod
    def _metrics_server(client: HeartbeatClient) -> MetricsServer | None:
        bind = settings.FLEETSHARD_METRICS_BIND
        if not bind:
            return None
        try:
            server = MetricsServer(bind, client, settings.FLEETSHARD_SHARD_HOSTNAME)
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot serve metrics on FLEETSHARD_METRICS_BIND={bind}: {exc}") from exc
        server.start()
        log.info("serving /metrics and /healthz on %s", bind)
        return server

    help = "Run this shard's heartbeat client and scheduler until SIGTERM (drain) or SIGINT (stop at once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--exit-when-idle",
            type=float,
            metavar="SECONDS",
            default=None,
            help="run as an elastic worker: exit cleanly once this long with no run of its own (PostgreSQL only)",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help="with --exit-when-idle: register this worker's own hosts SHARD-ID-1..N and run only on them",
        )
        parser.add_argument("--slots", type=int, default=1, help="how many hosts the worker brings (default 1)")
        parser.add_argument(
            "--label",
            action="append",
            default=[],
            help="a label of the worker's hosts (repeatable; default FLEETSHARD_DISCOVERY_LABELS)",
        )
        parser.add_argument(
            "--exit-after-num-runs",
            type=int,
            default=None,
            metavar="N",
            help="a worker starts no run after its N-th and exits once they have ended",
        )
        parser.add_argument(
            "--max-work-dir-size",
            type=size_argument,
            default=None,
            metavar="SIZE",
            help="a worker starts no run while its runs' directories hold more than this many bytes "
            "(k, m, g, t: KiB...TiB, as CodaLab's), and exits once its runs end",
        )
        parser.add_argument(
            "--delete-work-dir-on-exit",
            action="store_true",
            help="a worker leaving cleanly removes its runs' directories (any with a result file unsent is kept)",
        )

    @staticmethod
    def _identity(options: dict[str, Any]) -> WorkerIdentity | None:
        if options["worker_id"] is None:
            if options["slots"] != 1 or options["label"]:
                raise CommandError("--slots and --label are a worker's: pass --worker-id and --exit-when-idle too")
            return None
        if options["exit_when_idle"] is None:
            raise CommandError("--worker-id needs --exit-when-idle: a worker leaves once idle")
        labels = options["label"] or default_labels()
        bad = next((label for label in labels if not label or len(label) > 255 or not label.isprintable()), None)
        if bad is not None or len(set(labels)) > MAX_POOL_LABELS:
            raise CommandError(
                f"--label must name 1 to {MAX_POOL_LABELS} labels of 1 to 255 printable characters"
                + (f", not {bad[:60]!r}" if bad is not None else f", not {len(set(labels))}")
            )
        try:
            return WorkerIdentity(
                options["worker_id"], options["slots"], tuple(dict.fromkeys(labels)), os.environ.get("SLURM_JOB_ID", "")
            )
        except RegistrationError as exc:
            raise CommandError(str(exc)) from exc

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "shard":
            raise CommandError(
                "run_shard needs the shard's settings (FLEETSHARD_ROLE=shard, DJANGO_SETTINGS_MODULE=server.settings), "
                f"not {settings.SETTINGS_MODULE}, which plays the {settings.ROLE}"
            )
        exit_when_idle = options["exit_when_idle"]
        if exit_when_idle is not None and not 0 < exit_when_idle < 10**9:
            raise CommandError(f"--exit-when-idle must be a number of seconds above 0, not {exit_when_idle:g}")
        identity = self._identity(options)
        after = options["exit_after_num_runs"]
        max_work = options["max_work_dir_size"]
        for flag, given in (
            ("--exit-after-num-runs", after is not None),
            ("--max-work-dir-size", max_work is not None),
            ("--delete-work-dir-on-exit", options["delete_work_dir_on_exit"]),
        ):
            if given and identity is None:
                raise CommandError(f"{flag} is an elastic worker's: pass --worker-id and --exit-when-idle too")
        if after is not None and not 1 <= after <= 10**9:
            raise CommandError(f"--exit-after-num-runs must be a number of runs from 1 to 1000000000, not {after}")
        # Every option is checked before the database is: a bad value is named wherever it runs.
        refusal = worker_mode_refusal() if exit_when_idle is not None else None
        if refusal:
            raise CommandError(f"--exit-when-idle: {refusal}")
        check_migrated()
        try:
            config = SchedulerConfig.from_settings()
        except (IsolationError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if identity is not None:
            # A worker's own hosts bound its runs: FLEETSHARD_MAX_RUNS=1 of a slot-per-worker setup must
            # not leave its other slots idle.
            config = replace(config, max_runs=identity.slots)
        token = shard_token(config.job_user)
        missing = [
            name
            for name, value in (
                ("FLEETSHARD_MASTER_URL", settings.FLEETSHARD_MASTER_URL),
                ("FLEETSHARD_SHARD_HOSTNAME", settings.FLEETSHARD_SHARD_HOSTNAME),
                ("FLEETSHARD_SHARD_TOKEN", token),
            )
            if not value
        ]
        if missing:
            raise CommandError(f"set {', '.join(missing)} to run a shard")
        client = HeartbeatClient(settings.FLEETSHARD_MASTER_URL, settings.FLEETSHARD_SHARD_HOSTNAME, token)
        client.before_request = sync_worker_hosts
        try:
            executor = import_string(settings.FLEETSHARD_EXECUTOR)()
        except (ImportError, TypeError) as exc:
            raise CommandError(f"FLEETSHARD_EXECUTOR={settings.FLEETSHARD_EXECUTOR}: {exc}") from exc
        if not isinstance(executor, Executor):
            raise CommandError(
                f"FLEETSHARD_EXECUTOR={settings.FLEETSHARD_EXECUTOR} is not a shard.run.executor.Executor"
            )
        try:
            protect_data(settings.DATA_DIR, sqlite_file())
            make_traversable(config.results_root, config.job_user)
            tracking = executor.describe()
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot prepare the shard's files: {exc}") from exc
        if config.job_user is None and not hide_environ():
            log.warning("cannot hide this process's environment from jobs of its own user (prctl unavailable)")
        try:
            sources = parse_sources(settings.FLEETSHARD_DISCOVERY)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        try:
            cache = BlobCache(
                settings.FLEETSHARD_CACHE_DIR,
                settings.FLEETSHARD_CACHE_BYTES,
                Fetcher(settings.FLEETSHARD_MASTER_URL, token, settings.FLEETSHARD_REQUEST_TIMEOUT_S),
                settings.FLEETSHARD_MAX_INPUT_BYTES,
            )
            make_traversable(settings.FLEETSHARD_CACHE_DIR, config.job_user)
        except OSError as exc:
            raise CommandError(f"cannot prepare the input cache {settings.FLEETSHARD_CACHE_DIR}: {exc}") from exc
        scheduler = Scheduler(config, executor, cache=cache)
        if identity is not None:
            scheduler.own_hosts = own_hosts(identity)
            scheduler.max_starts = after
            scheduler.max_work_dir_bytes = max_work
            try:
                register(identity, scheduler.runner_id)
            except RegistrationError as exc:
                raise CommandError(str(exc)) from exc
            log.info("worker %s registered hosts %s", identity.worker_id, ", ".join(identity.hostnames()))
        process = ShardProcess(client, scheduler, drain_s=settings.FLEETSHARD_DRAIN_S, exit_when_idle_s=exit_when_idle)
        if identity is not None:
            worker = identity

            def release_hosts() -> None:
                release(worker.worker_id, scheduler.runner_id)
                # Folded into the set now: if this process holds the heartbeat, its last ones carry it.
                sync_worker_hosts()
                log.info("worker %s released its hosts", worker.worker_id)

            process.before_exit = release_hosts
        signal.signal(signal.SIGTERM, lambda signum, frame: process.on_signal(signum))
        signal.signal(signal.SIGINT, lambda signum, frame: process.on_signal(signum))
        log.info(
            "shard %s (runner %s) heartbeating to %s",
            settings.FLEETSHARD_SHARD_HOSTNAME,
            scheduler.runner_id,
            settings.FLEETSHARD_MASTER_URL,
        )
        log.info("%s; %s", describe_job_user(config.job_user), tracking)
        metrics = self._metrics_server(client)
        discovery = DiscoveryLoop(sources, client.accepted, client.nudge) if sources else None
        if discovery is not None:
            log.info("discovering hosts from %s", ", ".join(s.name for s in sources))
            discovery.start()
        try:
            process.run()
            if identity is not None and not process.fatal and options["delete_work_dir_on_exit"]:
                deleted, kept = delete_work_dirs(scheduler.runner_id)
                log.info("deleted %d run directories (%d kept: result files unsent)", deleted, kept)
        finally:
            if discovery is not None:
                discovery.close()
            if metrics is not None:
                metrics.shutdown()
                metrics.server_close()
        if process.fatal:
            raise CommandError(f"stopping: {process.fatal}")
        log.info("shard %s stopped", settings.FLEETSHARD_SHARD_HOSTNAME)
