"""The master's side of the heartbeat: check the shard's instance, apply its updates, answer with what
it lacks (docs/protocol.md).

Every step works on whole sets (one query per kind of row), so the number of SQL queries stays the
same whatever the numbers of hosts, jobs and updates. The shard's row lock serialises a shard's
heartbeats, so a retry racing its original applies and assigns nothing twice.
"""

import functools
import itertools
import json
import logging
import os
import re
import weakref
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from common.bulk import bulk_set
from common.constants import (
    MAX_HOSTS_PER_RESPONSE,
    MAX_JOBS_PER_RESPONSE,
    FailureClass,
    HostStatus,
    HQEStatus,
    JobStatus,
    hqe_can_move,
)
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry, Job, Label, Shard, offline_after_s
from common.wire import (
    ID_MAX,
    Ack,
    HeartbeatRequest,
    HeartbeatResponse,
    HostEvent,
    HostRecord,
    HQERecord,
    JobRecord,
    RejectedUpdate,
    Update,
    format_time,
)
from master.notify import events as notify_events
from master.sync.discovery import apply_discovery
from master.sync.discovery import discovers as _discovers
from master.timeline.recording import HostChange, close_open_intervals, record_host_changes, record_runs

log = logging.getLogger(__name__)

HQE_FIELDS = ["status", "failure", "exit_code", "started_on", "finished_on", "log_tail", "last_seq", "host"]
# A host event this far ahead of the master's clock is a broken clock, not a time to record.
MAX_EVENT_LEAD = timedelta(days=1)
REPLACED_NOTE = "\n[fleetshard] the shard's database was replaced (a new instance took over): infra failure\n"


class UpdateRejected(Exception):
    pass


class ShardGone(Exception):
    """The shard was deleted while its heartbeat was on its way (its token went with it): a 401."""


class InstanceConflict(Exception):
    """Another instance of the shard is live: this one must run nothing (a 409)."""

    def __init__(self, message: str, heard_s_ago: float) -> None:
        super().__init__(message)
        self.message = message
        self.heard_s_ago = heard_s_ago


class RolledBack(Exception):
    """The instance on record counts seqs from below one it has sent: its database was restored in
    place from a backup and must take a new instance (a 409)."""

    def __init__(self, message: str, seq_seen: int) -> None:
        super().__init__(message)
        self.message = message
        self.seq_seen = seq_seen


def _apply_one(
    update: Update,
    hqe: dict[str, Any] | None,
    shard: Shard,
    shard_host_ids: set[int],
    job_hosts: dict[int, dict[int, int]] | None = None,
) -> bool:
    """Applies an update to the in-memory `hqe`; True if it changed, False for a duplicate.

    `job_hosts` maps each job to the hosts its HQEs name (host -> HQE id): a job never uses a host
    twice (a meta-host job's N HQEs run on N hosts), whatever a shard reports."""
    if hqe is None:
        raise UpdateRejected(f"hqe {update.hqe} does not exist")
    if hqe["shard_id"] != shard.id:
        raise UpdateRejected(f"job {hqe['job_id']} is not assigned to shard {shard.hostname}")
    if update.job is not None and update.job != hqe["job_id"]:
        raise UpdateRejected(f"hqe {update.hqe} belongs to job {hqe['job_id']}, not {update.job}")
    if update.seq <= hqe["last_seq"]:
        return False
    if not hqe_can_move(hqe["status"], update.status):
        already = "already " if hqe["status"] in HQEStatus.TERMINAL else ""
        raise UpdateRejected(f"hqe {update.hqe} is {already}{hqe['status']}; it cannot become {update.status}")
    changes: dict[str, Any] = {"status": update.status, "last_seq": update.seq, "failure": update.failure}
    for key in ("exit_code", "started_on", "finished_on", "log_tail"):
        value = getattr(update, key)
        if value is not None:
            changes[key] = value
    if update.at is not None:
        # A client that sends when a change happened but not the start or end it made.
        if update.status in (HQEStatus.STARTING, HQEStatus.RUNNING) and hqe["started_on"] is None:
            changes.setdefault("started_on", update.at)
        if update.status in HQEStatus.TERMINAL:
            changes.setdefault("finished_on", update.at)
    if update.host is not None and update.host != hqe["host"]:
        # Only a host of this shard, or the one the HQE already names or ran on. An HQE ending is
        # never refused for its host (nothing may stay active because a host moved): the host is kept.
        used = (job_hosts or {}).get(hqe["job_id"], {})
        other = used.get(update.host)
        if update.host in shard_host_ids and other in (None, hqe["id"]):
            changes["host"] = update.host
        elif update.status not in HQEStatus.TERMINAL:
            if other not in (None, hqe["id"]):
                raise UpdateRejected(f"job {hqe['job_id']} already has host {update.host} (hqe {other})")
            raise UpdateRejected(f"host {update.host} is not a host of shard {shard.hostname}")
    if "host" in changes and job_hosts is not None:
        used = job_hosts.setdefault(hqe["job_id"], {})
        used.pop(hqe["host"], None)
        used[changes["host"]] = hqe["id"]
    hqe.update(changes)
    return True


