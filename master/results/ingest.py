"""Storing one result file: parse, refuse duplicates, store the run and its entries, and mark the
series the run touched for the regression detector. The upload endpoint and the tests call it."""

import hashlib
import io
import re
from dataclasses import dataclass

import orjson
from django.contrib.auth.models import User
from django.db import DataError, IntegrityError, connection, transaction

from common.bulk import bulk_insert
from common.constants import MAX_RESULT_FILES_PER_RUN, MAX_RESULT_REASON_CHARS, REVISION_KEYVAL
from common.errors import FleetshardError, NotFound
from common.models import HostQueueEntry, Shard
from common.result_formats import ParsedEntry, ParsedRun, ResultFormatError, parse_result_file
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
    number of entries: the entries go in one statement (PostgreSQL: a COPY, see _copy_entries; SQLite:
    an INSERT unpacking one JSON parameter)."""
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
    if connection.vendor == "postgresql":
        _copy_entries(run, parsed.entries)
    else:
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
                    "extras": clean_info(dict(e.extras)) if e.extras else {},
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


# COPY's text format: a backslash, tab, newline or carriage return in a value must be escaped.
_COPY_SPECIAL = re.compile(r"[\\\t\n\r]")
_NULL = "\\N"
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_COPY_COLUMNS = (
    "run_id",
    "test",
    "label",
    "start",
    "entry",
    "wall_time_s",
    "cpu_time_s",
    "iterations",
    "throughput",
    "extras",
)


def _copy_value(text: str) -> str:
    return text.translate(_COPY_ESCAPES) if _COPY_SPECIAL.search(text) else text


def _copy_text(run: TestRun, entries: tuple[ParsedEntry, ...]) -> bytes:
    """The COPY rows of a run's entries, in _COPY_COLUMNS' order, as UTF-8 (the parsers left no NUL
    or lone surrogate in any name or extra)."""
    # The run's columns are the same on every row: written once, as the line's start.
    head = "\t".join((str(run.id), _copy_value(run.test), _copy_value(run.label), run.start.isoformat(), ""))
    special = _COPY_SPECIAL.search
    lines = []
    for name, wall, cpu, iterations, throughput, extras in entries:
        if special(name):
            name = _copy_value(name)
        # repr of a finite float reads back exactly as float8 (the parsers refused NaN and infinities).
        # `+ 0.0` turns -0.0 (which the parsers take: it is not below 0) into 0.0, as the INSERT through
        # JSON always stored it (jsonb's numbers have no negative zero), and as SQLite stores it.
        lines.append(
            f"{head}{name}\t{_NULL if wall is None else repr(wall + 0.0)}\t"
            f"{_NULL if cpu is None else repr(cpu + 0.0)}\t{_NULL if iterations is None else iterations}\t"
            f"{_NULL if throughput is None else repr(throughput + 0.0)}\t"
            f"{_copy_value(orjson.dumps(clean_info(dict(extras))).decode()) if extras else '{}'}\n"
        )
    return "".join(lines).encode()


def _copy_entries(run: TestRun, entries: tuple[ParsedEntry, ...]) -> None:
    """Writes a new run's entries with one COPY (PostgreSQL), the text built here from the parsed
    entries: no per-row objects, no JSON the database has to unpack. Idempotency needs nothing of
    it: the run's insert is what a second copy of the file clashes with, before any entry is written.
    A value the database refuses raises django.db.DataError, like a refused INSERT."""
    if not entries:
        return  # no statement for no rows, as bulk_insert on SQLite
    qn = connection.ops.quote_name
    body = io.BytesIO(_copy_text(run, entries))
    sql = (
        f"COPY {qn(TestEntry._meta.db_table)} ({', '.join(qn(c) for c in _COPY_COLUMNS)}) FROM STDIN"
        " WITH (FORMAT text, ENCODING 'UTF8')"
    )
    # Django logs the COPY as one query when it logs queries (so query-count pins see it), but does
    # not turn psycopg2's errors into its own for it: wrapped here, so a refused value is a DataError.
    with connection.cursor() as cursor, connection.wrap_database_errors:
        cursor.copy_expert(sql, body, 1 << 20)


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
