"""Status words and protocol constants (docs/protocol.md); other code imports them from here.

The status words are `StrEnum`s: a member is the very string on the wire and in the database, so
`HQEStatus.FAILED == "Failed"`. Each class's ALL (and ACTIVE, TERMINAL) tuples hold the plain words,
in the order the documentation lists them.
"""

from enum import StrEnum, nonmember
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
# One benchmark result file (docs/protocol.md, "Results"): the master stores none larger, so the
# shard and the uploader send none larger; and a shard sends at most this many files of one run.
MAX_RESULT_FILE_BYTES: Final = 16 * 1024 * 1024
MAX_RESULT_FILES_PER_RUN: Final = 1000
# Why a file was set aside, as a shard reports it (POST /api/v1/results/quarantined).
MAX_RESULT_REASON_CHARS: Final = 1024
# Live logs (docs/protocol.md, "Logs"): a shard pushes its runs' output to the master in chunks of at
# most MAX_LOG_CHUNK_BYTES, at most MAX_LOG_PASS_BYTES every LOG_SHIP_INTERVAL_S; a reader gets at
# most MAX_LOG_READ_BYTES per request. DEFAULT_MAX_LOG_BYTES is FLEETSHARD_MAX_LOG_BYTES unless set.
MAX_LOG_CHUNK_BYTES: Final = 256 * 1024
MAX_LOG_PASS_BYTES: Final = 4 * 1024 * 1024
LOG_SHIP_INTERVAL_S: Final = 0.5
MAX_LOG_READ_BYTES: Final = 1024 * 1024
DEFAULT_MAX_LOG_BYTES: Final = 100 * 1024 * 1024


class HostStatus(StrEnum):
    READY = "Ready"
    RUNNING = "Running"
    CLEANING = "Cleaning"
    REPAIRING = "Repairing"
    REPAIR_FAILED = "Repair Failed"
    # A discovered host that left its shard's discovered set (docs/design.md, "Capacity that registers itself").
    MISSING = "Missing"
    ALL = nonmember((READY, RUNNING, CLEANING, REPAIRING, REPAIR_FAILED, MISSING))


class HQEStatus(StrEnum):
    QUEUED = "Queued"
    STARTING = "Starting"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    ABORTED = "Aborted"
    EXPIRED = "Expired"
    ACTIVE = nonmember((QUEUED, STARTING, RUNNING))
    TERMINAL = nonmember((COMPLETED, FAILED, ABORTED, EXPIRED))
    ALL = nonmember((QUEUED, STARTING, RUNNING, COMPLETED, FAILED, ABORTED, EXPIRED))


class JobStatus(StrEnum):
    QUEUED = "Queued"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    ABORTED = "Aborted"
    EXPIRED = "Expired"
    ACTIVE = nonmember((QUEUED, RUNNING))
    ALL = nonmember((QUEUED, RUNNING, COMPLETED, FAILED, ABORTED, EXPIRED))


class FailureClass(StrEnum):
    TEST = "test"
    TIMEOUT = "timeout"
    INFRA = "infra"
    ALL = nonmember((TEST, TIMEOUT, INFRA))


# The only moves an HQE makes (both sides check them): nothing leaves a terminal status.
HQE_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    HQEStatus.QUEUED: frozenset({HQEStatus.STARTING, HQEStatus.RUNNING, *HQEStatus.TERMINAL}),
    HQEStatus.STARTING: frozenset({HQEStatus.RUNNING, *HQEStatus.TERMINAL}),
    HQEStatus.RUNNING: frozenset(HQEStatus.TERMINAL),
}


def hqe_can_move(old: str, new: str) -> bool:
    return new in HQE_TRANSITIONS.get(old, frozenset())


# Discovered hosts (docs/design.md, "Capacity that registers itself").
class HostOrigin(StrEnum):
    DECLARED = "declared"
    DISCOVERED = "discovered"
    ALL = nonmember((DECLARED, DISCOVERED))


# FLEETSHARD_ROLE: the settings this process plays (server/settings/); the first is the default.
ROLES: Final = ("master", "shard")

PRIORITY_NAMES: Final = {"low": 10, "default": 40, "high": 70, "super": 80}
DEFAULT_PRIORITY: Final = PRIORITY_NAMES["default"]
# A job's defaults when its submitter gives none: expire after a day queued, kill after an hour running.
DEFAULT_TIMEOUT_MINS: Final = 1440
DEFAULT_MAX_RUNTIME_MINS: Final = 60


def derive_job_status(hqe_statuses: list[str]) -> JobStatus:
    """A job's status follows from its HQEs: Queued or Running while any is active, else Completed or the
    worst end among them (Failed, then Aborted, then Expired)."""
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
            return JobStatus(status)
    return JobStatus.FAILED


# The keyval that says which revision a job measures (`job create --revision`); results carry it.
REVISION_KEYVAL = "revision"

# A/B comparisons (common/stats.py): fewer timings than this on either side give no verdict. With
# three a side, Mann-Whitney's smallest two-sided p is 0.1, so no change could ever be found; four is
# the least that can show one.
AB_MIN_RUNS = 4
AB_DEFAULT_MIN_CHANGE_PCT = 2.0
