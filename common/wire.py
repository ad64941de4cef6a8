"""The heartbeat's wire contract (docs/protocol.md): typed, frozen records with one parse and one
serialise each, used by the master and the shard alike.

Every value rule of the protocol lives here: integer ranges, timestamps, NUL and lone surrogates,
nesting depth, types. A request whose envelope breaks a rule is a `WireError` (400, naming the field);
an update that breaks one becomes a `RejectedUpdate`, acked `rejected` with the reason, so one bad
update never blocks the others. Nothing here touches the database.
"""

import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain, repeat
from typing import Any, NamedTuple, TypeVar

import orjson
from django.utils.dateparse import parse_datetime

from common.ab import ABPlan
from common.blobs import BadInput, parse_inputs
from common.constants import (
    LOG_TAIL_BYTES,
    MAX_UPDATES_PER_HEARTBEAT,
    PROTOCOL_VERSION,
    FailureClass,
    HostStatus,
    HQEStatus,
)
from common.errors import FleetshardError

ID_MIN, ID_MAX = 1, 2**63 - 1
EXIT_MIN, EXIT_MAX = -(2**31), 2**31 - 1
YEAR_MIN, YEAR_MAX = 2000, 2100
TIME_MIN, TIME_MAX = datetime(YEAR_MIN, 1, 1, tzinfo=UTC), datetime(YEAR_MAX, 1, 1, tzinfo=UTC)
MAX_DEPTH = 32
MAX_NAME_CHARS = 255
MAX_VERSION_CHARS = 64