def _apply_updates(shard: Shard, updates: list[Update | RejectedUpdate], host_ids: set[int]) -> tuple[list[Ack], int]:
    ids = {u.hqe for u in updates if isinstance(u, Update)}
    # The updated HQEs, and in the same query the hosts their jobs' other HQEs name.
    siblings = Q(job_id__in=HostQueueEntry.objects.filter(id__in=ids).values("job_id"), host_id__isnull=False)
    rows = HostQueueEntry.objects.filter(Q(id__in=ids) | siblings).values(
        "id", "job_id", "host_id", *[f for f in HQE_FIELDS if f != "host"], shard_id=F("job__shard_id")
    )
    hqes: dict[int, dict[str, Any]] = {}
    job_hosts: dict[int, dict[int, int]] = {}
    for row in rows:
        row["host"] = row.pop("host_id")
        if row["host"] is not None:
            job_hosts.setdefault(row["job_id"], {})[row["host"]] = row["id"]
        if row["id"] in ids:
            hqes[row["id"]] = row
    acks, changed, applied = [], set(), 0
    for update in updates:
        if isinstance(update, RejectedUpdate):
            acks.append(Ack(update.seq, "rejected", update.error))
            continue
        hqe = hqes.get(update.hqe)
        try:
            if _apply_one(update, hqe, shard, host_ids, job_hosts):
                changed.add(update.hqe)
                applied += 1
            acks.append(Ack(update.seq, "accepted"))
        except UpdateRejected as exc:
            acks.append(Ack(update.seq, "rejected", str(exc)))
    bulk_set(HostQueueEntry, [hqes[i] for i in changed], HQE_FIELDS)
    record_runs([hqes[i] for i in changed])
    refresh_job_statuses({hqes[i]["job_id"] for i in changed})
    notify_events.jobs_ended(hqes[i]["job_id"] for i in changed if hqes[i]["status"] in HQEStatus.TERMINAL)
    return acks, applied


def _record_host_events(shard: Shard, events: list[HostEvent | RejectedUpdate], host_ids: set[int]) -> list[Ack]:
    """The shard's host status changes become its hosts' Cleaning and Repairing intervals, all in a
    fixed number of queries; an event of a host that is not the shard's is rejected alone."""
    acks, changes = [], []
    now = timezone.now()
    # And one older than FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS, one the timeline no longer takes: a shard
    # whose clock started at 1970, an outbox held back for longer than anyone reads a timeline of. It
    # bounds what a replay reads of a host's history too.
    max_age = settings.FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS
    latest, earliest = now + MAX_EVENT_LEAD, now - timedelta(days=max_age)
    for event in events:
        if isinstance(event, RejectedUpdate):
            acks.append(Ack(event.seq, "rejected", event.error))
        elif event.at > latest:
            ahead = f"at: {format_time(event.at)} is more than a day ahead of the master's clock"
            acks.append(Ack(event.seq, "rejected", ahead))
        elif event.at < earliest:
            behind = f"at: {format_time(event.at)} is more than {max_age:g} days behind the master's clock"
            acks.append(Ack(event.seq, "rejected", behind))
        elif event.host not in host_ids:
            acks.append(Ack(event.seq, "rejected", f"host {event.host} is not a host of shard {shard.hostname}"))
        else:
            changes.append(HostChange(event.host, event.status, event.at, shard.id))
            acks.append(Ack(event.seq, "accepted"))
    record_host_changes(changes)
    return acks


