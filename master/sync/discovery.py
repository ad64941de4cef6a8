"""The master's side of discovery: a shard's whole discovered set, applied once per generation
(docs/design.md, "Capacity that registers itself"; docs/protocol.md, "discovered").

A set is hostile input: each record is judged alone and a refused one comes back in the ack with its
reason, touching nothing. Applying costs a fixed number of queries whatever the set's size (each kind of
row is read and written as a whole set), so 10,000 hosts cost what 10 do.
"""

import functools
import json
import logging
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet, TextField
from django.db.models.functions import Cast, Lower

from common.bulk import bulk_insert, bulk_set
from common.constants import FailureClass, HostOrigin, HostStatus, HQEStatus
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry, Job, Label, Shard
from common.wire import MAX_REJECTED_REASON_CHARS, DiscoveredAck, DiscoveredSet, HeartbeatRequest, Pool, Rejection
from master.models import AuditRecord, AuditTarget
from master.notify import events as notify_events
from master.services.shared import NAME_RULE, valid_name

log = logging.getLogger(__name__)

MAX_LABELS_PER_HOST = 32
MAX_ATTRIBUTES_PER_HOST = 64
MAX_ATTRIBUTE_CHARS = 1024
# Distinct label names one set may name: they are looked up in one IN (...) query.
MAX_LABELS_PER_SET = 2000
# Rejections kept on the shard's row and sent back; past this the last one says how many more.
MAX_REJECTIONS = 200
# How stale a present host's last_seen may be: a changed, new or returning host gets the exact time.
LAST_SEEN_STEP = timedelta(minutes=10)
# Hostnames an audit record lists per kind of change (its details also carry the counts).
MAX_AUDITED_NAMES = 100
_KEY_RE = re.compile(r"[A-Za-z0-9_.\-]{1,255}")
_RECORD_FIELDS = frozenset({"hostname", "labels", "attributes"})
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
VANISHED_NOTE = "[fleetshard] host {host} vanished from shard {shard}'s discovered set while this ran: infra failure"


def shown(value: object) -> str:
    """A hostile name as a rejection may quote it: printable, bounded."""
    text = value if isinstance(value, str) else repr(value)
    printable = "".join(
        c if c.isprintable() and unicodedata.category(c) not in ("Cf", "Cs") else f"\\u{ord(c):04x}" for c in text[:80]
    )
    return printable + ("..." if len(text) > 80 else "")


@dataclass
class _Record:
    hostname: str
    labels: list[str]
    attributes: dict[str, str]


@functools.lru_cache(maxsize=4096)
def _valid_label(name: str) -> bool:
    return valid_name(name)


def _check_record(item: object) -> _Record | str:
    """The record, or why it is refused."""
    if not isinstance(item, dict):
        return f"a host record must be an object, not {type(item).__name__}"
    hostname = item.get("hostname")
    if not valid_name(hostname):
        return f"invalid hostname: {NAME_RULE}"
    assert isinstance(hostname, str)
    labels = item.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(name, str) for name in labels):
        return "labels must be a list of label names"
    if len(labels) > MAX_LABELS_PER_HOST:
        return f"at most {MAX_LABELS_PER_HOST} labels per host, got {len(labels)}"
    bad = next((name for name in labels if not _valid_label(name)), None)
    if bad is not None:
        return f"invalid label name {shown(bad)}: {NAME_RULE}"
    attributes = item.get("attributes", {})
    if not isinstance(attributes, dict):
        return "attributes must map names to strings"
    if len(attributes) > MAX_ATTRIBUTES_PER_HOST:
        return f"at most {MAX_ATTRIBUTES_PER_HOST} attributes per host, got {len(attributes)}"
    for key, value in attributes.items():
        if not _KEY_RE.fullmatch(key):
            return f"invalid attribute name {shown(key)}: use 1-255 letters, digits, '_', '.', '-'"
        if not isinstance(value, str) or len(value) > MAX_ATTRIBUTE_CHARS or _UNSTORABLE.search(value):
            return (
                f"attribute {key} must be a string of at most {MAX_ATTRIBUTE_CHARS} characters "
                "without NUL or lone surrogates"
            )
    unknown = item.keys() - _RECORD_FIELDS if len(item) > 3 or not item.keys() <= _RECORD_FIELDS else set()
    if unknown:
        return f"unknown fields {', '.join(sorted(shown(k) for k in unknown))}"
    return _Record(hostname, list(dict.fromkeys(labels)), dict(attributes))


@dataclass
class _Outcome:
    rejected: list[Rejection] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    back: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    failed_hqes: int = 0

    def refuse(self, hostname: object, reason: str) -> None:
        self.rejected.append(Rejection(shown(hostname), reason[:MAX_REJECTED_REASON_CHARS]))

    @property
    def touched(self) -> bool:
        return bool(self.created or self.changed or self.missing or self.back or self.forgotten or self.released)