# NUL and lone surrogates: no database stores them as text, and no JSON decoder on the other side
# has to accept them (docs/protocol.md, "Values").
_UNSAFE_CHARS = re.compile("[\x00\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` with NUL and lone surrogates replaced by U+FFFD: for anything a job wrote."""
    return _UNSAFE_CHARS.sub("\ufffd", text)


def has_unsafe_chars(text: str) -> bool:
    return _UNSAFE_CHARS.search(text) is not None


class WireError(Exception):
    """A value breaks the contract; `field` is its path in the body (`updates[3].seq`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ProtocolMismatch(WireError):
    pass


# JSON in and out.


def dumps(value: Any) -> bytes:
    """A response's body: orjson writes a cold sync's thousands of records several times faster than
    json; what it refuses (an integer past 64 bits, a lone surrogate) json writes as ever."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()


def loads(raw: bytes | str, *, check_depth: bool = True) -> Any:
    """Parses a body, refusing one nested deeper than MAX_DEPTH (a 400, never a RecursionError); a
    caller that checks the depth itself (HeartbeatRequest.parse) says `check_depth=False`.

    orjson parses a body two to three times faster than json (every heartbeat carries its shard's
    whole known lists). Where they could differ, json decides: whatever orjson refuses (lone
    surrogates, NaN, infinities, its own depth limit) is parsed again by json for the same result or
    error as ever, and so is a body where orjson may have turned an integer past 64 bits into a
    float (19 digits or more in a row, and a float of magnitude 2**63 or more in what it made)."""
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    long_digits = _LONG_NUMBER in data.translate(_DIGITS_AS_ZERO)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        # 19 digits or more in a row are mostly a float's fraction (a result file's `0.000123...`),
        # which both parsers read alike: only an integer past 64 bits comes out of orjson as a float
        # of magnitude 2**63 or more, so a body with no such float is what json would have made.
        too_deep, big = _depth_and_big_float(value, MAX_DEPTH) if long_digits else (None, False)
        if not big:
            if too_deep is None:
                too_deep = check_depth and depth_exceeds(value, MAX_DEPTH)
            if check_depth and too_deep:
                raise WireError("body", f"JSON nested deeper than {MAX_DEPTH} levels")
            return value
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise WireError("body", f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError("body", f"not valid JSON: {exc}") from None
    if check_depth and depth_exceeds(value, MAX_DEPTH):
        raise WireError("body", f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19


_BIG = float(2**63)


def _depth_and_big_float(value: Any, limit: int) -> tuple[bool, bool]:
    """In one walk of a value orjson made, level by level (any depth is safe): whether its containers
    nest deeper than `limit`, and whether it holds a float of magnitude 2**63 or more."""
    level = [value]
    depth = 1 if type(value) is dict or type(value) is list else 0
    too_deep = depth > limit
    while level:
        inner: list[Any] = []
        for item in level:
            for child in item.values() if type(item) is dict else item if type(item) is list else (item,):
                kind = type(child)
                if kind is float:
                    if child >= _BIG or child <= -_BIG:
                        return too_deep, True
                elif kind is dict or kind is list:
                    inner.append(child)
        if inner:
            depth += 1
        too_deep = too_deep or depth > limit
        level = inner
    return too_deep, False


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether the containers of a value `json.loads` made nest more than `limit` deep; level by level,
    so any depth is safe to check."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        inner: list[Any] = []
        for item in level:
            for child in item.values() if type(item) is dict else item:
                if type(child) is dict or type(child) is list:
                    inner.append(child)
        level = inner
    return False


def parse_time(value: object) -> datetime | None:
    """An ISO 8601 time with a zone between 2000 and 2100, as UTC, or None; ValueError names the problem."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"expected an ISO 8601 time, got {_show(value)}")
    try:
        parsed = parse_datetime(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise ValueError(f"expected an ISO 8601 time with a zone, got {_show(value)}")
    try:
        parsed = parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValueError(f"time {_show(value)} is out of range") from None
    if not TIME_MIN <= parsed <= TIME_MAX:
        raise ValueError(f"time {_show(value)} is not between {YEAR_MIN} and {YEAR_MAX}")
    return parsed


def format_time(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _show(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Reading one object's fields, with errors that name their path.

T = TypeVar("T")


class _Fields:
    def __init__(self, obj: object, path: str) -> None:
        if not isinstance(obj, dict):
            raise WireError(path, f"expected an object, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        self.path = path

    def _at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> WireError:
        return WireError(self._at(key), message)

    def integer(self, key: str, lo: int = ID_MIN, hi: int = ID_MAX, *, optional: bool = False) -> int | None:
        value = self.obj.get(key)
        if value is None:
            if optional:
                return None
            raise self.fail(key, "required" if key not in self.obj else "must not be null")
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise self.fail(key, f"expected an integer from {lo} to {hi}, got {_show(value)}")
        return value

    def id(self, key: str) -> int:
        value = self.integer(key)
        assert value is not None
        return value

    def text(self, key: str, max_chars: int, *, default: str | None = None, empty: bool = True) -> str:
        value = self.obj.get(key, default)
        if value is None:
            raise self.fail(key, "required" if key not in self.obj else "must not be null")
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {type(value).__name__}")
        if len(value) > max_chars:
            raise self.fail(key, f"at most {max_chars} characters, got {len(value)}")
        if not empty and not value:
            raise self.fail(key, "must not be empty")
        if has_unsafe_chars(value):
            raise self.fail(key, "contains NUL or a lone surrogate")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], *, default: str | None = None) -> str:
        value = self.obj.get(key, default)
        if not isinstance(value, str) or value not in allowed:
            raise self.fail(key, f"expected one of {', '.join(allowed)}, got {_show(value)}")
        return value

    def boolean(self, key: str, *, default: bool | None = None) -> bool:
        value = self.obj.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_show(value)}")
        return value

    def time(self, key: str, *, optional: bool = True) -> datetime | None:
        try:
            value = parse_time(self.obj.get(key))
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None
        if value is None and not optional:
            raise self.fail(key, "required")
        return value

    def items(self, key: str, *, max_items: int | None = None) -> list[Any]:
        value = self.obj.get(key, [])
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {type(value).__name__}")
        if max_items is not None and len(value) > max_items:
            raise self.fail(key, f"at most {max_items} items, got {len(value)}")
        return value

    def each(self, key: str, parse: Callable[["_Fields"], T], *, max_items: int | None = None) -> list[T]:
        return [
            parse(_Fields(item, f"{self._at(key)}[{i}]")) for i, item in enumerate(self.items(key, max_items=max_items))
        ]

    def names(self, key: str) -> list[str]:
        items = self.items(key)
        for i, name in enumerate(items):
            if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or has_unsafe_chars(name):
                raise WireError(f"{self._at(key)}[{i}]", f"expected a name of 1-{MAX_NAME_CHARS} characters")
        return items

    def scalars(self, key: str) -> dict[str, Any]:
        """A flat object of names to strings, numbers, booleans or null (attributes, keyvals)."""
        value = self.obj.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, f"expected an object, got {type(value).__name__}")
        for name, item in value.items():
            if has_unsafe_chars(name) or (isinstance(item, str) and has_unsafe_chars(item)):
                raise self.fail(key, f"{_show(name)} contains NUL or a lone surrogate")
            if isinstance(item, dict | list):
                raise self.fail(key, f"{_show(name)} must be a string, number, boolean or null")
        return value


def _body(obj: object) -> _Fields:
    if not isinstance(obj, dict):
        raise WireError("body", "expected a JSON object")
    return _Fields(obj, "")


# The request.


class KnownHost(NamedTuple):
    id: int
    version: int
    status: str

    @classmethod
    def parse(cls, f: _Fields) -> "KnownHost":
        return cls(f.id("id"), f.id("version"), f.choice("status", HostStatus.ALL))

    @staticmethod
    def plain(ids: list[Any], versions: list[Any], statuses: list[Any]) -> bool:
        """Whether these columns of a known list hold only what `parse` takes."""
        return _ids(ids) and _ids(versions) and set(map(type, statuses)) <= {str} and set(statuses) <= _HOST_STATUSES

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "version": self.version, "status": self.status}


class KnownJob(NamedTuple):
    id: int
    version: int

    @classmethod
    def parse(cls, f: _Fields) -> "KnownJob":
        return cls(f.id("id"), f.id("version"))

    @staticmethod
    def plain(ids: list[Any], versions: list[Any]) -> bool:
        return _ids(ids) and _ids(versions)

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "version": self.version}


def _flat_records(items: object) -> bool:
    """Whether `items` is a list of objects that hold no object or list."""
    if type(items) is not list:
        return False
    try:
        kinds = set(map(type, chain.from_iterable(map(dict.values, items))))
    except TypeError:  # an item that is not an object
        return False
    return dict not in kinds and list not in kinds


def _ids(values: list[Any]) -> bool:
    return not values or (set(map(type, values)) == {int} and min(values) >= ID_MIN and max(values) <= ID_MAX)


_HOST_STATUSES = frozenset(HostStatus.ALL)


@dataclass(frozen=True)
class Update:
    """One HQE status change from a shard's outbox. None means "not given": the master keeps its value."""

    seq: int
    hqe: int
    status: str
    job: int | None = None
    host: int | None = None
    failure: str = ""
    exit_code: int | None = None
    started_on: datetime | None = None
    finished_on: datetime | None = None
    log_tail: str | None = None
    # When the shard made this change (an extension: absent from older clients).
    at: datetime | None = None

    @classmethod
    def parse(cls, f: _Fields, seq: int) -> "Update":
        status = f.choice("status", HQEStatus.ALL)
        failure = f.obj.get("failure") or ""
        if status == HQEStatus.FAILED and failure not in FailureClass.ALL:
            raise f.fail("failure", f"a Failed update needs one of {', '.join(FailureClass.ALL)}, got {_show(failure)}")
        if status != HQEStatus.FAILED and failure:
            raise f.fail("failure", f"only a Failed update has a failure class, got {_show(failure)}")
        log_tail = f.obj.get("log_tail")
        if log_tail is not None:
            if not isinstance(log_tail, str):
                raise f.fail("log_tail", f"expected a string, got {type(log_tail).__name__}")
            if has_unsafe_chars(log_tail):
                raise f.fail("log_tail", "contains NUL or a lone surrogate")
            log_tail = log_tail[-LOG_TAIL_BYTES:]
        return cls(
            seq=seq,
            hqe=f.id("hqe"),
            status=status,
            job=f.integer("job", optional=True),
            host=f.integer("host", optional=True),
            failure=failure,
            exit_code=f.integer("exit_code", EXIT_MIN, EXIT_MAX, optional=True),
            started_on=f.time("started_on"),
            finished_on=f.time("finished_on"),
            log_tail=log_tail,
            at=f.time("at"),
        )

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "seq": self.seq,
            "hqe": self.hqe,
            "job": self.job,
            "status": self.status,
            "host": self.host,
            "started_on": format_time(self.started_on),
            "finished_on": format_time(self.finished_on),
        }
        if self.failure:
            body["failure"] = self.failure
        if self.exit_code is not None:
            body["exit_code"] = self.exit_code
        if self.log_tail:
            body["log_tail"] = self.log_tail
        if self.at is not None:
            body["at"] = format_time(self.at)
        return body


@dataclass(frozen=True)
class HostEvent:
    """A host's status change on the shard, with the shard's time (an extension: `host_events`)."""

    seq: int
    host: int
    status: str
    at: datetime

    @classmethod
    def parse(cls, f: _Fields, seq: int) -> "HostEvent":
        at = f.time("at", optional=False)
        assert at is not None
        return cls(seq=seq, host=f.id("host"), status=f.choice("status", HostStatus.ALL), at=at)

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq, "host": self.host, "status": self.status, "at": format_time(self.at)}


@dataclass(frozen=True)
class RejectedUpdate:
    """An update whose seq is sound but whose values are not: acked `rejected` with `error`."""

    seq: int
    error: str


@dataclass(frozen=True)
class HeartbeatRequest:
    shard: str
    instance: str
    client_version: str = ""
    outbox_depth: int | None = None
    # The shard database's seq counter when the request was built (docs/protocol.md, "Shard instances").
    last_seq: int | None = None
    known_hosts: list[KnownHost] = field(default_factory=list)
    known_jobs: list[KnownJob] = field(default_factory=list)
    updates: list[Update | RejectedUpdate] = field(default_factory=list)
    host_events: list[HostEvent | RejectedUpdate] = field(default_factory=list)
    protocol: int = PROTOCOL_VERSION
    discovered: "DiscoveredSet | None" = None
    pools: "list[Pool] | None" = None

    @classmethod
    def parse(cls, body: object) -> "HeartbeatRequest":
        f = _body(body)
        # Known lists of plain records (nearly all of a heartbeat) cannot nest too deep: the rest is walked.
        rest = {k: v for k, v in f.obj.items() if k not in ("known_hosts", "known_jobs") or not _flat_records(v)}
        if depth_exceeds(rest, MAX_DEPTH):
            raise WireError("body", f"JSON nested deeper than {MAX_DEPTH} levels")
        check_protocol(f)
        instance = f.text("instance", 64, default=None)
        try:
            instance = str(uuid.UUID(instance))
        except ValueError:
            raise f.fail("instance", f"expected a UUID naming the shard's database, got {_show(instance)}") from None
        updates = f.items("updates", max_items=MAX_UPDATES_PER_HEARTBEAT)
        shard = f.text("shard", MAX_NAME_CHARS, default=None, empty=False)
        client_version = f.text("client_version", MAX_VERSION_CHARS, default="")
        known_hosts = _known(f, "known_hosts", "host", KnownHost)
        known_jobs = _known(f, "known_jobs", "job", KnownJob)
        parsed = _parse_sequenced(updates, "updates", Update.parse)
        events = _parse_sequenced(
            f.items("host_events", max_items=MAX_UPDATES_PER_HEARTBEAT), "host_events", HostEvent.parse
        )
        shared = {u.seq for u in parsed} & {e.seq for e in events}
        if shared:
            i = next(i for i, e in enumerate(events) if e.seq in shared)
            raise WireError(f"host_events[{i}].seq", f"seq {events[i].seq} is also an update's: seqs are shared")
        req = cls(
            shard=shard,
            instance=instance,
            client_version=client_version,
            outbox_depth=f.integer("outbox_depth", 0, ID_MAX, optional=True),
            last_seq=f.integer("last_seq", 0, ID_MAX, optional=True),
            known_hosts=known_hosts,
            known_jobs=known_jobs,
            updates=parsed,
            host_events=events,
            discovered=DiscoveredSet.parse(f),
            pools=Pool.parse_list(f),
        )
        if req.last_seq is not None and req.last_seq < req.highest_seq:
            raise WireError(
                "last_seq",
                f"{req.last_seq} is below seq {req.highest_seq} of this request: it must be at least every seq",
            )
        return req

    @property
    def highest_seq(self) -> int:
        """The highest seq of the request's updates and host events; 0 when it has none."""
        return max((u.seq for u in (*self.updates, *self.host_events)), default=0)

    def to_wire(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "shard": self.shard,
            "instance": self.instance,
            "client_version": self.client_version,
            **({} if self.outbox_depth is None else {"outbox_depth": self.outbox_depth}),
            **({} if self.last_seq is None else {"last_seq": self.last_seq}),
            "known_hosts": [h.to_wire() for h in self.known_hosts],
            "known_jobs": [j.to_wire() for j in self.known_jobs],
            "updates": [u.to_wire() for u in self.updates if isinstance(u, Update)],
            "host_events": [e.to_wire() for e in self.host_events if isinstance(e, HostEvent)],
            **({} if self.discovered is None else {"discovered": self.discovered.to_wire()}),
            **({} if self.pools is None else {"pools": [p.to_wire() for p in self.pools]}),
        }


K = TypeVar("K", KnownHost, KnownJob)


def _known(f: _Fields, key: str, kind: str, record: type[K]) -> list[K]:
    """A known list: most of every heartbeat (a record per host and job the shard holds), so it is
    checked a column at a time, and record by record (for the error naming the first bad one) only
    when a column holds something else. A shard holds each host and job once: an id listed twice (two
    statuses for one host, applied in no defined order) is the body's fault, a 400 naming the second."""
    items = f.items(key)
    try:
        columns: list[list[Any]] | None = [[item[name] for item in items] for name in record._fields]
    except (KeyError, TypeError):  # a record that lacks a field, or is no object
        columns = None
    if columns is not None and record.plain(*columns):
        records = list(map(tuple.__new__, repeat(record), zip(*columns, strict=True)))
    else:
        records = [record.parse(_Fields(item, f"{key}[{i}]")) for i, item in enumerate(items)]
    ids = [r.id for r in records]
    if len(set(ids)) < len(ids):
        seen: set[int] = set()
        for i, record_id in enumerate(ids):
            if record_id in seen:
                raise WireError(f"{key}[{i}].id", f"{kind} {record_id} is listed twice")
            seen.add(record_id)
    return records


def check_protocol(f: _Fields) -> None:
    if "protocol" not in f.obj:
        raise WireError("protocol", "required")
    value = f.obj["protocol"]
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError("protocol", f"expected the integer {PROTOCOL_VERSION}, got {_show(value)}")
    if value != PROTOCOL_VERSION:
        raise ProtocolMismatch("protocol", f"protocol {value} is not supported; this side speaks {PROTOCOL_VERSION}")


R = TypeVar("R", Update, HostEvent)


def _parse_sequenced(items: list[Any], key: str, record: Callable[["_Fields", int], R]) -> list[R | RejectedUpdate]:
    """Updates and host events, each on its own: a seq that does not grow is the body's fault (a 400),
    any other bad value rejects only that item."""
    parsed: list[R | RejectedUpdate] = []
    last = 0
    for i, item in enumerate(items):
        f = _Fields(item, f"{key}[{i}]")
        seq = f.id("seq")
        if seq <= last:
            raise f.fail("seq", f"seqs must grow within a heartbeat ({seq} after {last})")
        last = seq
        try:
            parsed.append(record(f, seq))
        except WireError as exc:
            parsed.append(RejectedUpdate(seq, f"{exc.field.split('.', 1)[-1]}: {exc.message}"))
    return parsed


# The response.


@dataclass(frozen=True)
class HostRecord:
    id: int
    version: int
    hostname: str
    labels: list[str]
    locked: bool
    lock_reason: str
    attributes: dict[str, Any]

    @classmethod
    def parse(cls, f: _Fields) -> "HostRecord":
        return cls(
            id=f.id("id"),
            version=f.id("version"),
            hostname=f.text("hostname", MAX_NAME_CHARS, empty=False),
            labels=f.names("labels"),
            locked=f.boolean("locked", default=False),
            lock_reason=f.text("lock_reason", 1024, default=""),
            attributes=f.scalars("attributes"),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "hostname": self.hostname,
            "labels": self.labels,
            "locked": self.locked,
            "lock_reason": self.lock_reason,
            "attributes": self.attributes,
        }


@dataclass(frozen=True)
class HQERecord:
    """An HQE as the master sends it; `status` (an extension) lets a shard skip HQEs already ended."""

    id: int
    host_id: int | None
    meta_host: str | None
    status: str = HQEStatus.QUEUED

    @classmethod
    def parse(cls, f: _Fields) -> "HQERecord":
        meta_host = f.obj.get("meta_host")
        if meta_host is not None:
            meta_host = f.text("meta_host", MAX_NAME_CHARS, empty=False)
        host_id = f.integer("host_id", optional=True)
        if (host_id is None) == (meta_host is None):
            raise f.fail("host_id", "an HQE names either a host or a meta-host label")
        return cls(f.id("id"), host_id, meta_host, f.choice("status", HQEStatus.ALL, default=HQEStatus.QUEUED))

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "host_id": self.host_id, "meta_host": self.meta_host, "status": self.status}


