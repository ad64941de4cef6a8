"""What the master's services share: the rules for names and text, lookups by name, and host moves.

A change a shard must see raises the record's `version`, so the next heartbeat re-sends it.
"""

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from django.db.models import F

from common.errors import FleetshardError, NotFound
from common.models import Host, Label, Shard
from master.services.assignment import shard_for_labels
from master.sync.notifier import shards_changed

# Names of hosts, labels and shards end up in URL paths, shell environments, file names, log lines
# and the admin: plain ASCII without separators or '..' keeps them meaning only themselves there.
_NAME_RE = re.compile(r"[A-Za-z0-9.\-_:@+=]{1,255}")
NAME_RULE = "use letters, digits and . - _ : @ + = (no '..', not starting with '.', at most 255 characters)"
# Attribute and keyval names become environment variable suffixes on the shard (FLEETSHARD_HOST_ATTR_*).
_KEY_RE = re.compile(r"[A-Za-z0-9_.\-]{1,255}")
KEY_RULE = "use 1-255 letters, digits, '_', '.', '-'"
# What no database column can hold as text (PostgreSQL refuses NUL; no encoder takes a lone surrogate).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
MAX_MAP_ENTRIES = 256
MAX_VALUE_LENGTH = 1024
INT32_MAX = 2**31 - 1


def valid_name(name: object) -> bool:
    """Whether `name` may name a new host, label or shard (existing names are not re-checked)."""
    return isinstance(name, str) and bool(_NAME_RE.fullmatch(name)) and ".." not in name and name[0] != "."


def check_new_names(kind: str, names: Sequence[str]) -> list[str]:
    """The names of objects to create, each following NAME_RULE, without repeats."""
    if not names:
        raise FleetshardError(f"give at least one {kind} name", field=kind)
    for name in names:
        if not valid_name(name):
            raise FleetshardError(f"invalid {kind} name {name!r}: {NAME_RULE}", field=kind)
    return list(dict.fromkeys(names))


def check_names(kind: str, names: Sequence[str]) -> list[str]:
    """Names to look up, without repeats. Lenient on purpose: objects named before NAME_RULE existed
    must stay reachable to be fixed or deleted. Only what no database can hold is refused here
    (PostgreSQL fails on a NUL); the lookup itself says which names are unknown."""
    if not names:
        raise FleetshardError(f"give at least one {kind} name", field=kind)
    for name in names:
        if not isinstance(name, str) or not name or len(name) > 255 or _UNSTORABLE.search(name):
            raise NotFound(f"unknown {kind} {name!r}", field=kind)
    return list(dict.fromkeys(names))


def check_text(what: str, value: object, field_name: str, *, max_length: int) -> str:
    """Free text to store: a string without NUL or lone surrogates, at most `max_length` long."""
    if not isinstance(value, str):
        raise FleetshardError(f"{what} must be a string, not {type(value).__name__}", field=field_name)
    if _UNSTORABLE.search(value):
        raise FleetshardError(f"{what} must not contain NUL or lone surrogate characters", field=field_name)
    if len(value) > max_length:
        raise FleetshardError(f"{what} is longer than {max_length} characters", field=field_name)
    return value


def check_string_map(kind: str, mapping: object, field_name: str) -> dict[str, str]:
    """Host attributes and job keyvals: names per KEY_RULE (shards put them in environment variable
    names), values storable strings, and a bounded number of entries."""
    if not isinstance(mapping, dict):
        raise FleetshardError(f"{field_name} must map names to strings", field=field_name)
    if len(mapping) > MAX_MAP_ENTRIES:
        raise FleetshardError(
            f"{field_name} may have at most {MAX_MAP_ENTRIES} entries; this one has {len(mapping)}", field=field_name
        )
    for key, value in mapping.items():
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise FleetshardError(f"invalid {kind} name {key!r}: {KEY_RULE}", field=field_name)
        check_text(f"{kind} {key}", value, field_name, max_length=MAX_VALUE_LENGTH)
    check_env_names(kind, mapping, field_name)
    return dict(mapping)


def check_env_names(kind: str, mapping: Mapping[str, object], field_name: str, new: Iterable[str] = ()) -> None:
    """Refuses two names a job would see as one variable (`serial` and `SERIAL`, `a.b` and `a-b`: the
    shard upper-cases them and writes `_` for `.` and `-`): one value was dropped, which one by chance.
    With `new`, only a clash that involves one of those names (older ones were let in before)."""
    seen: dict[str, str] = {}
    fresh = set(new)
    for key in mapping:
        env = re.sub(r"[^A-Za-z0-9_]", "_", key).upper()
        other = seen.setdefault(env, key)
        if other != key and (not fresh or key in fresh or other in fresh):
            raise FleetshardError(
                f"{kind} names {other} and {key} are both {env} in a job's environment: use one", field=field_name
            )