def _valid_records(shard: Shard, hosts: list[Any], out: _Outcome) -> list[_Record]:
    records: dict[str, _Record] = {}
    label_names: set[str] = set()
    for item in hosts:
        checked = _check_record(item)
        name = item.get("hostname") if isinstance(item, dict) else item
        if isinstance(checked, str):
            out.refuse(name, checked)
        elif checked.hostname.lower() in records:
            out.refuse(
                name, "the set names this host twice (hostnames differing only in case are one); the first is kept"
            )
        elif not label_names.issuperset(checked.labels) and len(label_names | set(checked.labels)) > MAX_LABELS_PER_SET:
            out.refuse(name, f"the set names more than {MAX_LABELS_PER_SET} distinct labels")
        else:
            records[checked.hostname.lower()] = checked
            label_names.update(checked.labels)
    return list(records.values())


def _owned(shard: Shard, records: list[_Record], out: _Outcome) -> tuple[list[_Record], dict[str, int]]:
    """Records whose labels all exist, one at least is this shard's and none another's; label ids by name."""
    names = {n for r in records for n in r.labels}
    rows = Label.objects.filter(name__in=names).values_list("name", "id", "shard_id", "shard__hostname")
    labels = {name: (label_id, shard_id, owner) for name, label_id, shard_id, owner in rows} if names else {}
    kept = []
    for r in records:
        unknown = [n for n in r.labels if n not in labels]
        foreign = [(n, labels[n][2]) for n in r.labels if n in labels and labels[n][1] not in (None, shard.id)]
        if unknown:
            out.refuse(r.hostname, f"label {shown(unknown[0])} does not exist on the master")
        elif foreign:
            out.refuse(r.hostname, f"label {foreign[0][0]} belongs to shard {foreign[0][1]}, not {shard.hostname}")
        elif not any(labels[n][1] == shard.id for n in r.labels):
            out.refuse(r.hostname, f"none of its labels belongs to shard {shard.hostname}, so it could not be its host")
        else:
            kept.append(r)
    return kept, {name: v[0] for name, v in labels.items()}


def _fail_active(shard: Shard, host_ids: dict[int, str], now: datetime) -> int:
    """What ran on vanished hosts ended with them: nothing else could finish it."""
    active = list(
        HostQueueEntry.objects.filter(
            host_id__in=host_ids, job__shard=shard, status__in=(HQEStatus.STARTING, HQEStatus.RUNNING)
        ).values_list("id", "job_id", "host_id")
    )
    if not active:
        return 0
    bulk_set(
        HostQueueEntry,
        [
            {
                "id": hqe_id,
                "status": HQEStatus.FAILED,
                "failure": FailureClass.INFRA,
                "finished_on": now,
                "log_tail": VANISHED_NOTE.format(host=host_ids[host_id], shard=shard.hostname),
            }
            for hqe_id, _, host_id in active
        ],
        ["status", "failure", "finished_on", "log_tail"],
    )
    job_ids = {job_id for _, job_id, _ in active}
    refresh_job_statuses(job_ids)
    Job.objects.filter(id__in=job_ids).update(version=F("version") + 1)
    notify_events.jobs_ended(job_ids)
    return len(active)


def apply_discovered(shard: Shard, discovered: DiscoveredSet, now: datetime) -> DiscoveredAck:
    """Applies `shard`'s set once (call under the shard's row lock, inside the heartbeat's transaction);
    an older or equal generation changes nothing and is answered as before."""
    row = Shard.objects.filter(id=shard.id).values("discovered_generation", "discovered_rejected").get()
    if discovered.generation <= row["discovered_generation"]:
        if discovered.generation < row["discovered_generation"]:
            log.warning(
                "shard %s: discovered generation %d is older than %d, already applied: ignored",
                shard.hostname,
                discovered.generation,
                row["discovered_generation"],
            )
        return DiscoveredAck(row["discovered_generation"], [Rejection(**r) for r in row["discovered_rejected"]])
    out = _Outcome()
    limit = settings.FLEETSHARD_MAX_DISCOVERED_HOSTS
    if len(discovered.hosts) > limit:
        out.refuse(
            "*",
            f"the set has {len(discovered.hosts)} hosts; a shard may discover at most {limit} "
            "(FLEETSHARD_MAX_DISCOVERED_HOSTS): nothing of it was applied",
        )
    else:
        _apply(shard, discovered, now, out)
    rejected = out.rejected[:MAX_REJECTIONS]
    if len(out.rejected) > MAX_REJECTIONS:
        rejected[-1] = Rejection("*", f"{len(out.rejected) - MAX_REJECTIONS + 1} more hosts were refused")
    for r in rejected[:5]:
        log.warning("shard %s: discovered host %s refused: %s", shard.hostname, r.hostname, r.reason)
    Shard.objects.filter(id=shard.id).update(
        discovered_generation=discovered.generation,
        discovered_rejected=[r.to_wire() for r in rejected],
        discovered_count=len(discovered.hosts) - len(out.rejected) if len(discovered.hosts) <= limit else 0,
    )
    if out.touched:
        _audit(shard, discovered.generation, out)
    return DiscoveredAck(discovered.generation, rejected)