@dataclass(frozen=True)
class JobRecord:
    id: int
    version: int
    name: str
    owner: str
    priority: int
    command: str
    timeout_mins: int
    max_runtime_mins: int
    dependency_labels: list[str]
    keyvals: dict[str, Any]
    parent_id: int | None
    aborted: bool
    created_on: datetime | None
    hqes: list[HQERecord]
    # An A/B job's plan as common.ab.ABPlan.to_json() gives it; {} for a plain job (and left off the wire).
    ab: dict[str, Any] = field(default_factory=dict)
    # Blobs the runs read (common/blobs.py); on the wire only when there are some.
    inputs: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def parse(cls, f: _Fields) -> "JobRecord":
        return cls(
            id=f.id("id"),
            version=f.id("version"),
            name=f.text("name", MAX_NAME_CHARS),
            owner=f.text("owner", 150),
            priority=f.integer("priority", -(2**31), 2**31 - 1),  # type: ignore[arg-type]
            command=f.text("command", 1024 * 1024, empty=False),
            timeout_mins=f.integer("timeout_mins", 1, 2**31 - 1),  # type: ignore[arg-type]
            max_runtime_mins=f.integer("max_runtime_mins", 1, 2**31 - 1),  # type: ignore[arg-type]
            dependency_labels=f.names("dependency_labels"),
            keyvals=f.scalars("keyvals"),
            parent_id=f.integer("parent_id", optional=True),
            aborted=f.boolean("aborted", default=False),
            created_on=f.time("created_on"),
            hqes=f.each("hqes", HQERecord.parse),
            ab=_ab_plan(f),
            inputs=_inputs(f),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "name": self.name,
            "owner": self.owner,
            "priority": self.priority,
            "command": self.command,
            "timeout_mins": self.timeout_mins,
            "max_runtime_mins": self.max_runtime_mins,
            "dependency_labels": self.dependency_labels,
            "keyvals": self.keyvals,
            "parent_id": self.parent_id,
            "aborted": self.aborted,
            "created_on": format_time(self.created_on),
            "hqes": [h.to_wire() for h in self.hqes],
            **({"inputs": self.inputs} if self.inputs else {}),
            **({"ab": self.ab} if self.ab else {}),
        }