def _check_instance(shard: Shard, req: HeartbeatRequest, now: datetime) -> bool:
    """Whether this heartbeat's instance replaces another; raises InstanceConflict while that one is
    live, and RolledBack when it is the one on record but its seqs went back."""
    instance = req.instance
    if shard.instance == instance:
        if req.last_seq is not None and req.last_seq < shard.seq_seen:
            log.warning(
                "shard %s: instance %s refused; its last seq is %d, below the %d it sent before",
                shard.hostname,
                instance,
                req.last_seq,
                shard.seq_seen,
            )
            raise RolledBack(
                f"shard {shard.hostname}'s database went back in time: its last seq is {req.last_seq}, but "
                f"this instance ({instance}) has sent seq {shard.seq_seen} (a backup restored in place?); "
                "it must take a new instance id, which the master takes as a new database",
                shard.seq_seen,
            )
        return False
    if not shard.instance:
        return False
    silence = offline_after_s()
    heard = (now - shard.last_heartbeat).total_seconds() if shard.last_heartbeat else None
    if heard is not None and heard < silence:
        log.warning(
            "shard %s: instance %s refused; instance %s was heard %.1f s ago",
            shard.hostname,
            instance,
            shard.instance,
            heard,
        )
        raise InstanceConflict(
            f"shard {shard.hostname} is running from another database (instance {shard.instance}, heard "
            f"{heard:.1f} s ago); this one ({instance}) may take over once that one has been silent for "
            f"{silence:g} s",
            heard,
        )
    return True


def _adopt(shard: Shard, instance: str, now: datetime) -> None:
    """A new database for the shard: what the old one had started cannot be finished by anyone."""
    active = HostQueueEntry.objects.filter(job__shard=shard, status__in=(HQEStatus.STARTING, HQEStatus.RUNNING))
    job_ids = set(active.values_list("job_id", flat=True))
    failed = active.update(
        status=HQEStatus.FAILED, failure=FailureClass.INFRA, finished_on=now, log_tail=REPLACED_NOTE.strip()
    )
    # Seqs are counted afresh for the new instance, and everything it may hold is sent to it anew
    # (a copy could hold an HQE still queued that ran meanwhile; the resent job says it ended).
    HostQueueEntry.objects.filter(job__shard=shard).update(last_seq=0)
    refresh_job_statuses(job_ids)
    notify_events.jobs_ended(job_ids)
    close_open_intervals(shard, now)
    Job.objects.filter(shard=shard, status__in=JobStatus.ACTIVE).update(version=F("version") + 1)
    Host.objects.filter(shard=shard).update(version=F("version") + 1)
    log.warning(
        "shard %s: instance %s replaces %s (silent); %d started HQEs failed as infra",
        shard.hostname,
        instance,
        shard.instance,
        failed,
    )


def _rows(sql: str, ids: list[int], *params: Any) -> list[tuple[Any, ...]]:
    """The rows of `sql`, whose `{ids}` takes the list `ids` and whose other `%s` take `params` after it.
    Written out: building these through the ORM (models, prefetches, IN lists of thousands of
    parameters) was nearly all of a cold sync's time (docs/protocol.md, "Cost")."""
    with connection.cursor() as cursor:
        cursor.execute(sql.format(ids=", ".join(["%s"] * len(ids))), [*ids, *params])
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows


def _json(value: Any) -> Any:
    """A JSON column's value as a raw cursor gives it (text on both databases); most are empty."""
    if value == "{}":
        return {}
    if value == "[]":
        return []
    return json.loads(value) if isinstance(value, str) else value


