"""The shard's settings as one typed value, read once at start: the scheduler and host lifecycle take it.

Tests and benchmarks build one directly instead of changing Django settings.
"""

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from common.constants import DEFAULT_MAX_LOG_BYTES
from shard.run.isolation import JobUser, passthrough_names, resolve_job_user


@dataclass(frozen=True)
class SchedulerConfig:
    results_root: Path
    tick_s: float = 1.0
    max_runs: int = 100
    abort_grace_s: float = 30.0
    cleanup_command: str = ""
    repair_command: str = ""
    cooldown_s: float = 0.0
    host_command_timeout_s: float = 1800.0
    minute_s: float = 60.0
    recover_every_s: float = 10.0
    # None: jobs run as the shard's own user (see shard/run/isolation.py).
    job_user: JobUser | None = None
    env_passthrough: tuple[str, ...] = ()
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES
    retention_days: float = 30.0
    retention_every_s: float = 3600.0
    # Past the retention, a run with result files not yet uploaded is kept up to this many days more.
    upload_grace_days: float = 30.0

    @property
    def upload_horizon_days(self) -> float:
        """The age past which no run is kept, uploaded or not: nor looked for by a starting uploader."""
        return self.retention_days + self.upload_grace_days

    @classmethod
    def from_settings(cls) -> "SchedulerConfig":
        return cls(
            results_root=Path(settings.FLEETSHARD_RESULTS_DIR),
            tick_s=settings.FLEETSHARD_SCHEDULER_TICK_S,
            max_runs=settings.FLEETSHARD_MAX_RUNS,
            abort_grace_s=settings.FLEETSHARD_ABORT_GRACE_S,
            cleanup_command=settings.FLEETSHARD_CLEANUP_COMMAND,
            repair_command=settings.FLEETSHARD_REPAIR_COMMAND,
            cooldown_s=settings.FLEETSHARD_COOLDOWN_S,
            host_command_timeout_s=settings.FLEETSHARD_HOST_COMMAND_TIMEOUT_S,
            minute_s=settings.FLEETSHARD_MINUTE_S,
            job_user=resolve_job_user(settings.FLEETSHARD_JOB_USER),
            env_passthrough=passthrough_names(settings.FLEETSHARD_JOB_ENV_PASSTHROUGH),
            max_log_bytes=settings.FLEETSHARD_MAX_LOG_BYTES,
            retention_days=settings.FLEETSHARD_RESULTS_RETENTION_DAYS,
            upload_grace_days=settings.FLEETSHARD_RESULTS_UPLOAD_GRACE_DAYS,
        )