def _inputs(f: _Fields) -> list[dict[str, Any]]:
    try:
        return [ref.to_wire() for ref in parse_inputs(f.items("inputs"))]
    except BadInput as exc:
        raise f.fail("inputs", str(exc)) from None


def _ab_plan(f: _Fields) -> dict[str, Any]:
    raw = f.obj.get("ab", {})
    try:
        plan = ABPlan.from_json(raw)
    except FleetshardError as exc:
        raise f.fail("ab", str(exc).removeprefix("ab: ")) from None
    return plan.to_json() if plan is not None else {}


@dataclass(frozen=True)
class Ack:
    seq: int
    result: str
    error: str = ""

    @classmethod
    def parse(cls, f: _Fields) -> "Ack":
        result = f.choice("result", ("accepted", "rejected"))
        return cls(f.id("seq"), result, f.text("error", 4096, default="") if result == "rejected" else "")

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"seq": self.seq, "result": self.result}
        if self.result == "rejected":
            body["error"] = self.error
        return body


@dataclass(frozen=True)
class HeartbeatResponse:
    """The master's answer. `parse` keeps every well-formed record and lists the others in `skipped`,
    so one bad record costs only itself (the master sends it again until the shard holds it)."""

    hosts: list[HostRecord] = field(default_factory=list)
    removed_host_ids: list[int] = field(default_factory=list)
    jobs: list[JobRecord] = field(default_factory=list)
    suite_keyvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    acks: list[Ack] = field(default_factory=list)
    more: bool = False
    heartbeat_interval_s: float | None = None
    skipped: list[str] = field(default_factory=list)
    protocol: int = PROTOCOL_VERSION
    discovered_ack: "DiscoveredAck | None" = None

    @classmethod
    def parse(cls, body: object) -> "HeartbeatResponse":
        f = _body(body)
        check_protocol(f)
        skipped: list[str] = []
        interval = f.obj.get("heartbeat_interval_s")
        if interval is not None and (
            not isinstance(interval, int | float) or isinstance(interval, bool) or not 0 < interval <= 3600
        ):
            raise f.fail("heartbeat_interval_s", f"expected seconds from 0 to 3600, got {_show(interval)}")
        removed = []
        for i, host_id in enumerate(f.items("removed_host_ids")):
            if not isinstance(host_id, int) or isinstance(host_id, bool) or not ID_MIN <= host_id <= ID_MAX:
                skipped.append(f"removed_host_ids[{i}]: expected an id, got {_show(host_id)}")
            else:
                removed.append(host_id)
        hosts = _each_isolated(f, "hosts", HostRecord.parse, skipped)
        suite_keyvals, bad_parents = _suite_keyvals(f, skipped)
        jobs = []
        for job in _each_isolated(f, "jobs", JobRecord.parse, skipped):
            if str(job.parent_id) in bad_parents:
                # Held without its suite's keyvals it would never be sent again: skipped, it comes again.
                skipped.append(f"jobs: job {job.id}: the keyvals of its parent {job.parent_id} are malformed")
            else:
                jobs.append(job)
        return cls(
            hosts=hosts,
            removed_host_ids=removed,
            jobs=jobs,
            suite_keyvals=suite_keyvals,
            acks=_each_isolated(f, "acks", Ack.parse, skipped),
            more=f.boolean("more", default=False),
            heartbeat_interval_s=interval,
            skipped=skipped,
            discovered_ack=DiscoveredAck.parse(f, skipped),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "hosts": [h.to_wire() for h in self.hosts],
            "removed_host_ids": self.removed_host_ids,
            "jobs": [j.to_wire() for j in self.jobs],
            "suite_keyvals": self.suite_keyvals,
            "acks": [a.to_wire() for a in self.acks],
            "more": self.more,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            **({} if self.discovered_ack is None else {"discovered_ack": self.discovered_ack.to_wire()}),
        }