@functools.cache
def _record_sql(vendor: str) -> dict[str, str]:
    q = connection.ops.quote_name
    host, job, hqe, label = (q(m._meta.db_table) for m in (Host, Job, HostQueueEntry, Label))
    host_labels, job_labels = q(Host.labels.through._meta.db_table), q(Job.dependency_labels.through._meta.db_table)
    running_elsewhere = f"SELECT e.host_id FROM {hqe} e JOIN {job} j ON j.id = e.job_id WHERE"
    busy = "AND e.status IN (%s, %s) AND (j.shard_id IS NULL OR j.shard_id <> %s)"
    host_rows = (
        f"SELECT h.id, h.version, h.hostname, h.locked, h.lock_reason, h.attributes, l.name FROM {host} h "
        f"LEFT JOIN {host_labels} t ON t.host_id = h.id LEFT JOIN {label} l ON l.id = t.label_id WHERE"
    )
    return {
        "elsewhere": f"{running_elsewhere} e.host_id IN ({{ids}}) {busy}",
        "hosts": f"{host_rows} h.id IN ({{ids}}) ORDER BY h.id",
        # The same for every host of a shard (a cold sync): a list of their ids costs PostgreSQL more to
        # parse and look up than the shard's range of an index.
        "shard_elsewhere": f"{running_elsewhere} e.host_id IN (SELECT id FROM {host} WHERE shard_id = %s) {busy}",
        "shard_hosts": f"{host_rows} h.shard_id = %s ORDER BY h.id",
        "jobs": "SELECT j.id, j.version, j.name, j.owner, j.priority, j.command, j.timeout_mins, j.max_runtime_mins, "
        f"j.keyvals, j.parent_id, j.aborted, j.created_on, j.ab, j.inputs, p.keyvals, l.name FROM {job} j "
        f"LEFT JOIN {job} p ON p.id = j.parent_id LEFT JOIN {job_labels} t ON t.job_id = j.id "
        f"LEFT JOIN {label} l ON l.id = t.label_id WHERE j.id IN ({{ids}})",
        "hqes": f"SELECT e.job_id, e.id, e.host_id, l.name, e.status FROM {hqe} e LEFT JOIN {label} l "
        "ON l.id = e.meta_host_id WHERE e.job_id IN ({ids}) ORDER BY e.id",
    }


def host_records(host_ids: list[int], *, all_of_shard: int | None = None) -> list[HostRecord]:
    """The hosts' records, by id: a row per host and label. `all_of_shard`: the hosts are every host of
    that shard (read by the shard, keeping only `host_ids`)."""
    if not host_ids:
        return []
    sql = _record_sql(connection.vendor)
    if all_of_shard is None:
        rows = _rows(sql["hosts"], host_ids)
    else:
        wanted = set(host_ids)
        rows = [row for row in _rows(sql["shard_hosts"], [], all_of_shard) if row[0] in wanted]
    records: list[HostRecord] = []
    for host_id, version, hostname, locked, lock_reason, attributes, label in rows:
        if not records or records[-1].id != host_id:
            attributes = _json(attributes)
            records.append(
                HostRecord(
                    id=host_id,
                    version=version,
                    hostname=hostname,
                    labels=[],
                    locked=bool(locked),
                    lock_reason=lock_reason,
                    attributes=attributes if isinstance(attributes, dict) else {},
                )
            )
        if label is not None:
            records[-1].labels.append(label)
    for record in records:
        record.labels.sort()
    return records