def _rows(query: "QuerySet[Host]", fields: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """`fields` of the hosts, "attributes" read as text and decoded once (the driver's and Django's
    decoding of each row's JSON were a third of a 10,000-host generation)."""
    named = [f if f != "attributes" else "attributes_text" for f in fields]
    rows = query.annotate(attributes_text=Cast("attributes", TextField())).values_list(*named)
    at = fields.index("attributes")
    return [(*row[:at], _attributes(row[at]), *row[at + 1 :]) for row in rows]


def _attributes(text: str | None) -> Any:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _apply(shard: Shard, discovered: DiscoveredSet, now: datetime, out: _Outcome) -> None:
    records, label_ids = _owned(shard, _valid_records(shard, discovered.hosts, out), out)
    wanted = {r.hostname: r for r in records}
    # The shard's own discovered hosts need no IN (...) list; only names new to it are looked up by name
    # (few, once the set has settled): building a 10,000-name IN took longer than running it.
    fields = ("id", "hostname", "shard_id", "origin", "discovered_by_id", "attributes", "status")
    # A host it found that people have since moved to another shard (or to none) is no longer its own.
    existing = {
        row[1]: dict(zip(fields, row, strict=True))
        for row in _rows(Host.objects.filter(discovered_by=shard, shard=shard), fields)
    }
    # A new name is also looked up without its case: `pixel-1` never becomes a second host beside a
    # declared `Pixel-1` (hostnames are case-insensitive to discovery, docs/discovery.md).
    unseen = {name.lower() for name in wanted if name not in existing}
    case_of: dict[str, str] = {}
    if unseen:
        others = Host.objects.alias(lower_name=Lower("hostname")).filter(lower_name__in=unseen)
        for row in _rows(others, (*fields, "shard__hostname")):
            if row[1] in wanted:
                existing[row[1]] = dict(zip((*fields, "shard__hostname"), row, strict=True))
            else:
                case_of[row[1].lower()] = row[1]
    current_labels: dict[int, set[int]] = {}
    for host_id, label_id in Host.labels.through.objects.filter(host__discovered_by=shard).values_list(
        "host_id", "label_id"
    ):
        current_labels.setdefault(host_id, set()).add(label_id)

    new_rows, changes, relabel, new_labels = [], [], [], []
    for name, r in wanted.items():
        host = existing.get(name)
        if host is None and name.lower() in case_of:
            out.refuse(
                name,
                f"hostname {name} differs only in case from host {case_of[name.lower()]}, which it would duplicate",
            )
            continue
        if host is None:
            new_rows.append(
                {
                    "hostname": name,
                    "attributes": r.attributes,
                    "locked": False,
                    "lock_reason": "",
                    "status": HostStatus.READY,
                    "shard": shard.id,
                    "version": 1,
                    "origin": HostOrigin.DISCOVERED,
                    "discovered_by": shard.id,
                    "last_seen": now,
                    # bulk_insert writes only these columns: the field's default does not apply.
                    "created_on": now,
                }
            )
            out.created.append(name)
            continue
        if host["shard_id"] != shard.id:
            owner = host.get("shard__hostname")
            out.refuse(
                name,
                f"hostname {name} is a host of shard {owner}" if owner else f"hostname {name} is a host of no shard",
            )
            continue
        declared = host["origin"] == HostOrigin.DECLARED
        attributes = {**host["attributes"], **r.attributes} if declared else r.attributes
        labels = {label_ids[n] for n in r.labels}
        relabelled = not declared and labels != current_labels.get(host["id"], set())
        status = HostStatus.CLEANING if host["status"] == HostStatus.MISSING else host["status"]
        if status != host["status"]:
            out.back.append(name)
        if (
            attributes != host["attributes"]
            or relabelled
            or host["discovered_by_id"] != shard.id
            or status != host["status"]
        ):
            bumped = attributes != host["attributes"] or relabelled
            changes.append({"id": host["id"], "attributes": attributes, "status": status, "bump": int(bumped)})
            if bumped:
                out.changed.append(name)
        if relabelled:
            relabel.append(host["id"])
            new_labels += [{"host": host["id"], "label": label_id} for label_id in labels]

    if changes:
        bulk_set(
            Host,
            [{**c, "discovered_by": shard.id, "last_seen": now} for c in changes],
            ["attributes", "status", "discovered_by", "last_seen"],
        )
        bumped_ids = [c["id"] for c in changes if c["bump"]]
        if bumped_ids:
            Host.objects.filter(id__in=bumped_ids).update(version=F("version") + 1)
    if relabel:
        Host.labels.through.objects.filter(host_id__in=relabel).delete()
    if new_rows and not _insert_new(new_rows, out):
        new_rows = []
    if new_rows:
        ids = dict(Host.objects.filter(hostname__in=out.created).values_list("hostname", "id"))
        new_labels += [{"host": ids[name], "label": label_ids[n]} for name in out.created for n in wanted[name].labels]
    if new_labels:
        bulk_insert(Host.labels.through, new_labels, ["host", "label"])

    gone = {
        h["id"]: h["hostname"]
        for name, h in existing.items()
        if name not in wanted and h["discovered_by_id"] == shard.id and h["status"] != HostStatus.MISSING
    }
    released = {n for n in discovered.released if isinstance(n, str)}
    if released and gone:
        # A worker's clean exit: its idle discovered hosts go; one still running something goes Missing.
        active = set(
            HostQueueEntry.objects.filter(
                host_id__in=[i for i, n in gone.items() if n in released],
                status__in=(HQEStatus.STARTING, HQEStatus.RUNNING),
            ).values_list("host_id", flat=True)
        )
        removed = {
            i: n
            for i, n in gone.items()
            if n in released and i not in active and existing[n]["origin"] == HostOrigin.DISCOVERED
        }
        if removed:
            Host.objects.filter(id__in=removed).delete()
            out.released = sorted(removed.values())
            gone = {i: n for i, n in gone.items() if i not in removed}
    if gone:
        Host.objects.filter(id__in=gone).update(status=HostStatus.MISSING)
        notify_events.host_missing(gone)
        out.missing = sorted(gone.values())
        out.failed_hqes = _fail_active(shard, gone, now)
    # last_seen moves in steps: rewriting 10,000 rows at every generation was most of a generation's cost.
    stale_seen = Q(last_seen__isnull=True) | Q(last_seen__lt=now - LAST_SEEN_STEP)
    Host.objects.filter(stale_seen, discovered_by=shard, shard=shard).exclude(status=HostStatus.MISSING).update(
        last_seen=now
    )
    forget = now - timedelta(days=settings.FLEETSHARD_DISCOVERED_FORGET_DAYS)
    stale = Host.objects.filter(
        discovered_by=shard,
        shard=shard,
        origin=HostOrigin.DISCOVERED,
        status=HostStatus.MISSING,
        last_seen__lt=forget,
    )
    stale_rows = list(stale.values_list("id", "hostname"))
    if stale_rows:
        out.forgotten = [name for _, name in stale_rows]
        Host.objects.filter(id__in=[i for i, _ in stale_rows]).delete()


def _insert_new(rows: list[dict[str, Any]], out: _Outcome) -> bool:
    """Inserts the new hosts, or none when another heartbeat took one of their names meanwhile (two
    shards finding one device at once): those come again with the shard's next change."""
    try:
        with transaction.atomic():
            bulk_insert(Host, rows, list(rows[0]))
    except IntegrityError:
        for name in out.created:
            out.refuse(name, "another shard registered one of this set's new hostnames at the same moment")
        out.created = []
        return False
    return True


def _audit(shard: Shard, generation: int, out: _Outcome) -> None:
    """One record per applied generation that changed hosts, by `shard:NAME`."""
    details: dict[str, Any] = {"generation": generation, "failed_hqes": out.failed_hqes}
    for kind in ("created", "changed", "missing", "back", "forgotten", "released"):
        names: list[str] = getattr(out, kind)
        details[kind] = len(names)
        if names:
            details[f"{kind}_hosts"] = names[:MAX_AUDITED_NAMES]
    entry = AuditRecord.objects.create(
        user=None, actor=f"shard:{shard.hostname}"[:150], action="host.discover", details=details
    )
    AuditTarget.objects.create(record=entry, kind="shard", object_id=shard.id, name=shard.hostname[:255])


def apply_pools(shard: Shard, pools: list[Pool]) -> None:
    """The shard's elastic pools, the whole list each time it changes (master.services.assignment counts them)."""
    Shard.objects.filter(id=shard.id).update(pools=[p.to_wire() for p in pools])


def discovers(req: HeartbeatRequest) -> bool:
    """Whether a heartbeat carries discovery (a heartbeat without it keeps its queries)."""
    return req.discovered is not None or req.pools is not None


def apply_discovery(shard: Shard, req: HeartbeatRequest, now: datetime) -> DiscoveredAck | None:
    """The heartbeat's discovery part: its pools, then its discovered set."""
    if req.pools is not None:
        apply_pools(shard, req.pools)
    if req.discovered is None:
        return None
    return apply_discovered(shard, req.discovered, now)