def _suite_keyvals(f: _Fields, skipped: list[str]) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """The parents' keyvals, each on its own: a malformed entry is skipped (with the jobs that need it),
    never the whole answer (docs/protocol.md: a reader parses record by record)."""
    suite = f.obj.get("suite_keyvals", {})
    if not isinstance(suite, dict):
        raise f.fail("suite_keyvals", "expected an object")
    parsed: dict[str, dict[str, Any]] = {}
    bad: set[str] = set()
    for key, value in suite.items():
        try:
            parsed[key] = _Fields({"v": value}, f"suite_keyvals.{key}").scalars("v")
        except WireError as exc:
            skipped.append(str(exc))
            bad.add(key)
    return parsed, bad


def _each_isolated(f: _Fields, key: str, parse: Callable[[_Fields], T], skipped: list[str]) -> list[T]:
    records = []
    for i, item in enumerate(f.items(key)):
        try:
            records.append(parse(_Fields(item, f"{key}[{i}]")))
        except WireError as exc:
            skipped.append(str(exc))
    return records


def error_body(message: str, field_name: str | None, **detail: Any) -> Mapping[str, Any]:
    """The shape of every heartbeat error: `{"error": ..., "detail": {"field": ...}}`."""
    return {"error": message, "detail": {"field": field_name, **detail} if field_name else (detail or None)}