def job_records(job_ids: list[int]) -> tuple[list[JobRecord], dict[str, dict[str, Any]]]:
    """The jobs' records in `job_ids`' order, and the keyvals of their suites (by the suite's id). A job
    deleted since its id was read is left out, not a KeyError: the quiet path reads the holdings and
    then the records outside any one transaction."""
    if not job_ids:
        return [], {}
    sql = _record_sql(connection.vendor)
    hqes: dict[int, list[HQERecord]] = {}
    for job_id, hqe_id, host_id, meta_host, status in _rows(sql["hqes"], job_ids):
        hqes.setdefault(job_id, []).append(
            HQERecord(id=hqe_id, host_id=host_id if meta_host is None else None, meta_host=meta_host, status=status)
        )
    found: dict[int, JobRecord] = {}
    suite_keyvals: dict[str, dict[str, Any]] = {}
    for row in _rows(sql["jobs"], job_ids):  # a row per job and dependency label
        job_id, label = row[0], row[-1]
        if job_id in found:
            found[job_id].dependency_labels.append(label)
            continue
        version, name, owner, priority, command, timeout_mins, max_runtime_mins, keyvals = row[1:9]
        parent_id, aborted, created_on, ab, inputs, parent_keyvals = row[9:15]
        keyvals, ab, inputs, parent_keyvals = _json(keyvals), _json(ab), _json(inputs), _json(parent_keyvals)
        found[job_id] = JobRecord(
            id=job_id,
            version=version,
            name=name,
            owner=owner,
            priority=priority,
            command=command,
            timeout_mins=timeout_mins,
            max_runtime_mins=max_runtime_mins,
            dependency_labels=[] if label is None else [label],
            keyvals=keyvals if isinstance(keyvals, dict) else {},
            parent_id=parent_id,
            aborted=bool(aborted),
            created_on=_aware(created_on),
            ab=ab if isinstance(ab, dict) else {},
            hqes=hqes.get(job_id, []),
            inputs=inputs if isinstance(inputs, list) else [],
        )
        if parent_id is not None and isinstance(parent_keyvals, dict):
            suite_keyvals[str(parent_id)] = parent_keyvals
    for record in found.values():
        record.dependency_labels.sort()
    return [found[i] for i in job_ids if i in found], suite_keyvals


def _aware(value: Any) -> datetime | None:
    """A datetime column's value as a raw cursor gives it, aware as the ORM gives it. PostgreSQL's is
    aware; SQLite's is in UTC but naive (the sqlite3 module's converter for a column declared
    `datetime`) or text (an expression's), made aware here as Django's own conversion does."""
    if value is None:
        return None
    when = value if isinstance(value, datetime) else parse_datetime(value)
    if when is None:
        raise ValueError(f"not a time: {value!r}")
    return when if timezone.is_aware(when) else timezone.make_aware(when, connection.timezone)


# What a heartbeat holds against the shard's known lists: its hosts (id -> version, status) and its
# active jobs (id, version, priority).
Holdings = tuple[dict[int, tuple[int, str]], list[tuple[int, int, int]]]
NOTED = (
    "last_heartbeat",
    "client_version",
    "outbox_depth",
    "known_hosts_count",
    "known_jobs_count",
    "last_updates_count",
)


@dataclass(frozen=True)
class _Statements:
    """The SQL every heartbeat runs, written once: building queries through the ORM was half of a
    heartbeat's Python (docs/protocol.md, "Cost")."""

    note: str  # the heartbeat's bookkeeping, if the instance on record sent it and its seqs did not go back
    note_new_instance: str
    instance: str  # the shard's instance on record, as a row of `holdings`' shape
    holdings: str

    @classmethod
    @functools.cache
    def of(cls, vendor: str) -> "_Statements":
        q = connection.ops.quote_name
        shard, host, job = q(Shard._meta.db_table), q(Host._meta.db_table), q(Job._meta.db_table)
        # A heartbeat that waited for the row lock took its time before a later one that did not: the
        # later time stays (never backwards).
        latest = "GREATEST({0}, %s)" if vendor == "postgresql" else "MAX(COALESCE({0}, ''), %s)"
        sets = ", ".join(
            f"{q(column)} = {latest.format(q(column))}" if column == "last_heartbeat" else f"{q(column)} = %s"
            for column in NOTED
        )
        active = ", ".join(["%s"] * len(JobStatus.ACTIVE))
        seen = q("seq_seen")
        return cls(
            note=f"UPDATE {shard} SET {sets}, {seen} = {'GREATEST' if vendor == 'postgresql' else 'MAX'}({seen}, %s) "
            f"WHERE {q('id')} = %s AND {q('instance')} = %s AND {seen} <= %s",
            note_new_instance=f"UPDATE {shard} SET {sets}, {seen} = %s, {q('instance')} = %s, "
            f"{q('instance_since')} = %s WHERE {q('id')} = %s",
            instance=f"SELECT 2, {seen}, 0, {q('instance')}, 0 FROM {shard} WHERE {q('id')} = %s",
            holdings=f"SELECT 0, {q('id')}, {q('version')}, {q('status')}, 0 FROM {host} WHERE {q('shard_id')} = %s "
            f"UNION ALL SELECT 1, {q('id')}, {q('version')}, '', {q('priority')} FROM {job} "
            f"WHERE {q('shard_id')} = %s AND {q('status')} IN ({active})",
        )


