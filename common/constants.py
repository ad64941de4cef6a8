"""Status words and protocol constants fixed by DESIGN.md; other code imports them from here."""

from typing import Final

PROTOCOL_VERSION: Final = 1
# The one version string: the package's (pyproject.toml reads it here), the CLI's --version, a shard's heartbeat.
CLIENT_VERSION: Final = "0.1.0"

MAX_UPDATES_PER_HEARTBEAT: Final = 1000
MAX_JOBS_PER_RESPONSE: Final = 500
MAX_HOSTS_PER_RESPONSE: Final = 2000
MAX_BODY_BYTES: Final = 10 * 1024 * 1024
LOG_TAIL_BYTES: Final = 16 * 1024
# `/bin/sh -c COMMAND`: Linux execs no single argument over 32 pages (MAX_ARG_STRLEN, its NUL included).
MAX_COMMAND_BYTES: Final = 128 * 1024 - 1
OFFLINE_AFTER_INTERVALS: Final = 3


class HostStatus:
    READY: Final = "Ready"
    RUNNING: Final = "Running"
    CLEANING: Final = "Cleaning"
    REPAIRING: Final = "Repairing"
    REPAIR_FAILED: Final = "Repair Failed"
    ALL: Final = (READY, RUNNING, CLEANING, REPAIRING, REPAIR_FAILED)


class HQEStatus:
    QUEUED: Final = "Queued"
    STARTING: Final = "Starting"
    RUNNING: Final = "Running"
    COMPLETED: Final = "Completed"
    FAILED: Final = "Failed"
    ABORTED: Final = "Aborted"
    EXPIRED: Final = "Expired"
    ACTIVE: Final = (QUEUED, STARTING, RUNNING)
    TERMINAL: Final = (COMPLETED, FAILED, ABORTED, EXPIRED)
    ALL: Final = ACTIVE + TERMINAL


class JobStatus:
    QUEUED: Final = "Queued"
    RUNNING: Final = "Running"
    COMPLETED: Final = "Completed"
    FAILED: Final = "Failed"
    ABORTED: Final = "Aborted"
    EXPIRED: Final = "Expired"
    ACTIVE: Final = (QUEUED, RUNNING)
    ALL: Final = (QUEUED, RUNNING, COMPLETED, FAILED, ABORTED, EXPIRED)


class FailureClass:
    TEST: Final = "test"
    TIMEOUT: Final = "timeout"
    INFRA: Final = "infra"
    ALL: Final = (TEST, TIMEOUT, INFRA)


# The only moves an HQE makes (both sides check them): nothing leaves a terminal status.
HQE_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    HQEStatus.QUEUED: frozenset({HQEStatus.STARTING, HQEStatus.RUNNING, *HQEStatus.TERMINAL}),
    HQEStatus.STARTING: frozenset({HQEStatus.RUNNING, *HQEStatus.TERMINAL}),
    HQEStatus.RUNNING: frozenset(HQEStatus.TERMINAL),
}


def hqe_can_move(old: str, new: str) -> bool:
    return new in HQE_TRANSITIONS.get(old, frozenset())


PRIORITY_NAMES: Final = {"low": 10, "default": 40, "high": 70, "super": 80}
DEFAULT_PRIORITY: Final = PRIORITY_NAMES["default"]
# A job's defaults when its submitter gives none: expire after a day queued, kill after an hour running.
DEFAULT_TIMEOUT_MINS: Final = 1440
DEFAULT_MAX_RUNTIME_MINS: Final = 60


def derive_job_status(hqe_statuses: list[str]) -> str:
    """A job's status follows from its HQEs (DESIGN.md, "Status vocabulary")."""
    if not hqe_statuses:
        return JobStatus.QUEUED
    if any(s in HQEStatus.ACTIVE for s in hqe_statuses):
        if any(s != HQEStatus.QUEUED for s in hqe_statuses):
            return JobStatus.RUNNING
        return JobStatus.QUEUED
    if all(s == HQEStatus.COMPLETED for s in hqe_statuses):
        return JobStatus.COMPLETED
    for status in (HQEStatus.FAILED, HQEStatus.ABORTED, HQEStatus.EXPIRED):
        if status in hqe_statuses:
            return status
    return JobStatus.FAILED
