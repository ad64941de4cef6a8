"""Runs the shard until a signal: checks its settings and files, then hands over to `shard.process.ShardProcess`.

SIGTERM drains (FLEETSHARD_DRAIN_S seconds for running jobs), a second SIGTERM or a SIGINT stops at once.
"""

import logging
import signal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import import_string

from common.schema import check_migrated
from shard.client import HeartbeatClient
from shard.config import SchedulerConfig
from shard.executor import Executor
from shard.isolation import (
    IsolationError,
    JobUser,
    describe_job_user,
    hide_environ,
    make_traversable,
    protect_data,
    read_token_file,
)
from shard.leader import worker_mode_refusal
from shard.metrics import MetricsServer
from shard.process import ShardProcess
from shard.scheduler import Scheduler

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

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "shard":
            raise CommandError(
                "run_shard needs the shard's settings (FLEETSHARD_ROLE=shard, DJANGO_SETTINGS_MODULE=common.settings), "
                f"not {settings.SETTINGS_MODULE}, which plays the {settings.ROLE}"
            )
        exit_when_idle = options["exit_when_idle"]
        if exit_when_idle is not None:
            if not 0 < exit_when_idle < 10**9:
                raise CommandError(f"--exit-when-idle must be a number of seconds above 0, not {exit_when_idle:g}")
            refusal = worker_mode_refusal()
            if refusal:
                raise CommandError(f"--exit-when-idle: {refusal}")
        check_migrated()
        try:
            config = SchedulerConfig.from_settings()
        except (IsolationError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
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
        try:
            executor = import_string(settings.FLEETSHARD_EXECUTOR)()
        except (ImportError, TypeError) as exc:
            raise CommandError(f"FLEETSHARD_EXECUTOR={settings.FLEETSHARD_EXECUTOR}: {exc}") from exc
        if not isinstance(executor, Executor):
            raise CommandError(f"FLEETSHARD_EXECUTOR={settings.FLEETSHARD_EXECUTOR} is not a shard.executor.Executor")
        try:
            protect_data(settings.DATA_DIR, sqlite_file())
            make_traversable(config.results_root, config.job_user)
            tracking = executor.describe()
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot prepare the shard's files: {exc}") from exc
        if config.job_user is None and not hide_environ():
            log.warning("cannot hide this process's environment from jobs of its own user (prctl unavailable)")
        scheduler = Scheduler(config, executor)
        process = ShardProcess(client, scheduler, drain_s=settings.FLEETSHARD_DRAIN_S, exit_when_idle_s=exit_when_idle)
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
        try:
            process.run()
        finally:
            if metrics is not None:
                metrics.shutdown()
                metrics.server_close()
        if process.fatal:
            raise CommandError(f"stopping: {process.fatal}")
        log.info("shard %s stopped", settings.FLEETSHARD_SHARD_HOSTNAME)