def _noted(req: HeartbeatRequest, now: datetime) -> list[Any]:
    """The values of NOTED, then the highest seq the request carries."""
    when = connection.ops.adapt_datetimefield_value(now)
    return [
        when,
        req.client_version,
        req.outbox_depth,
        len(req.known_hosts),
        len(req.known_jobs),
        len(req.updates),
        req.highest_seq,
    ]


def _note_params(shard_id: int, req: HeartbeatRequest, now: datetime) -> list[Any]:
    """`_Statements.note`'s parameters: a shard that does not say its last seq is not checked."""
    return [*_noted(req, now), shard_id, req.instance, ID_MAX if req.last_seq is None else req.last_seq]


def _holdings_of(rows: list[tuple[Any, ...]]) -> tuple[Holdings, str | None, int]:
    """The holdings in rows of `_Statements.holdings`, and the instance on record and the highest seq
    it sent, if a row says them."""
    hosts: dict[int, tuple[int, str]] = {}
    jobs: list[tuple[int, int, int]] = []
    instance, seq_seen = None, 0
    for kind, row_id, version, text, priority in rows:
        if kind == 0:
            hosts[row_id] = (version, text)
        elif kind == 1:
            jobs.append((row_id, version, priority))
        else:
            instance, seq_seen = text, row_id
    return (hosts, jobs), instance, seq_seen


# The statements a PostgreSQL connection has prepared for quiet heartbeats, by connection (a reconnect
# prepares anew): planning them took as long as running them. Names carry the process's id, so the
# processes whose connections a transaction pooler shares never take each other's.
_prepared: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_prepared_serial = itertools.count(1)
# invalid_sql_statement_name, duplicate_prepared_statement: the connection lost our statements (a
# pooler's DISCARD ALL, another server connection behind a transaction pooler) or holds the name.
_NOT_PREPARED = frozenset({"26000", "42P05"})
# Names whose statements an error may have left prepared (a lock or statement timeout after PREPARE
# ran): deallocated at the connection's next quiet heartbeat, not kept until it closes.
_orphans: "weakref.WeakKeyDictionary[Any, list[str]]" = weakref.WeakKeyDictionary()


def _deallocate_orphans(cursor: Any, raw: Any) -> None:
    names = _orphans.pop(raw, [])
    if not names:
        return
    statements = [f"{name}_{kind}" for name in names for kind in ("note", "read")]
    cursor.execute("SELECT name FROM pg_prepared_statements WHERE name = ANY(%s)", [statements])
    for (statement,) in cursor.fetchall():
        cursor.execute(f"DEALLOCATE {statement}")


def _placeholders(sql: str) -> str:
    """`sql` with its `%s` numbered `$1`, `$2`... as PREPARE takes them."""
    numbers = itertools.count(1)
    return re.sub("%s", lambda _: f"${next(numbers)}", sql)


