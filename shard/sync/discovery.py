"""Discovery on a shard: the hosts its sources find become its discovered set, sent whole in the heartbeat
until the master acks its generation (docs/design.md, "Capacity that registers itself").

Sources (FLEETSHARD_DISCOVERY, comma-separated): `file:PATH` (a JSON list of host records, read again
when it changes), `command:PATH` (run without a shell, killed after COMMAND_TIMEOUT_S, one JSON record a
line) and `adb` (`adb devices -l`: only devices in state `device`). A source that fails, hangs or prints
garbage keeps its last good set and logs one line naming itself; nothing here ever stops the shard.
"""

import contextlib
import json
import logging
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common.constants import HostStatus
from common.models import Host
from common.wire import DiscoveredAck
from shard.models import DiscoveryState, HostState

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 30.0
# What a source may print or a file hold: far above 10,000 records, far below a memory problem.
MAX_SOURCE_BYTES = 32 * 1024 * 1024
# What is kept of a command's standard error, for the log line: its tail.
MAX_STDERR_BYTES = 4096
_UNSAFE_NAME = re.compile(r"[^a-z0-9._\-:@+=]+")
# What no database column can hold as text: PostgreSQL's jsonb refuses NUL, no encoder a lone surrogate.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
MAX_RECORD_LABELS = 32
MAX_RECORD_ATTRIBUTES = 64
# The set travels in one heartbeat, whose body the master takes up to 10 MiB.
MAX_SET_BYTES = 6 * 1024 * 1024
ADB_ATTRIBUTES = ("model", "product", "device", "transport_id")


class SourceFailed(Exception):
    """A source's run gave no usable set; the message says why, for the one log line."""


def clean_hostname(raw: str) -> str:
    """A device's serial as a hostname under the master's name rules: lower-case, anything else a dash,
    no '..', not starting with '.', at most 255 characters."""
    name = _UNSAFE_NAME.sub("-", raw.lower())
    while ".." in name:
        name = name.replace("..", ".")
    return name.lstrip(".")[:255]


def default_labels() -> list[str]:
    return [n.strip() for n in settings.FLEETSHARD_DISCOVERY_LABELS.split(",") if n.strip()]


def _storable(text: str, what: str, where: str) -> str:
    if _UNSTORABLE.search(text):
        raise SourceFailed(f"{where}: {what} {text[:40]!r} holds NUL or a lone surrogate, which no database stores")
    return text


def _record(item: object, where: str) -> dict[str, Any]:
    """A host record as the master reads it; labels default to FLEETSHARD_DISCOVERY_LABELS. The master
    judges names and labels (and says why it refuses one); here the shape and size are checked, since a
    heartbeat too deep or too large for the master would be refused whole, again and again, and what
    the shard's own database cannot store (NUL, lone surrogates) would fail every run of every source.

    Hostnames are lower-cased, as `adb`'s are: `Pixel-1` and `pixel-1` are one device (hostnames are
    case-insensitive, as in DNS), the first source's record kept."""
    if not isinstance(item, dict) or not isinstance(item.get("hostname"), str):
        raise SourceFailed(f'{where}: expected a host record {{"hostname": ...}}, got {str(item)[:80]!r}')
    labels = item.get("labels", default_labels())
    attributes = item.get("attributes", {})
    if not isinstance(labels, list) or not all(isinstance(n, str) and len(n) <= 255 for n in labels):
        raise SourceFailed(f"{where}: labels must be a list of label names")
    if len(labels) > MAX_RECORD_LABELS:
        raise SourceFailed(f"{where}: at most {MAX_RECORD_LABELS} labels, got {len(labels)}")
    if not isinstance(attributes, dict) or len(attributes) > MAX_RECORD_ATTRIBUTES:
        raise SourceFailed(f"{where}: attributes must map at most {MAX_RECORD_ATTRIBUTES} names to strings")
    for key, value in attributes.items():
        if not isinstance(value, str) or len(key) > 255 or len(value) > 1024:
            raise SourceFailed(f"{where}: attribute {str(key)[:40]!r} must be a string of at most 1024 characters")
        _storable(key, "attribute name", where)
        _storable(value, f"attribute {key[:40]!r}", where)
    for label in labels:
        _storable(label, "label", where)
    hostname = _storable(item["hostname"][:1024], "hostname", where).lower()
    return {"hostname": hostname, "labels": labels, "attributes": attributes}


