"""Storing one result file: parse, refuse duplicates, store the run and its entries, and mark the
series the run touched for the regression detector. The upload endpoint and the tests call it."""

import hashlib
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import DataError, IntegrityError, transaction

from common.bulk import bulk_insert
from common.constants import MAX_RESULT_FILES_PER_RUN, MAX_RESULT_REASON_CHARS, REVISION_KEYVAL
from common.errors import FleetshardError, NotFound
from common.models import HostQueueEntry, Shard
from common.result_formats import ParsedRun, ResultFormatError, parse_result_file
from common.result_formats.records import clean_info
from common.wire import clean_text
from master.access.audit import ActingUser, record
from master.results.detection import mark_dirty
from master.results.models import NAME_CHARS, RejectedResult, TestEntry, TestRun
from master.services.hqe_guard import hold_hqe

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


def store_result_file(
    data: bytes,
    name: str,
    *,
    hqe: HostQueueEntry | None = None,
    shard: Shard | None = None,
    acting_user: ActingUser,
    variant: str = "",
    repeat: int | None = None,
) -> StoredRun:
    """Stores one result file, once: the same bytes for the same test and start return the run stored
    before (created False), also when two identical uploads race. A file from a shard comes with its
    HQE (checked by the caller to be the shard's) and links the run to the job and host; a person's
    upload (`acting_user`) is audited as `result.upload`. The series it touched are marked for the
    regression detector (master.results.detection), which runs after, outside this request. Raises
    ResultFormatError for a malformed file, storing nothing.

    A file is one run per HQE: the same bytes from two HQEs (two shards that ran the same file, say)
    are two runs, each credited to its own job, host and series. Raises NotFound (field `hqe`) when
    the HQE is gone (purged) by the time it is written; a value the database still refuses (its own
    range checks) is a ResultFormatError too, never a 500.

    A new file costs one query per row it writes (run, entries, dirty series, audit), whatever its
    number of entries: the entries go in one statement, unpacked from JSON by the database."""
    parsed = parse_result_file(name, data)
    if hqe is not None and (variant or repeat is not None):
        _check_tags(hqe, name, variant, repeat)
    try:
        # Its own transaction (a savepoint inside the caller's): a refused value rolls back only it.
        with transaction.atomic():
            if hqe is not None and not hold_hqe(hqe.id):
                raise NotFound(f"hqe: unknown HQE {hqe.id}", field="hqe")
            return _store(
                parsed, data, name, hqe=hqe, shard=shard, acting_user=acting_user, variant=variant, repeat=repeat
            )
    except DataError as exc:
        reason = " ".join(str(exc).split("\n")[0].split())[:300]
        raise ResultFormatError(name, "", f"a value cannot be stored: {reason}") from None


def _check_tags(hqe: HostQueueEntry, name: str, variant: str, repeat: int | None) -> None:
    """A run's A/B tags must be of its job's plan: the tags come from the file's name, which the job
    chose (a plain job's `ab-1-x--a.json`, or a variant or repeat its plan never had)."""
    plan = hqe.job.ab or {}
    variants = plan.get("variants") or []
    if not variants:
        raise ResultFormatError(name, "variant", f"job {hqe.job_id} is no A/B job: its file names may not start ab-N-")
    if variant not in variants:
        raise ResultFormatError(
            name, "variant", f"{variant!r} is not a variant of job {hqe.job_id} ({', '.join(variants)})"
        )
    most = plan.get("repeat")
    if repeat is None or (isinstance(most, int) and repeat > most):
        raise ResultFormatError(name, "repeat", f"job {hqe.job_id} runs at most {most} repeats, not {repeat}")


def _store(
    parsed: ParsedRun,
    data: bytes,
    name: str,
    *,
    hqe: HostQueueEntry | None,
    shard: Shard | None,
    acting_user: ActingUser,
    variant: str,
    repeat: int | None,
) -> StoredRun:
    digest = digest_of(data)
    # A shard's file without its HQE is under no unique rule: looked up first instead.
    if hqe is None and shard is not None and (before := _existing(parsed, digest, None, shard)) is not None:
        return before
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
        revision=revision_of(hqe, parsed),
        variant=variant,
        repeat=repeat,
    )
    try:
        # Insert first, look up only on a clash: a new file (the usual case) costs no lookup. The
        # savepoint rolls back this insert only, for a file stored before or by a racing upload.
        with transaction.atomic():
            run.save(force_insert=True)
    except IntegrityError:
        existing = _existing(parsed, digest, hqe, shard)
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


def revision_of(hqe: HostQueueEntry | None, parsed: ParsedRun) -> str:
    """What the run measured: the job's `revision` keyval (`job create --revision`), else the
    `commitId.hash` a TestResults file names; "" when neither says."""
    keyval = hqe.job.keyvals.get(REVISION_KEYVAL) if hqe is not None and isinstance(hqe.job.keyvals, dict) else None
    if not isinstance(keyval, str) or not keyval:
        commit = parsed.info.get("commitId")
        keyval = commit.get("hash") if isinstance(commit, dict) else None
    return clean_text(keyval)[:NAME_CHARS] if isinstance(keyval, str) else ""


def _existing(parsed: ParsedRun, digest: str, hqe: HostQueueEntry | None, shard: Shard | None) -> StoredRun | None:
    """The run stored before for the same file: of the same HQE (a shard's), or among people's uploads."""
    found = TestRun.objects.select_related("host", "shard").filter(test=parsed.test, start=parsed.start, digest=digest)
    found = found.filter(hqe=hqe) if hqe is not None else found.filter(hqe__isnull=True, shard=shard)
    run = found.first()
    return StoredRun(run, False) if run is not None else None


@transaction.atomic
def record_rejection(hqe: HostQueueEntry, name: str, data: bytes, error: ResultFormatError) -> RejectedResult:
    """Keeps why a shard's file for `hqe` was refused, once per (HQE, file name, content). The reason
    quotes the job's keys and names: cleaned and bounded, so the record of a refusal always stores."""
    reason = clean_text(str(error))[:MAX_RESULT_REASON_CHARS]
    if not hold_hqe(hqe.id):
        raise NotFound(f"hqe: unknown HQE {hqe.id}", field="hqe")
    rejection, _ = RejectedResult.objects.get_or_create(
        hqe=hqe, name=clean_text(name)[:255], digest=digest_of(data), defaults={"reason": reason}
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
    if not hold_hqe(hqe.id):
        raise NotFound(f"hqe: unknown HQE {hqe.id}", field="hqe")
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