def _quiet_heartbeat(shard_id: int, req: HeartbeatRequest, now: datetime) -> Holdings | None:
    """On PostgreSQL, a heartbeat with no updates and no host events (nearly every heartbeat of a fleet)
    notes itself and reads the holdings in one round trip: one implicit transaction, whose UPDATE takes
    the shard's row lock before its SELECT looks. It writes only what its successor writes again (host
    statuses too), so its commit does not wait for the disk: a crash of the machine can lose the note,
    never an update. Inside a caller's transaction it leaves that transaction's durability alone (the
    caller may write what must not be lost). None, having written nothing, when the instance on record
    is another.

    Its two statements are prepared once per connection. A name is taken anew after any error, since
    PostgreSQL keeps a prepared statement even when its transaction rolls back; when the error says the
    connection lacks them (or holds the name), they are prepared again at once: the failed round trip
    was one implicit transaction, rolled back whole, so nothing is noted twice."""
    sql = _Statements.of(connection.vendor)
    note, read = sql.note, f"{sql.instance} UNION ALL {sql.holdings}"
    note_params = _note_params(shard_id, req, now)
    read_params: list[Any] = [shard_id, shard_id, shard_id, *JobStatus.ACTIVE]
    marks = ", ".join(["%s"] * len(note_params)), ", ".join(["%s"] * len(read_params))
    with connection.cursor() as cursor:
        raw = connection.connection
        own_transaction = not connection.in_atomic_block
        fast = "SET LOCAL synchronous_commit TO OFF; " if own_transaction else ""
        if own_transaction and raw in _orphans:
            _deallocate_orphans(cursor, raw)
        for retry in (False, True):
            known = _prepared.get(raw)
            name, prepare = known or "", ""
            if known is None:
                name = f"fleetshard_quiet{os.getpid()}_{next(_prepared_serial)}"
                prepare = (
                    f"PREPARE {name}_note AS {_placeholders(note)}; PREPARE {name}_read AS {_placeholders(read)}; "
                )
            try:
                cursor.execute(
                    f"{prepare}{fast}EXECUTE {name}_note({marks[0]}); EXECUTE {name}_read({marks[1]})",
                    [*note_params, *read_params],
                )
            except DatabaseError as exc:
                _prepared.pop(raw, None)
                if getattr(exc.__cause__, "pgcode", None) != "42P05" and raw is not None and not raw.closed:
                    _orphans.setdefault(raw, []).append(name)
                if retry or not own_transaction or getattr(exc.__cause__, "pgcode", None) not in _NOT_PREPARED:
                    raise
                continue
            break
        _prepared[raw] = name
        holdings, instance, seq_seen = _holdings_of(cursor.fetchall())
    went_back = req.last_seq is not None and req.last_seq < seq_seen
    return holdings if instance == req.instance and not went_back else None


def _note_heartbeat(shard_id: int, req: HeartbeatRequest, now: datetime, *, same_instance: bool) -> bool:
    """Writes what the shard's list page shows of this heartbeat; False when `same_instance` and the
    instance on record is another, or its seqs went back (or the shard is gone)."""
    sql = _Statements.of(connection.vendor)
    if same_instance:
        statement, params = sql.note, _note_params(shard_id, req, now)
    else:
        when = connection.ops.adapt_datetimefield_value(now)
        statement, params = sql.note_new_instance, [*_noted(req, now), req.instance, when, shard_id]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return bool(cursor.rowcount == 1)


def _holdings(shard_id: int) -> Holdings:
    with connection.cursor() as cursor:
        cursor.execute(_Statements.of(connection.vendor).holdings, [shard_id, shard_id, *JobStatus.ACTIVE])
        return _holdings_of(cursor.fetchall())[0]


def _running_elsewhere(shard: Shard, host_ids: list[int], *, all_of_shard: bool = False) -> set[int]:
    """Of `host_ids`, those running a job of another shard: a host that came from there while it ran
    waits until the job ends, since sent now it would be a Ready host here, and the device would run
    two jobs at once."""
    if not host_ids:
        return set()
    busy = (HQEStatus.STARTING, HQEStatus.RUNNING, shard.id)
    if all_of_shard:
        rows = _rows(_record_sql(connection.vendor)["shard_elsewhere"], [], shard.id, *busy)
    else:
        rows = _rows(_record_sql(connection.vendor)["elsewhere"], host_ids, *busy)
    return {host_id for (host_id,) in rows}


def process_heartbeat(shard: Shard, req: HeartbeatRequest) -> HeartbeatResponse:
    """A heartbeat from `shard` (only its id and hostname are used: the shard's row is read and written
    under its lock)."""
    now = timezone.now()
    # Empty known lists are nearly always a new instance's first heartbeat, which the quiet path refuses.
    quiet = not req.updates and not req.host_events and not _discovers(req) and (req.known_hosts or req.known_jobs)
    if quiet and connection.vendor == "postgresql":
        holdings = _quiet_heartbeat(shard.id, req, now)
        if holdings is not None:
            return _answer(shard, req, holdings, [], replaced=False)
    return _heartbeat_in_transaction(shard, req, now)