def plural(kind: str, names: Iterable[str]) -> str:
    names = sorted(names)
    return f"{kind}{'s' if len(names) > 1 else ''} {', '.join(names)}"


def get_labels(names: Sequence[str], *, lock: bool = False) -> list[Label]:
    names = list(dict.fromkeys(names))
    qs = Label.objects.select_related("shard").filter(name__in=names)
    found = {label.name: label for label in (qs.select_for_update(of=("self",)) if lock else qs)}
    missing = [n for n in names if n not in found]
    if missing:
        raise NotFound(f"unknown {plural('label', missing)}", field="labels")
    return [found[n] for n in names]


def get_hosts(hostnames: Sequence[str], *, lock: bool = False) -> list[Host]:
    hostnames = list(dict.fromkeys(hostnames))
    qs = Host.objects.filter(hostname__in=hostnames).prefetch_related("labels__shard")
    found = {h.hostname: h for h in (qs.select_for_update(of=("self",)) if lock else qs)}
    missing = [n for n in hostnames if n not in found]
    if missing:
        raise NotFound(f"unknown {plural('host', missing)}", field="hosts")
    return [found[n] for n in hostnames]


def get_shard(hostname: str, *, lock: bool = False) -> Shard:
    qs = Shard.objects.select_for_update() if lock else Shard.objects.all()
    try:
        return qs.get(hostname=hostname)
    except Shard.DoesNotExist:
        raise NotFound(f"unknown shard {hostname}", field="shard") from None


@dataclass(frozen=True)
class HostMove:
    """A host whose shard changed: operators must know which hosts left which shard, since a job
    already queued there for that host can no longer run on it."""

    hostname: str
    from_shard: str | None
    to_shard: str | None


def describe_moves(moves: Sequence[HostMove]) -> str:
    """`host dut3 left shard lab1; hosts a1, a2 joined shard lab2`, or "" when nothing moved."""
    groups: dict[tuple[str | None, str | None], list[str]] = {}
    for move in moves:
        groups.setdefault((move.from_shard, move.to_shard), []).append(move.hostname)
    parts = []
    for (before, after), hostnames in sorted(groups.items(), key=lambda g: (g[0][0] or "", g[0][1] or "")):
        who = plural("host", hostnames)
        if after is None:
            parts.append(f"{who} left shard {before}")
        elif before is None:
            parts.append(f"{who} joined shard {after}")
        else:
            parts.append(f"{who} moved from shard {before} to shard {after}")
    return "; ".join(parts)


def reassign(hosts: Iterable[Host]) -> list[HostMove]:
    """Recomputes each host's shard from its labels; raises (rolling back) on a two-shard host.

    A fixed number of queries however many hosts: one for their labels, one for shard names, and
    one update per shard the hosts move to. Returns the hosts whose shard changed, in hostname order."""
    hosts = sorted(hosts, key=lambda h: h.hostname)
    if not hosts:
        return []
    labels_of: dict[int, list[Label]] = defaultdict(list)
    links = Host.labels.through.objects.filter(host_id__in=[h.id for h in hosts]).select_related("label__shard")
    for link in links:
        labels_of[link.host_id].append(link.label)
    moving: dict[int | None, list[Host]] = defaultdict(list)
    after: dict[int, Shard | None] = {}
    for host in hosts:
        shard = shard_for_labels(host.hostname, labels_of[host.id])
        if (shard.id if shard is not None else None) != host.shard_id:
            moving[shard.id if shard is not None else None].append(host)
            after[host.id] = shard
    if not moving:
        return []
    before_ids = {h.shard_id for group in moving.values() for h in group if h.shard_id is not None}
    names: dict[int | None, str] = dict(Shard.objects.filter(id__in=before_ids).values_list("id", "hostname"))
    moves = []
    for shard_id, group in moving.items():
        Host.objects.filter(id__in=[h.id for h in group]).update(shard_id=shard_id, version=F("version") + 1)
        shards_changed([shard_id, *(h.shard_id for h in group)])
        for host in group:
            moves.append(HostMove(host.hostname, names.get(host.shard_id), getattr(after[host.id], "hostname", None)))
            host.shard = after[host.id]
    return sorted(moves, key=lambda m: m.hostname)


def bump_hosts(hosts: Iterable[Host]) -> None:
    hosts = list(hosts)
    Host.objects.filter(id__in=[h.id for h in hosts]).update(version=F("version") + 1)
    shards_changed(h.shard_id for h in hosts)
