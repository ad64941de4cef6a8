"""Storing one result file: parse, refuse duplicates, store the run and its entries, and mark the
series the run touched for the regression detector. The upload endpoint and the tests call it."""

import hashlib
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from common.bulk import bulk_insert
from common.constants import MAX_RESULT_FILES_PER_RUN, MAX_RESULT_REASON_CHARS
from common.errors import FleetshardError
from common.models import HostQueueEntry, Shard
from common.wire import clean_text
from master.audit import ActingUser, record
from master.results.detection import mark_dirty
from master.results.formats import ParsedRun, ResultFormatError, parse_result_file
from master.results.formats.records import clean_info
from master.results.models import RejectedResult, TestEntry, TestRun

BOARD_PREFIX = "board:"
# A file the shard never sent has no digest: the master never saw its bytes.
UNSENT_DIGEST = ""


@dataclass(frozen=True)
class StoredRun:
    run: TestRun
    created: bool


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def board_label(labels: list[str]) -> str:
    """The label a series is split by: the host's first `board:*` label, else ""."""
    return next((name for name in sorted(labels) if name.startswith(BOARD_PREFIX)), "")


ENTRY_FIELDS = [
    "run",
    "test",
    "entry",
    "label",
    "start",
    "wall_time_s",
    "cpu_time_s",
    "iterations",
    "throughput",
    "extras",
]


@transaction.atomic
def store_result_file(
    data: bytes,
    name: str,
    *,
    hqe: HostQueueEntry | None = None,
    shard: Shard | None = None,
    acting_user: ActingUser,
) -> StoredRun:
    """Stores one result file, once: the same bytes for the same test and start return the run stored
    before (created False), also when two identical uploads race. A file from a shard comes with its
    HQE (checked by the caller to be the shard's) and links the run to the job and host; a person's
    upload (`acting_user`) is audited as `result.upload`. The series it touched are marked for the
    regression detector (master.results.detection), which runs after, outside this request. Raises
    ResultFormatError for a malformed file, storing nothing.

    A new file costs one query per row it writes (run, entries, dirty series, audit), whatever its
    number of entries: the entries go in one statement, unpacked from JSON by the database."""
    parsed = parse_result_file(name, data)
    digest = digest_of(data)
    labels: list[str] = []
    host = hqe.host if hqe is not None else None
    if host is not None:
        labels = sorted(host.labels.values_list("name", flat=True))
    run = TestRun(
        test=parsed.test,
        start=parsed.start,
        info=clean_info(dict(parsed.info)),
        format=parsed.format,
        digest=digest,
        label=board_label(labels),
        labels=labels,
        job_id=hqe.job_id if hqe is not None else None,
        hqe=hqe,
        host=host,
        shard=shard,
        uploaded_by=acting_user if shard is None and isinstance(acting_user, User) else None,
        entry_count=len(parsed.entries),
    )
    try:
        # Insert first, look up only on a clash: a new file (the usual case) costs no lookup. The
        # savepoint rolls back this insert only, for a file stored before or by a racing upload.
        with transaction.atomic():
            run.save(force_insert=True)
    except IntegrityError:
        existing = _existing(parsed, digest)
        if existing is None:
            raise
        return existing
    bulk_insert(
        TestEntry,
        [
            {
                "run": run.id,
                "test": run.test,
                "entry": e.name,
                "label": run.label,
                "start": run.start,
                "wall_time_s": e.wall_time_s,
                "cpu_time_s": e.cpu_time_s,
                "iterations": e.iterations,
                "throughput": e.throughput,
                "extras": clean_info(dict(e.extras)),
            }
            for e in parsed.entries
        ],
        ENTRY_FIELDS,
    )
    mark_dirty(run.id)
    if shard is None:
        record(
            "result.upload",
            acting_user=acting_user,
            targets=[run],
            details={"run": run.id, "test": run.test, "start": run.start.isoformat(), "file": name},
        )
    return StoredRun(run, True)


def _existing(parsed: ParsedRun, digest: str) -> StoredRun | None:
    found = TestRun.objects.select_related("host", "shard").filter(test=parsed.test, start=parsed.start, digest=digest)
    run = found.first()
    return StoredRun(run, False) if run is not None else None


@transaction.atomic
def record_rejection(hqe: HostQueueEntry, name: str, data: bytes, error: ResultFormatError) -> RejectedResult:
    """Keeps why a shard's file for `hqe` was refused, once per (HQE, file name, content)."""
    rejection, _ = RejectedResult.objects.get_or_create(
        hqe=hqe, name=name[:255], digest=digest_of(data), defaults={"reason": str(error)}
    )
    return rejection


@dataclass(frozen=True)
class RecordedRejection:
    rejection: RejectedResult
    created: bool


@transaction.atomic
def record_shard_quarantine(hqe: HostQueueEntry, name: str, reason: str) -> RecordedRejection:
    """Keeps a file the shard set aside without sending it (a link, too large, over the per-run cap),
    once per (HQE, file name): a shard retrying after a lost answer changes nothing. The caller checked
    that the shard owns `hqe`. The job chose the name, and a shard's words are input too, so both are
    cleaned and bounded, and an HQE takes at most MAX_RESULT_FILES_PER_RUN such reports."""
    name = clean_text(name)[:255]
    reason = clean_text(reason).strip()[:MAX_RESULT_REASON_CHARS]
    if not reason:
        raise FleetshardError(
            f"reason: say why the file was quarantined (1-{MAX_RESULT_REASON_CHARS} characters)", field="reason"
        )
    existing = RejectedResult.objects.filter(hqe=hqe, name=name, digest=UNSENT_DIGEST).first()
    if existing is not None:
        return RecordedRejection(existing, False)
    if RejectedResult.objects.filter(hqe=hqe, digest=UNSENT_DIGEST).count() >= MAX_RESULT_FILES_PER_RUN:
        raise FleetshardError(
            f"hqe: HQE {hqe.id} has {MAX_RESULT_FILES_PER_RUN} quarantined files reported already", field=None
        )
    try:
        with transaction.atomic():  # a savepoint: a racing retry's insert loses, the first one stands
            rejection = RejectedResult.objects.create(hqe=hqe, name=name, digest=UNSENT_DIGEST, reason=reason)
    except IntegrityError:
        return RecordedRejection(RejectedResult.objects.get(hqe=hqe, name=name, digest=UNSENT_DIGEST), False)
    return RecordedRejection(rejection, True)