# Discovery (docs/protocol.md, "discovered"): the shard's whole discovered set, the master's ack of it,
# and the pools a shard announces. The wire checks only the envelope; each host record is judged on its
# own by the master (master/sync/discovery.py), so one bad record is refused alone, with its reason.

# However large FLEETSHARD_MAX_DISCOVERED_HOSTS is set, a set longer than this is not even read.
MAX_DISCOVERED_ON_WIRE = 1_000_000
MAX_POOLS = 100
# Labels of one pool (run_worker_manager's --label): a pool's jobs must carry every one.
MAX_POOL_LABELS = 20
MAX_REJECTED_REASON_CHARS = 300


@dataclass(frozen=True)
class DiscoveredSet:
    generation: int
    hosts: list[Any]
    # Hostnames that left the set cleanly (an elastic worker's exit): deleted, not Missing.
    released: list[Any] = field(default_factory=list)

    @classmethod
    def parse(cls, body: _Fields) -> "DiscoveredSet | None":
        if body.obj.get("discovered") is None:
            return None
        f = _Fields(body.obj["discovered"], "discovered")
        generation = f.id("generation")
        hosts = f.items("hosts", max_items=MAX_DISCOVERED_ON_WIRE)
        released = f.items("released", max_items=MAX_DISCOVERED_ON_WIRE) if "released" in f.obj else []
        return cls(generation=generation, hosts=hosts, released=released)

    def to_wire(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "hosts": self.hosts,
            **({"released": self.released} if self.released else {}),
        }


