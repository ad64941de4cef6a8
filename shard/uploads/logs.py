"""Each run's output goes to the master while it runs (docs/protocol.md, "Logs"): the shard pushes its
runs' `job.log` in chunks (POST /api/v1/logs/append), since a lab is never called by the master.

The log file is the queue and the master's answer is the cursor. A chunk names its byte offset, so a
chunk sent twice is kept once and a chunk past the master's end is refused with the offset it expects;
the shard keeps no state of its own. After a start it asks the master where each log stands (an
empty chunk at offset 0) and goes on from there, so neither a shard restart nor a master outage loses
or repeats anything: shipping just waits. A log is done once the master took its final chunk (the run
ended and the file was sent to its end).

Bounded: a chunk is at most MAX_LOG_CHUNK_BYTES, a pass sends at most MAX_LOG_PASS_BYTES (a chunk of
each log in turn, then more of those still behind), and passes start LOG_SHIP_INTERVAL_S apart.
Bytes are sent as the job wrote them (NUL, invalid UTF-8 and all): the master decodes them only for
readers. The file is opened without following links and only when
it is the shard's own (a job may put anything under the name `job.log`: it owns the directory).
"""

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.db.models import Q
from django.utils import timezone

from common.constants import LOG_SHIP_INTERVAL_S, MAX_LOG_CHUNK_BYTES, MAX_LOG_PASS_BYTES, HQEStatus
from common.loop import Backoff
from shard.models import Run
from shard.run import open_logs
from shard.run.executor import UnsafeFile, open_regular
from shard.run.workspace import RUN_LOG
from shard.sync.client import (
    MAX_BACKOFF_S,
    OUTAGE_CODES,
    HeartbeatClient,
    MasterUnavailable,
    ReadTimeouts,
    RecordFailed,
    error_of,
    field_of,
    master_session,
    post_bytes,
    run_once_accepted,
    unavailable,
)
from shard.uploads.record_tries import RecordTries

log = logging.getLogger(__name__)

# At a start, runs that ended this long ago or less are shipped to their end (a master that was out
# of reach may lack their last chunks); older ones are left as the master has them.
RESUME_WINDOW = timedelta(days=1)
# Runs ended this long before the last look are looked at again (a transaction that commits late).
RESCAN_SLACK = timedelta(minutes=1)
# A master that has no log endpoint (older than this shard) is asked again this much later.
UNSUPPORTED_PAUSE_S = 300.0


class LogsUnsupported(MasterUnavailable):
    """The master answers 404 for the endpoint itself: it is older than live logs."""


class LogRefused(Exception):
    """The master will never take this HQE's log (unknown HQE, another shard's, a chunk it refuses)."""


@dataclass(frozen=True)
class Answer:
    """Where the master's copy stands: its `size` (send from there), cut at its cap, ended."""

    size: int
    truncated: bool = False
    complete: bool = False


class LogSender:
    """Pushes one chunk of one HQE's log to the master as this shard."""

    def __init__(self, master_url: str, token: str, timeout_s: float) -> None:
        self.url = master_url.rstrip("/") + "/api/v1/logs/append"
        self.session = master_session(token)
        self.timeout = (5.0, timeout_s)
        # When (monotonic) the master last answered anything but a failure (RecordTries).
        self.good_at: float | None = None
        self.timeouts = ReadTimeouts()

    def send(self, hqe_id: int, offset: int, data: bytes, *, final: bool) -> Answer:
        params = {"hqe": str(hqe_id), "offset": str(offset), "final": "true" if final else "false"}
        resp = self.timeouts.check(lambda: post_bytes(self.session, self.url, params, data, self.timeout))
        code = resp.status_code
        if code < 500 and code not in OUTAGE_CODES:
            self.good_at = time.monotonic()
        try:
            body = resp.json()
        except ValueError:
            body = None
        if code == 200 and isinstance(body, dict) and isinstance(body.get("size"), int):
            return Answer(int(body["size"]), bool(body.get("truncated")), bool(body.get("complete")))
        detail = body.get("detail") if isinstance(body, dict) else None
        expected = detail.get("expected_offset") if isinstance(detail, dict) else None
        if code == 409 and isinstance(expected, int) and not isinstance(expected, bool) and expected >= 0:
            return Answer(expected)
        if (code in (403, 404) and field_of(resp) == "hqe") or code in (400, 413):
            raise LogRefused(f"the master refused the log of HQE {hqe_id} ({code}): {error_of(resp)}")
        if code in (404, 405):
            raise LogsUnsupported(f"the master has no log endpoint ({code}): it is older than this shard")
        raise unavailable(code, f"the master answered {code}: {error_of(resp)}")