@transaction.atomic
def _heartbeat_in_transaction(shard: Shard, req: HeartbeatRequest, now: datetime) -> HeartbeatResponse:
    """The instance on record takes the shard's row lock with the one UPDATE that notes its heartbeat;
    another instance is checked under a plain row lock first."""
    replaced = False
    if not _note_heartbeat(shard.id, req, now, same_instance=True):
        locked = Shard.objects.select_for_update().filter(id=shard.id).first()
        if locked is None:
            raise ShardGone(f"shard {shard.hostname} was deleted")
        replaced = _check_instance(locked, req, now)
        if replaced:
            _adopt(locked, req.instance, now)
        # Under the lock the instance on record may have become this one (a heartbeat of it that took
        # over meanwhile): its time is that heartbeat's.
        _note_heartbeat(shard.id, req, now, same_instance=locked.instance == req.instance)
    holdings = _holdings(shard.id)
    hosts = set(holdings[0])
    acks: list[Ack] = []
    if req.updates:
        acks, applied = _apply_updates(shard, req.updates, hosts)
        if applied:
            Shard.objects.filter(id=shard.id).update(updates_applied=F("updates_applied") + applied)
    if req.host_events:
        acks += _record_host_events(shard, req.host_events, hosts)
    if _discovers(req):
        discovered_ack = apply_discovery(shard, req, now)
        holdings = _holdings(shard.id)
        return replace(_answer(shard, req, holdings, acks, replaced=replaced), discovered_ack=discovered_ack)
    return _answer(shard, req, holdings, acks, replaced=replaced)


def _answer(
    shard: Shard, req: HeartbeatRequest, holdings: Holdings, acks: list[Ack], *, replaced: bool
) -> HeartbeatResponse:
    """Keeps the hosts' statuses as the shard reports them, and answers with what it lacks."""
    hosts, active_jobs = holdings
    known_hosts = {h.id: h.version for h in req.known_hosts}
    known_jobs = {j.id: j.version for j in req.known_jobs}
    # A Missing host (master/sync/discovery.py) stays so until the shard's discovered set holds it again: a
    # run the shard still reports on it has ended for the master.
    status_rows = [
        {"id": h.id, "status": h.status}
        for h in req.known_hosts
        if h.id in hosts and hosts[h.id][1] not in (h.status, HostStatus.MISSING)
    ]
    if status_rows:
        with transaction.atomic(savepoint=False):
            bulk_set(Host, status_rows, ["status"])
            notify_events.host_statuses((h.id, hosts[h.id][1], h.status) for h in req.known_hosts if h.id in hosts)

    newer = sorted(i for i, (version, _) in hosts.items() if known_hosts.get(i, 0) < version)
    elsewhere = _running_elsewhere(shard, newer, all_of_shard=len(newer) == len(hosts))
    send_host_ids = [i for i in newer if i not in elsewhere]
    removed_host_ids = sorted(h.id for h in req.known_hosts if h.id not in hosts)
    more = len(send_host_ids) > MAX_HOSTS_PER_RESPONSE
    send_host_ids = send_host_ids[:MAX_HOSTS_PER_RESPONSE]

    send_jobs = sorted(
        (-priority, job_id) for job_id, version, priority in active_jobs if known_jobs.get(job_id, 0) < version
    )
    if replaced:
        # A copy may hold as queued a job that has ended since: told so, it never runs it.
        ended = Job.objects.filter(shard=shard, id__in=known_jobs).exclude(status__in=JobStatus.ACTIVE)
        send_jobs += [(0, job_id) for job_id in ended.values_list("id", flat=True)]
    more = more or len(send_jobs) > MAX_JOBS_PER_RESPONSE
    send_job_ids = [job_id for _, job_id in send_jobs[:MAX_JOBS_PER_RESPONSE]]

    jobs, suite_keyvals = job_records(send_job_ids)
    return HeartbeatResponse(
        hosts=host_records(send_host_ids, all_of_shard=shard.id if len(send_host_ids) == len(hosts) else None),
        removed_host_ids=removed_host_ids,
        jobs=jobs,
        suite_keyvals=suite_keyvals,
        acks=acks,
        more=more,
        heartbeat_interval_s=settings.FLEETSHARD_HEARTBEAT_INTERVAL_S,
    )