@dataclass(frozen=True)
class Rejection:
    hostname: str
    reason: str

    def to_wire(self) -> dict[str, Any]:
        return {"hostname": self.hostname, "reason": self.reason}


@dataclass(frozen=True)
class DiscoveredAck:
    generation: int
    rejected: list[Rejection] = field(default_factory=list)

    @classmethod
    def parse(cls, body: _Fields, skipped: list[str]) -> "DiscoveredAck | None":
        """None when absent (a master without discovery) or malformed (noted in `skipped`)."""
        if body.obj.get("discovered_ack") is None:
            return None
        try:
            f = _Fields(body.obj["discovered_ack"], "discovered_ack")
            generation = f.integer("generation", 0, ID_MAX)
            rejected = []
            for i, item in enumerate(f.items("rejected")):
                r = _Fields(item, f"discovered_ack.rejected[{i}]")
                rejected.append(Rejection(clean_text(r.text("hostname", 1024)), clean_text(r.text("reason", 4 * 1024))))
        except WireError as exc:
            skipped.append(str(exc))
            return None
        assert generation is not None
        return cls(generation=generation, rejected=rejected)

    def to_wire(self) -> dict[str, Any]:
        return {"generation": self.generation, "rejected": [r.to_wire() for r in self.rejected]}


@dataclass(frozen=True)
class Pool:
    """An elastic pool of the shard: jobs for its labels are accepted while it has no host yet."""

    labels: list[str]
    max_hosts: int

    @classmethod
    def parse_list(cls, body: _Fields) -> "list[Pool] | None":
        if body.obj.get("pools") is None:
            return None
        pools = body.each(
            "pools", lambda f: cls(f.names("labels"), f.integer("max_hosts", 0, 10**6) or 0), max_items=MAX_POOLS
        )
        for i, pool in enumerate(pools):
            if not pool.labels:
                raise WireError(f"pools[{i}].labels", "a pool needs at least one label")
            if len(pool.labels) > MAX_POOL_LABELS:
                raise WireError(f"pools[{i}].labels", f"at most {MAX_POOL_LABELS} labels, got {len(pool.labels)}")
        return pools

    def to_wire(self) -> dict[str, Any]:
        return {"labels": self.labels, "max_hosts": self.max_hosts}