@dataclass
class Shipping:
    """One run's log on its way: the master's size once known (None: ask first)."""

    hqe_id: int
    path: Path
    ended: bool = False
    offset: int | None = None
    finished: bool = False
    warned: set[str] = field(default_factory=set)
    # The shard's own descriptor of the log (shard/run/open_logs.py), taken while the run was live here.
    fd: int | None = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class LogShipper:
    """The shard's log thread: finds running and recently ended runs, pushes what their logs gained.

    Its own thread, so a slow or absent master delays only logs, never a heartbeat or the scheduler.
    """

    def __init__(self, client: HeartbeatClient, results_root: Path, interval_s: float = LOG_SHIP_INTERVAL_S) -> None:
        self.client = client
        self.sender = LogSender(client.master_url, client.token, client.timeout[1])
        self.root = results_root.resolve()
        self.interval_s = interval_s
        self.pass_bytes = MAX_LOG_PASS_BYTES
        self.owners = (os.geteuid(),)
        self.logs: dict[int, Shipping] = {}
        # Ended runs whose log the master has whole, among those the last look returned.
        self.done: set[int] = set()
        self.since: datetime | None = None
        self.tries = RecordTries(settings.FLEETSHARD_UPLOAD_MAX_TRIES, lambda: self.client.interval, self._healthy_at)

    def _healthy_at(self) -> float | None:
        times = (self.client.last_ok, getattr(self.sender, "good_at", None))
        return max((t for t in times if t is not None), default=None)

    def find_runs(self) -> None:
        """Adds runs that started, and notes those that ended, since the last look."""
        now = timezone.now()
        since = now - RESUME_WINDOW if self.since is None else self.since
        runs = Run.objects.filter(Q(hqe__status__in=HQEStatus.ACTIVE) | Q(hqe__finished_on__gte=since))
        rows = list(runs.exclude(results_dir="").values_list("hqe_id", "results_dir", "hqe__status"))
        self.since = now - RESCAN_SLACK
        for hqe_id, results_dir, status in rows:
            state = self.logs.get(hqe_id)
            if state is None:
                if hqe_id in self.done:
                    continue
                path = Path(results_dir)
                if not path.is_relative_to(self.root):
                    log.warning(
                        "HQE %s: run directory %s is outside %s: its log is not shipped", hqe_id, path, self.root
                    )
                    self.done.add(hqe_id)
                    continue
                state = self.logs[hqe_id] = Shipping(hqe_id, path / RUN_LOG)
            state.ended = status in HQEStatus.TERMINAL
        self.done &= {row[0] for row in rows}

    def ship_pass(self, stop: threading.Event) -> None:
        """A chunk of every log that has something for the master, then more rounds of those still
        behind while the pass's byte budget lasts (so a backlog catches up, fairly); raises
        MasterUnavailable."""
        budget = self.pass_bytes
        waiting = sorted(self.logs)
        while waiting and budget > 0:
            behind = []
            for hqe_id in waiting:
                if stop.is_set() or budget <= 0:
                    return
                state = self.logs[hqe_id]
                if not self.tries.due(hqe_id):
                    continue
                try:
                    sent, more = self.ship(state)
                    self.tries.done(hqe_id)
                except LogRefused as exc:
                    log.warning("HQE %s: its log is not shipped: %s", hqe_id, exc)
                    sent, more = 0, False
                    state.finished = True
                except RecordFailed as exc:
                    # The master failed on this log's chunk: it waits, the other logs go on.
                    sent, more = 0, False
                    given_up = self.tries.failed(hqe_id, str(exc))
                    if given_up is None:
                        log.warning("HQE %s: log chunk not taken (%s); tried again later", hqe_id, exc)
                    else:
                        log.warning("HQE %s: its log is not shipped further: the master %s", hqe_id, given_up)
                        state.finished = True
                budget -= sent
                if state.finished:
                    state.close()
                    del self.logs[hqe_id]
                    self.done.add(hqe_id)
                elif more:
                    behind.append(hqe_id)
            waiting = behind

    def ship(self, state: Shipping) -> tuple[int, bool]:
        """Sends the log's next chunk if it has one: the bytes sent, and whether more are waiting.
        Sets `state.finished` once the master has the whole log."""
        if state.offset is None:
            where = self.sender.send(state.hqe_id, 0, b"", final=False)
            state.offset = where.size
            if where.complete:  # shipped whole before a restart: nothing may follow a final chunk
                state.finished = True
                return 0, False
        data, eof = self._read(state)
        if data is None:
            state.finished = self._finish_unreadable(state)
            return 0, False
        final = state.ended and eof
        if not data and not final:
            return 0, False
        answer = self.sender.send(state.hqe_id, state.offset, data, final=final)
        state.offset = answer.size
        if answer.truncated and not final:
            # Past the master's cap nothing is stored: skip to the end of the file, and send only its end.
            state.offset = max(answer.size, self._file_size(state))
        state.finished = final and answer.complete
        return len(data), not eof or answer.truncated

    def _read(self, state: Shipping) -> tuple[bytes | None, bool]:
        """The file's next chunk from the master's offset and whether it reaches the end; None: unreadable."""
        assert state.offset is not None
        if state.fd is None:
            state.fd = open_logs.duplicate(state.path)
        if state.fd is not None:
            # The shard's own file, whatever the job did to the name `job.log` since.
            size = os.fstat(state.fd).st_size
            data = os.pread(state.fd, max(0, min(MAX_LOG_CHUNK_BYTES, size - state.offset)), state.offset)
            return data, state.offset + len(data) >= size
        try:
            fd = open_regular(state.path, os.O_RDONLY, self.owners)
        except FileNotFoundError:
            # Not made yet (a starting run), or gone (removed by retention): nothing to send for now.
            return (None, True) if state.ended else (b"", False)
        except UnsafeFile as exc:
            self._warn(state, "unsafe", f"{state.path} is not the shard's log ({exc})")
            return None, True
        except OSError as exc:
            self._warn(state, "open", f"cannot open {state.path} ({exc.strerror})")
            return (None, True) if state.ended else (b"", False)
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, max(0, min(MAX_LOG_CHUNK_BYTES, size - state.offset)), state.offset)
        finally:
            os.close(fd)
        return data, state.offset + len(data) >= size

    def _finish_unreadable(self, state: Shipping) -> bool:
        """An ended run whose log cannot be read: the master is told it ended with what it has."""
        assert state.offset is not None
        if not state.ended:
            return False
        answer = self.sender.send(state.hqe_id, state.offset, b"", final=True)
        return answer.complete

    def _file_size(self, state: Shipping) -> int:
        if state.fd is not None:
            return os.fstat(state.fd).st_size
        try:
            fd = open_regular(state.path, os.O_RDONLY, self.owners)
        except OSError:
            return 0
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _warn(self, state: Shipping, kind: str, message: str) -> None:
        if kind not in state.warned:
            state.warned.add(kind)
            log.warning("HQE %s: %s", state.hqe_id, message)

    def flush(self, timeout_s: float) -> None:
        """A stopping shard's last passes: the ends of its runs' logs, for up to `timeout_s`."""
        # A pass stops between chunks at the deadline: a slow master must not hold a stopping shard.
        deadline = threading.Event()
        timer = threading.Timer(timeout_s, deadline.set)
        timer.daemon = True
        timer.start()
        try:
            while not deadline.is_set():
                self.find_runs()
                self.ship_pass(deadline)
                if not any(state.ended for state in self.logs.values()):
                    return
                deadline.wait(0.1)
        except (MasterUnavailable, DatabaseError) as exc:
            log.warning("the ends of %d logs are not shipped (%s); the next start sends them", len(self.logs), exc)
        finally:
            timer.cancel()

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: waits for the master to accept this shard instance, then ships as logs grow."""

        def step() -> float:
            started = time.monotonic()
            close_old_connections()
            try:
                self.find_runs()
                self.ship_pass(stop)
            except LogsUnsupported as exc:
                log.warning("log shipping paused (%s); trying again in %.0f s", exc, UNSUPPORTED_PAUSE_S)
                return UNSUPPORTED_PAUSE_S
            return max(0.0, self.interval_s - (time.monotonic() - started))

        run_once_accepted(
            self.client, stop, step, what="log shipping", logger=log, backoff=Backoff(base_s=0.5, cap_s=MAX_BACKOFF_S)
        )
