"""The heartbeat's wire format (DESIGN.md, "The heartbeat"): parsing requests with errors that name the field.

Only the structure is checked here. Whether an update makes sense (a known HQE, a valid status word)
is judged per update by the master, so one bad update is rejected without failing the batch.
"""

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from common.constants import MAX_UPDATES_PER_HEARTBEAT, PROTOCOL_VERSION, HostStatus

# NUL and lone surrogates: no database stores them as text, and no JSON encoder on the other side
# has to accept them (DESIGN.md, "Values on the wire").
_UNSAFE_CHARS = re.compile("[\x00\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` with NUL and lone surrogates replaced by U+FFFD: for anything a job wrote."""
    return _UNSAFE_CHARS.sub("\ufffd", text)


def has_unsafe_chars(text: str) -> bool:
    return _UNSAFE_CHARS.search(text) is not None


class WireError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ProtocolMismatch(WireError):
    pass


@dataclass(frozen=True)
class KnownHost:
    id: int
    version: int
    status: str


@dataclass(frozen=True)
class KnownJob:
    id: int
    version: int


@dataclass(frozen=True)
class HeartbeatRequest:
    protocol: int
    shard: str
    client_version: str
    known_hosts: list[KnownHost]
    known_jobs: list[KnownJob]
    updates: list[dict[str, Any]]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(obj: dict[str, Any], key: str, path: str, *, minimum: int = 0) -> int:
    if key not in obj:
        raise WireError(f"{path}.{key}", "required")
    value = obj[key]
    if not _is_int(value) or value < minimum:
        raise WireError(f"{path}.{key}", f"expected an integer >= {minimum}, got {value!r}")
    return value


def _list(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key, [])
    if not isinstance(value, list):
        raise WireError(key, f"expected a list, got {type(value).__name__}")
    return value


def _objects(body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = _list(body, key)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise WireError(f"{key}[{i}]", f"expected an object, got {type(item).__name__}")
    return items


def check_protocol(body: object) -> None:
    if not isinstance(body, dict):
        raise WireError("body", "expected a JSON object")
    if "protocol" not in body:
        raise WireError("protocol", "required")
    if body["protocol"] != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            "protocol", f"protocol {body['protocol']!r} is not supported; this master speaks {PROTOCOL_VERSION}"
        )


def parse_request(body: object) -> HeartbeatRequest:
    check_protocol(body)
    assert isinstance(body, dict)
    shard = body.get("shard")
    if not isinstance(shard, str) or not shard:
        raise WireError("shard", "expected the shard's hostname")
    client_version = body.get("client_version", "")
    if not isinstance(client_version, str) or len(client_version) > 64:
        raise WireError("client_version", "expected a string of at most 64 characters")
    known_hosts = []
    for i, item in enumerate(_objects(body, "known_hosts")):
        path = f"known_hosts[{i}]"
        status = item.get("status")
        if status not in HostStatus.ALL:
            raise WireError(f"{path}.status", f"expected one of {', '.join(HostStatus.ALL)}, got {status!r}")
        known_hosts.append(KnownHost(_int(item, "id", path, minimum=1), _int(item, "version", path), status))
    known_jobs = [
        KnownJob(_int(item, "id", f"known_jobs[{i}]", minimum=1), _int(item, "version", f"known_jobs[{i}]"))
        for i, item in enumerate(_objects(body, "known_jobs"))
    ]
    updates = _objects(body, "updates")
    if len(updates) > MAX_UPDATES_PER_HEARTBEAT:
        raise WireError("updates", f"at most {MAX_UPDATES_PER_HEARTBEAT} updates per heartbeat, got {len(updates)}")
    last = 0
    for i, update in enumerate(updates):
        seq = _int(update, "seq", f"updates[{i}]", minimum=1)
        if seq <= last:
            raise WireError(f"updates[{i}].seq", f"seqs must grow within a heartbeat ({seq} after {last})")
        last = seq
    return HeartbeatRequest(PROTOCOL_VERSION, shard, client_version, known_hosts, known_jobs, updates)


def parse_time(value: object) -> datetime | None:
    """An ISO 8601 time with a zone, or None; raises ValueError naming the problem."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO 8601 time, got {value!r}")
    parsed = parse_datetime(value)
    if parsed is None or parsed.tzinfo is None:
        raise ValueError(f"expected an ISO 8601 time with a zone, got {value!r}")
    return parsed


def format_time(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")