def _parsed(items: Iterable[tuple[str, object]]) -> list[dict[str, Any]]:
    """The records of a source, stopping at the first beyond FLEETSHARD_MAX_DISCOVERED_HOSTS: a source
    printing 100,000 hosts costs the checking of 10,001."""
    limit = settings.FLEETSHARD_MAX_DISCOVERED_HOSTS
    records: list[dict[str, Any]] = []
    for where, item in items:
        if len(records) == limit:
            raise SourceFailed(f"found more than FLEETSHARD_MAX_DISCOVERED_HOSTS={limit} hosts")
        records.append(_record(item, where))
    return records


@dataclass
class Source:
    """One of FLEETSHARD_DISCOVERY's sources and its last good set."""

    name: str
    run: Callable[[], list[dict[str, Any]]]
    last_good: list[dict[str, Any]] | None = None


@dataclass
class FileSource:
    """`file:PATH`: read again when the file changes (another inode, size or modification time). Only a
    regular file (a symlink to one is fine) is read, and never more than MAX_SOURCE_BYTES of it: a FIFO
    would block the read for ever, /dev/zero fill the memory, and a file that grows while read would
    pass a size checked beforehand."""

    path: Path
    _seen: tuple[int, int, int, int] | None = None
    _records: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self) -> list[dict[str, Any]]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise SourceFailed(f"cannot read it: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SourceFailed("not a regular file (a FIFO, a device or a directory): not read")
            seen = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if self._seen == seen:
                return self._records
            if st.st_size > MAX_SOURCE_BYTES:
                raise SourceFailed(f"{st.st_size} bytes, more than {MAX_SOURCE_BYTES}")
            raw = bytearray()
            while len(raw) <= MAX_SOURCE_BYTES and (chunk := os.read(fd, 1 << 20)):
                raw += chunk
        except OSError as exc:
            raise SourceFailed(f"cannot read it: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        if len(raw) > MAX_SOURCE_BYTES:
            raise SourceFailed(f"grew past {MAX_SOURCE_BYTES} bytes while read")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise SourceFailed(f"not JSON: {exc}") from None
        if not isinstance(data, list):
            raise SourceFailed(f"expected a JSON list of host records, got {type(data).__name__}")
        self._records = _parsed((f"item {i}", item) for i, item in enumerate(data))
        self._seen = seen
        return self._records


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def run_bounded(argv: list[str], timeout_s: float | None = None) -> bytes:
    """Runs `argv` without a shell in its own process group and returns what it printed. The group is
    killed, and the run fails, once it has run `timeout_s` or printed more than MAX_SOURCE_BYTES;
    only the tail of its standard error is kept. Nothing it leaves behind (a child in a session of its
    own still holding the output open) makes this wait past `timeout_s`."""
    timeout_s = COMMAND_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise SourceFailed(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout_s
    failure = ""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map() and not failure:
            left = deadline - time.monotonic()
            if left <= 0:
                failure = (
                    f"still running after {timeout_s:g} s: killed"
                    if proc.poll() is None
                    else f"exited, but what it started still held its output open after {timeout_s:g} s: killed"
                )
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                buffer: bytearray = key.data
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer += chunk
                if buffer is err:
                    del err[:-MAX_STDERR_BYTES]
                elif len(out) > MAX_SOURCE_BYTES:
                    failure = f"printed more than {MAX_SOURCE_BYTES} bytes: killed"
                    break
    try:
        if not failure:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failure = f"still running after {timeout_s:g} s: killed"
        if failure:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise SourceFailed(failure)
    finally:
        proc.stdout.close()
        proc.stderr.close()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:]
        how = (
            f"killed by signal {_signal_name(-proc.returncode)}"
            if proc.returncode < 0
            else f"exited with status {proc.returncode}"
        )
        raise SourceFailed(f"{how}{': ' + tail[0][:200] if tail else ''}")
    return bytes(out)


def command_source(path: str) -> Callable[[], list[dict[str, Any]]]:
    def run() -> list[dict[str, Any]]:
        raw = run_bounded([path])
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise SourceFailed(f"line {line} is not UTF-8 text: {raw[exc.start : exc.start + 8]!r}") from None
        return _parsed(_lines(text))

    return run


def _lines(text: str) -> Iterable[tuple[str, object]]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            raise SourceFailed(f"line {number} is not JSON: {line[:80]!r}") from None
        yield f"line {number}", item


def parse_adb_devices(text: str) -> list[dict[str, Any]]:
    """`adb devices -l` output as host records: only devices in state `device` (not `offline`,
    `unauthorized`, `no permissions`...); `adb-SERIAL` cleaned, with model, product, device, transport_id
    (printable characters only). Two serials that clean to one hostname are one record, the first."""
    records: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("List of devices", "*")):
            continue
        parts = line.split()
        if len(parts) < 2 or parts[1] != "device":
            continue
        attributes = {}
        for part in parts[2:]:
            key, sep, value = part.partition(":")
            if sep and key in ADB_ATTRIBUTES:
                attributes[key] = "".join(c if c.isprintable() else "?" for c in value[:1024])
        hostname = clean_hostname("adb-" + parts[0])
        records.setdefault(hostname, {"hostname": hostname, "labels": default_labels(), "attributes": attributes})
    return list(records.values())


def adb_source() -> list[dict[str, Any]]:
    adb = shutil.which("adb")
    if adb is None:
        raise SourceFailed("no adb on PATH")
    records = parse_adb_devices(run_bounded([adb, "devices", "-l"]).decode(errors="replace"))
    return _parsed((r["hostname"], r) for r in records)


def parse_sources(spec: str) -> list[Source]:
    """FLEETSHARD_DISCOVERY's sources; a ValueError names the one that is not understood."""
    sources = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        kind, sep, arg = part.partition(":")
        if part == "adb":
            sources.append(Source("adb", adb_source))
        elif kind == "file" and sep and arg:
            sources.append(Source(part, FileSource(Path(arg))))
        elif kind == "command" and sep and arg:
            sources.append(Source(part, command_source(arg)))
        else:
            raise ValueError(f"FLEETSHARD_DISCOVERY: unknown source {part!r}: use file:PATH, command:PATH or adb")
    return sources


def run_sources(sources: list[Source]) -> tuple[list[dict[str, Any]] | None, dict[str, dict[str, Any]]]:
    """The merged set (a hostname found twice: the first source's record), and each source's run. The
    set is None, meaning "keep the one recorded", when the sources together found more than
    FLEETSHARD_MAX_DISCOVERED_HOSTS or more than one heartbeat carries: the master would refuse it whole."""
    runs: dict[str, dict[str, Any]] = {}
    merged: dict[str, dict[str, Any]] = {}
    for source in sources:
        at = timezone.now().isoformat()
        try:
            source.last_good = source.run()
            runs[source.name] = {"at": at, "ok": True, "hosts": len(source.last_good), "error": ""}
        except SourceFailed as exc:
            kept = len(source.last_good or [])
            log.warning("discovery source %s failed: %s; keeping its last good set (%d hosts)", source.name, exc, kept)
            runs[source.name] = {"at": at, "ok": False, "hosts": kept, "error": str(exc)[:500]}
        except Exception as exc:  # noqa: BLE001 - a source must never stop the shard
            log.warning("discovery source %s failed unexpectedly: %r; keeping its last good set", source.name, exc)
            runs[source.name] = {"at": at, "ok": False, "hosts": len(source.last_good or []), "error": repr(exc)[:500]}
        for record in source.last_good or []:
            merged.setdefault(record["hostname"], record)
    hosts = sorted(merged.values(), key=lambda r: r["hostname"])
    limit = settings.FLEETSHARD_MAX_DISCOVERED_HOSTS
    found = ", ".join(f"{name} {run['hosts']}" for name, run in runs.items())
    if len(hosts) > limit:
        log.warning(
            "discovery: the sources found %d hosts together (%s), more than FLEETSHARD_MAX_DISCOVERED_HOSTS=%d: "
            "keeping the set recorded before",
            len(hosts),
            found,
            limit,
        )
        return None, runs
    size = len(json.dumps(hosts))
    if size > MAX_SET_BYTES:
        log.warning(
            "discovery: the merged set is %d bytes (%s), more than %d: keeping the set recorded before",
            size,
            found,
            MAX_SET_BYTES,
        )
        return None, runs
    return hosts, runs


def state() -> DiscoveryState:
    found, _ = DiscoveryState.objects.get_or_create(id=1)
    return found


@transaction.atomic
def record_set(hosts: list[dict[str, Any]] | None, runs: dict[str, dict[str, Any]]) -> bool:
    """Stores the set (a new generation when it changed) and follows it on the hosts this shard holds: a
    host that left the set is Missing (no work; the scheduler stops a run on it) until it is back, and
    Ready again once back and idle. `hosts` None keeps the set and notes the sources' runs. True if the
    set changed."""
    current = DiscoveryState.objects.select_for_update().filter(id=1).first() or state()
    if hosts is None:
        current.sources = runs
        current.save(update_fields=["sources"])
        return False
    changed = bool(hosts != current.hosts)
    previous = {r["hostname"] for r in current.hosts if isinstance(r, dict)}
    names = {r["hostname"] for r in hosts}
    if changed:
        current.generation += 1
        current.hosts = hosts
    missing = (set(current.missing) | (previous - names)) - names
    current.missing = sorted(missing)[: settings.FLEETSHARD_MAX_DISCOVERED_HOSTS]
    current.sources = runs
    current.save()
    if missing:
        Host.objects.filter(hostname__in=current.missing).exclude(status=HostStatus.MISSING).update(
            status=HostStatus.MISSING
        )
    idle = HostState.objects.filter(runner="").values("host_id")
    Host.objects.filter(hostname__in=names, id__in=idle, status=HostStatus.MISSING).update(status=HostStatus.READY)
    return changed


def discovery_request() -> dict[str, Any]:
    """The heartbeat's `discovered` field while the master has not acked the set's generation (the
    sources' hosts and the live workers', with the hosts of workers that exited cleanly as `released`),
    and `pools` while the master has not taken the list."""
    fields = ("generation", "hosts", "acked_generation", "worker_hosts", "released", "pools", "pools_sent")
    row = DiscoveryState.objects.filter(id=1).values(*fields).first()
    if not row:
        return {}
    out: dict[str, Any] = {}
    if row["generation"] > row["acked_generation"]:
        names = {r["hostname"] for r in row["hosts"]}
        hosts = row["hosts"] + [r for r in row["worker_hosts"] if r["hostname"] not in names]
        out["discovered"] = {"generation": row["generation"], "hosts": hosts}
        if row["released"]:
            out["discovered"]["released"] = [name for name, _ in row["released"]]
    if row["pools"] != row["pools_sent"] and row["pools"]:
        out["pools"] = row["pools"]
    return out


def discovery_unacked() -> bool:
    """Whether a discovered generation waits for the master's ack (a stopping shard's last heartbeats
    carry it: an elastic worker's released hosts)."""
    return DiscoveryState.objects.filter(id=1, generation__gt=F("acked_generation")).exists()


@transaction.atomic
def note_ack(sent: dict[str, Any], ack: DiscoveredAck | None) -> None:
    """The master's answer to a heartbeat that carried discovery. A master ahead of this database
    (restored from an older copy) makes the next generation start above its own, so the set is applied
    again."""
    if "pools" in sent:
        DiscoveryState.objects.filter(id=1).update(pools_sent=sent["pools"])
    if ack is None or "discovered" not in sent:
        return
    current = DiscoveryState.objects.select_for_update().get(id=1)
    sent_generation = sent["discovered"]["generation"]
    if ack.generation > current.generation:
        log.warning(
            "the master already applied discovered generation %d; this shard's is %d: sending the set again as %d",
            ack.generation,
            current.generation,
            ack.generation + 1,
        )
        current.generation = ack.generation + 1
    elif ack.generation >= sent_generation:
        if current.acked_generation < ack.generation:
            for r in ack.rejected:
                log.warning("the master refused discovered host %s: %s", r.hostname, r.reason)
        current.acked_generation = ack.generation
        current.rejected = [r.to_wire() for r in ack.rejected]
        current.released = [r for r in current.released if r[1] > ack.generation]
    current.save()


class DiscoveryLoop:
    """The sources' runs in a thread of their own: at start (once the master accepted this database) and
    every FLEETSHARD_DISCOVERY_INTERVAL_S; a changed set nudges the heartbeat."""

    def __init__(self, sources: list[Source], accepted: threading.Event, nudge: threading.Event) -> None:
        self.sources = sources
        self.accepted = accepted
        self.nudge = nudge
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="discovery", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=COMMAND_TIMEOUT_S + 5)

    def once(self) -> bool:
        return record_set(*run_sources(self.sources))

    def _loop(self) -> None:
        while not self.stop.is_set() and not self.accepted.wait(1):
            pass
        while not self.stop.is_set():
            try:
                if self.once():
                    self.nudge.set()
            except Exception:  # noqa: BLE001 - a database hiccup waits for the next interval
                log.exception("discovery failed; trying again in %g s", settings.FLEETSHARD_DISCOVERY_INTERVAL_S)
            self.stop.wait(settings.FLEETSHARD_DISCOVERY_INTERVAL_S)
