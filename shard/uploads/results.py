"""What an ended run measured goes to the master: each `results/*.json` of the run's directory is
uploaded (POST /api/v1/results/upload with `hqe`), then moved beside it, to `archive/` once the master
has it or to `quarantine/` (with `NAME.error` saying why) when the master never will. A file the shard
refuses to send is reported first (POST /api/v1/results/quarantined), so that operators see it in the
job's stat like the files the master refused.

The files on disk are the queue. A file still in `results/` is not handled yet; the master stores the
same file once (an upload repeated after a crash between upload and move answers `created: false`),
so a restart re-sends what it finds and nothing is lost or stored twice. A run is uploaded only once
its HQE is terminal: its processes are gone and nothing writes there any more.

No file holds back another (docs/protocol.md, "Results"): one the master answers but fails on (a
500, a 409) waits its own backoff while the rest go on, and is quarantined after
FLEETSHARD_UPLOAD_MAX_TRIES failed tries (shard/uploads/record_tries.py); only an outage stops a pass.

The files are the job's (it ran as the job user), so none is trusted: a link, a pipe, a hard link or
another user's file is never opened but quarantined, a file is read only up to the master's limit,
and a run sends at most MAX_RESULT_FILES_PER_RUN files. `archive/` and `quarantine/` are made by the shard
after the run ended; a job that made one of these names itself had it renamed aside first
(`archive.job`), so the shard never writes through a directory or link a job chose.
"""

import contextlib
import errno
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import requests
from django.conf import settings
from django.db import close_old_connections
from django.db.models import Q
from django.utils import timezone

from common.ab import tags_of
from common.constants import MAX_RESULT_FILE_BYTES, MAX_RESULT_FILES_PER_RUN, MAX_RESULT_REASON_CHARS, HQEStatus
from common.loop import Backoff
from common.network import request_failure
from common.wire import clean_text
from shard.blobs.outputs import OutputSender, has_outputs, max_output_bytes, upload_outputs
from shard.config import SchedulerConfig
from shard.models import Run
from shard.run.executor import UnsafeFile, open_regular
from shard.run.workspace import ARCHIVE, QUARANTINE, RESULT_SUFFIX, RESULTS, TRACE
from shard.sync.client import (
    OUTAGE_CODES,
    HeartbeatClient,
    MasterUnavailable,
    ReadTimeouts,
    RecordFailed,
    error_of,
    field_of,
    jittered,
    master_session,
    post_bytes,
    run_once_accepted,
    unavailable,
)
from shard.uploads.record_tries import RecordTries

log = logging.getLogger(__name__)

ERROR_SUFFIX = ".error"
# A failed pass is retried within this long (jittered): ended runs reach a returning master soon.
RETRY_CAP_S = 15.0
# Runs ended this long before the last look are looked at again: the clocks of two schedulers sharing
# the database, and a transaction that commits late, must not hide a run.
RESCAN_SLACK = timedelta(minutes=1)
OVER_CAP = f"not sent: more than {MAX_RESULT_FILES_PER_RUN} result files in one run"


@dataclass(frozen=True)
class Verdict:
    """Where a file goes: `archive` (the master has it) or `quarantine` with the reason."""

    quarantine: bool = False
    reason: str = ""
    # The master refused the run itself (unknown HQE, another shard's): its other files go the same way.
    whole_run: bool = False
    # The shard refused it: the master never saw it and hears of it only from a report.
    unsent: bool = False


ARCHIVED = Verdict()


class Sender:
    """Uploads one file to the master as this shard; the answer decides the file's place."""

    def __init__(self, master_url: str, token: str, timeout_s: float | None = None) -> None:
        self.url = master_url.rstrip("/") + "/api/v1/results/upload"
        self.trace_url = master_url.rstrip("/") + "/api/v1/timeline/trace"
        self.report_url = master_url.rstrip("/") + "/api/v1/results/quarantined"
        self.session = master_session(token)
        self.timeout = (5.0, timeout_s or settings.FLEETSHARD_REQUEST_TIMEOUT_S)
        # When (monotonic) the master last answered anything but a failure: it works (RecordTries).
        self.good_at: float | None = None
        self.timeouts = ReadTimeouts()

    def _answered(self, resp: requests.Response) -> int:
        code = resp.status_code
        if code < 500 and code not in OUTAGE_CODES:
            self.good_at = time.monotonic()
        return code

    def send(self, hqe_id: int, name: str, data: bytes) -> Verdict:
        """Raises MasterUnavailable for an outage, RecordFailed when the master failed on this file."""
        # The name as the job wrote it, byte for byte: `requests` URL-encodes bytes, whatever they are.
        params: dict[str, str | bytes] = {"name": os.fsencode(name), "hqe": str(hqe_id)}
        tags = tags_of(name)
        if tags is not None:  # a run of an A/B job, renamed by its driver (shard/run/abrun.py)
            params.update(variant=tags[0], repeat=str(tags[1]))
        resp = self.timeouts.check(lambda: post_bytes(self.session, self.url, params, data, self.timeout))
        code = self._answered(resp)
        if code in (200, 201):
            return ARCHIVED
        if code in (400, 413):
            return Verdict(quarantine=True, reason=f"the master refused it ({code}): {error_of(resp)}")
        # Refusals of the run itself name `hqe`; a 404 without it is a master without this endpoint.
        if code in (403, 404) and field_of(resp) == "hqe":
            reason = f"the master refused HQE {hqe_id} ({code}): {error_of(resp)}"
            return Verdict(quarantine=True, reason=reason, whole_run=True)
        raise unavailable(code, f"the master answered HTTP {code}: {error_of(resp)}")

    def send_trace(self, hqe_id: int, data: bytes) -> Verdict:
        """Uploads the job's own trace.json for the master's timeline."""
        resp = self.timeouts.check(
            lambda: post_bytes(self.session, self.trace_url, {"hqe": str(hqe_id)}, data, self.timeout)
        )
        code = self._answered(resp)
        if code in (200, 201):
            return ARCHIVED
        if code in (400, 403, 413) or (code == 404 and field_of(resp) == "hqe"):
            return Verdict(quarantine=True, reason=f"the master refused it ({code}): {error_of(resp)}")
        if code in (404, 405):
            # A master older than timelines: it never will take it, and results must not wait for it.
            return Verdict(quarantine=True, reason=f"the master takes no job traces ({code})")
        raise unavailable(code, f"the master answered {code}: {error_of(resp)}")

    def report(self, hqe_id: int, name: str, reason: str) -> Verdict | None:
        """Tells the master why a file of the run is quarantined unsent. None once it is told (or will
        never take this report); a whole-run Verdict when it refuses the HQE itself."""
        params: dict[str, str | bytes] = {"name": os.fsencode(name), "hqe": str(hqe_id)}
        body = {"reason": clean_text(reason)[:MAX_RESULT_REASON_CHARS]}
        try:
            resp = self.session.post(self.report_url, params=params, json=body, timeout=self.timeout)
        except requests.RequestException as exc:
            raise MasterUnavailable(f"cannot reach the master: {request_failure(exc)}") from exc
        code = self._answered(resp)
        if code in (200, 201):
            return None
        if code in (403, 404) and field_of(resp) == "hqe":
            reason = f"the master refused HQE {hqe_id} ({code}): {error_of(resp)}"
            return Verdict(quarantine=True, reason=reason, whole_run=True)
        # A report it refuses (400), or a master older than this endpoint: the file is set aside all the
        # same, or one planted link would hold back every upload after it.
        if code in (400, 404, 405):
            log.warning(
                "HQE %s: the master did not record why %s is quarantined (%s): %s", hqe_id, name, code, error_of(resp)
            )
            return None
        raise unavailable(code, f"the master answered HTTP {code}: {error_of(resp)}")


def pending_names(results_fd: int) -> list[str]:
    """The result files waiting in an open `results/`, in name order."""
    return sorted(n for n in os.listdir(results_fd) if n.endswith(RESULT_SUFFIX))


def read_result(results_fd: int, name: str, owners: tuple[int, ...]) -> bytes | str:
    """The file's bytes, or why it is not sent (it is no regular file of the job, or too large).

    Raises FileNotFoundError when it is gone (another shard process sharing the database moved it)."""
    try:
        fd = open_regular(name, os.O_RDONLY, owners, dir_fd=results_fd)
    except UnsafeFile as exc:
        return f"not sent: {exc}"
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "not sent: a symbolic link"
        return f"not sent: cannot open it ({exc.strerror})"
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_RESULT_FILE_BYTES + 1)
    if len(data) > MAX_RESULT_FILE_BYTES:
        return f"not sent: larger than {MAX_RESULT_FILE_BYTES} bytes"
    return data


def own_dir(run_fd: int, name: str) -> int:
    """An open `RUN/NAME` directory of the shard's own; what a job left under that name is renamed aside."""
    for attempt in range(2):
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=run_fd)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=run_fd)
        except OSError:
            fd = -1
        if fd >= 0 and os.fstat(fd).st_uid == os.geteuid():
            return fd
        if fd >= 0:
            os.close(fd)
        if attempt == 0:
            _rename_aside(run_fd, name)
    raise OSError(f"cannot make {name}/ of the shard's own")


def _rename_aside(run_fd: int, name: str) -> None:
    for n in range(1, 1000):
        aside = f"{name}.job" if n == 1 else f"{name}.job-{n}"
        try:
            os.stat(aside, dir_fd=run_fd, follow_symlinks=False)
        except FileNotFoundError:
            log.warning("a job left %s in its run directory: renamed to %s", name, aside)
            os.rename(name, aside, src_dir_fd=run_fd, dst_dir_fd=run_fd)
            return
    raise OSError(f"cannot rename the job's {name} aside")


class RunResults:
    """One ended run's directory, opened without following links; its places made on first use."""

    def __init__(self, run_dir: Path, owners: tuple[int, ...]) -> None:
        self.owners = owners
        self.run_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.results_fd = -1
        self._places: dict[str, int] = {}
        # No results/, or a job's link in its place: nothing to send.
        with contextlib.suppress(OSError):
            self.results_fd = os.open(
                RESULTS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.run_fd
            )

    def close(self) -> None:
        for fd in (self.run_fd, self.results_fd, *self._places.values()):
            if fd >= 0:
                os.close(fd)

    def names(self) -> list[str]:
        return pending_names(self.results_fd) if self.results_fd >= 0 else []

    def archived(self) -> int:
        """How many files of this run the master already has: the per-run cap holds across restarts."""
        try:
            fd = os.open(ARCHIVE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.run_fd)
        except OSError:
            return 0
        try:
            return len(os.listdir(fd)) if os.fstat(fd).st_uid == os.geteuid() else 0
        finally:
            os.close(fd)

    def read(self, name: str) -> bytes | str:
        return read_result(self.results_fd, name, self.owners)

    def _place(self, name: str) -> int:
        if name not in self._places:
            self._places[name] = own_dir(self.run_fd, name)
        return self._places[name]

    def archive(self, name: str, *, src: int | None = None) -> None:
        self._move(name, self._place(ARCHIVE), src)

    def quarantine(self, name: str, reason: str, *, src: int | None = None) -> None:
        place = self._place(QUARANTINE)
        # The reason first: a crash before the move leaves the file to be handled again, never a file without it.
        try:
            fd = os.open(
                name + ERROR_SUFFIX,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=place,
            )
        except OSError as exc:
            log.warning("%s: cannot write why it is quarantined (%s): %s", name, exc.strerror, reason)
        else:
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
                f.write(reason + "\n")
        self._move(name, place, src)

    def _move(self, name: str, place: int, src: int | None = None) -> None:
        # Another shard process sharing this database may have moved it first: then it is done.
        with contextlib.suppress(FileNotFoundError):
            os.rename(name, name, src_dir_fd=self.results_fd if src is None else src, dst_dir_fd=place)


def upload_run(
    run_dir: Path,
    hqe_id: int,
    sender: Sender,
    owners: tuple[int, ...],
    stop: threading.Event,
    tries: RecordTries | None = None,
    outputs: OutputSender | None = None,
) -> bool:
    """Handles every result file of one ended run; True when none is left. Raises MasterUnavailable
    (an outage: the rest waits for a later pass). With `tries`, a file the master failed on waits its
    own backoff while the others go on, and is quarantined once it has failed too often; without,
    such a failure raises RecordFailed like an outage."""
    try:
        run = RunResults(run_dir, owners)
    except FileNotFoundError:
        # Removed since (old results go after FLEETSHARD_RESULTS_RETENTION_DAYS): nothing left to send.
        return True
    except OSError as exc:
        log.warning("HQE %s: cannot open its run directory %s (%s): its results are not uploaded", hqe_id, run_dir, exc)
        return True
    try:
        left = not _upload_trace(run, hqe_id, sender, tries)
        _report_misplaced(run, hqe_id, sender)
        names = run.names()
        room = MAX_RESULT_FILES_PER_RUN - run.archived() if names else 0
        refused: Verdict | None = None
        for index, name in enumerate(names):
            if stop.is_set():
                return False
            report = ""
            given_up: str | None = None
            if refused is not None:
                verdict = refused
            elif index >= room:
                verdict = Verdict(True, OVER_CAP, unsent=True)
                # One report stands for all the files over the cap: a job may write any number.
                if index == room:
                    report = f"{OVER_CAP}: this one and {len(names) - room - 1} more quarantined unsent"
            else:
                if tries is not None and not tries.due((hqe_id, name)):
                    left = True
                    continue
                try:
                    data = run.read(name)
                except FileNotFoundError:
                    continue
                try:
                    verdict = (
                        Verdict(True, data, unsent=True) if isinstance(data, str) else sender.send(hqe_id, name, data)
                    )
                except RecordFailed as exc:
                    given_up = _failed(tries, (hqe_id, name), exc)
                    if given_up is None:
                        left = True
                        continue
                    verdict = Verdict(True, f"not stored: the master {given_up}", unsent=True)
                if verdict.whole_run:
                    refused = verdict
                report = verdict.reason if verdict.unsent else ""
            # Reported before it moves: a master out of reach leaves it here, to be reported on a later pass.
            if report:
                try:
                    answer = sender.report(hqe_id, name, report)
                except RecordFailed as exc:
                    # A file given up just now is set aside even if the master fails its report too.
                    if given_up is None and _failed(tries, (hqe_id, name), exc) is None:
                        left = True
                        continue
                    log.warning("HQE %s: the master did not record why %s is quarantined: %s", hqe_id, name, exc)
                    answer = None
                if answer is not None:
                    refused = answer
            if tries is not None:
                tries.done((hqe_id, name))
            if verdict.quarantine:
                log.warning("HQE %s: %s quarantined: %s", hqe_id, name, verdict.reason)
                run.quarantine(name, verdict.reason)
            else:
                run.archive(name)
        if names:
            log.info("HQE %s: %d result files handled", hqe_id, len(names))
        if not left and outputs is not None and has_outputs(run.run_fd):
            upload_outputs(run.run_fd, hqe_id, outputs, owners, max_output_bytes())
        return not left
    finally:
        run.close()


# A job that wrote result files beside results/ hears of the first few on its stat, not of every one.
MAX_MISPLACED_REPORTS = 5


def misplaced_reason(name: str) -> str:
    return f"not stored: it is beside results/, not in it (write $FLEETSHARD_RESULTS_DIR/results/{name})"


def _report_misplaced(run: RunResults, hqe_id: int, sender: Sender) -> None:
    """A `.json` file the job left in its run directory rather than in results/ is not a result, and is
    left where it is; but a job author who missed the folder by one level must read why its numbers
    never arrived, so the master hears of it as of a file quarantined unsent (the job's stat lists it).
    Reports are idempotent on the master, so a restart that looks again records nothing new."""
    names = sorted(n for n in os.listdir(run.run_fd) if n.endswith(RESULT_SUFFIX) and n != TRACE)
    for name in names[:MAX_MISPLACED_REPORTS]:
        sender.report(hqe_id, name, misplaced_reason(name))


def _failed(tries: RecordTries | None, key: tuple[int, str], exc: RecordFailed) -> str | None:
    """Notes that the master failed on one record: None while it is to be tried again, else why it
    is given up. Without `tries` (a caller that keeps no count) the failure stops the pass."""
    if tries is None:
        raise exc
    given_up = tries.failed(key, str(exc))
    if given_up is None:
        log.warning("HQE %s: %s not taken (%s); tried again later, the other records go on", key[0], key[1], exc)
    return given_up


def _upload_trace(run: RunResults, hqe_id: int, sender: Sender, tries: RecordTries | None = None) -> bool:
    """The job's own trace.json (beside results/), if it wrote one: sent, then archived or quarantined
    like a result file; False when it waits for a later try. Raises MasterUnavailable: it stays for
    a later pass."""
    key = (hqe_id, TRACE)
    if tries is not None and not tries.due(key):
        return not _exists(run.run_fd, TRACE)
    try:
        data = read_result(run.run_fd, TRACE, run.owners)
    except FileNotFoundError:
        return True
    try:
        verdict = Verdict(True, data) if isinstance(data, str) else sender.send_trace(hqe_id, data)
    except RecordFailed as exc:
        given_up = _failed(tries, key, exc)
        if given_up is None:
            return False
        verdict = Verdict(True, f"not stored: the master {given_up}")
    if tries is not None:
        tries.done(key)
    if verdict.quarantine:
        log.warning("HQE %s: %s quarantined: %s", hqe_id, TRACE, verdict.reason)
        run.quarantine(TRACE, verdict.reason, src=run.run_fd)
    else:
        run.archive(TRACE, src=run.run_fd)
    return True


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def job_owners(config: SchedulerConfig) -> tuple[int, ...]:
    """Whose files a run's results may be: the job user's, or the shard's own (root's, or the shard user's)."""
    own = os.geteuid()
    return (own,) if config.job_user is None else (own, config.job_user.uid)


class ResultsUploader:
    """The shard's upload thread: finds ended runs in the shard's database, sends what their `results/` holds.

    Its own thread, so a slow or absent master delays only uploads, never a heartbeat or the scheduler.
    """

    def __init__(self, client: HeartbeatClient, config: SchedulerConfig) -> None:
        self.client = client
        self.config = config
        self.sender = Sender(client.master_url, client.token, client.timeout[1])
        self.outputs = OutputSender(client.master_url, client.token, client.timeout[1])
        self.owners = job_owners(config)
        self.root = config.results_root.resolve()
        # Runs with files left, by HQE id; and the last look at the database (None: never, look at all).
        self.pending: dict[int, Path] = {}
        self.since: datetime | None = None
        self._seen: set[int] = set()
        self.tries = RecordTries(
            settings.FLEETSHARD_UPLOAD_MAX_TRIES,
            lambda: self.client.interval,
            self._healthy_at,
        )
        # Set when a run ended: its results go up now, not an interval later (a person waits for them).
        self.wake = threading.Event()

    def _healthy_at(self) -> float | None:
        """When the master last answered well: a heartbeat applied, or an upload's answer."""
        times = (self.client.last_ok, getattr(self.sender, "good_at", None))
        return max((t for t in times if t is not None), default=None)

    def find_ended(self) -> None:
        """Adds runs ended since the last look; the first look (a start) takes every run still on disk."""
        now = timezone.now()
        ended = Run.objects.filter(hqe__status__in=HQEStatus.TERMINAL).exclude(results_dir="")
        if self.since is None:
            # Retention keeps a run with files still to send past its retention, up to this horizon.
            cutoff = now - timedelta(days=self.config.upload_horizon_days)
            ended = ended.filter(Q(hqe__finished_on__gte=cutoff) | Q(hqe__finished_on__isnull=True))
        else:
            ended = ended.filter(hqe__finished_on__gte=self.since)
        rows = list(ended.values_list("hqe_id", "results_dir"))
        self.since = now - RESCAN_SLACK
        for hqe_id, results_dir in rows:
            if hqe_id in self._seen:
                continue
            path = Path(results_dir)
            if path.is_relative_to(self.root):
                self.pending[hqe_id] = path
            else:
                log.warning("HQE %s: results dir %s is outside %s: not uploaded", hqe_id, path, self.root)
        self._seen = {hqe_id for hqe_id, _ in rows}

    def upload_pending(self, stop: threading.Event) -> None:
        """Runs oldest first; a file the master fails on waits its own backoff while every other goes
        on (RecordTries). Raises MasterUnavailable when the master is out of reach: nothing can go."""
        for hqe_id in sorted(self.pending):
            if stop.is_set():
                return
            try:
                done = upload_run(
                    self.pending[hqe_id], hqe_id, self.sender, self.owners, stop, self.tries, outputs=self.outputs
                )
            except OSError as exc:
                # Its directory cannot be changed (a full disk, say): the others go on; the next start retries it.
                log.warning("HQE %s: cannot move its result files (%s): left for the next start", hqe_id, exc)
                done = True
            if done:
                del self.pending[hqe_id]

    def _pause(self, stop: threading.Event, delay: float) -> None:
        """Waits `delay`, or less when a run ended (`wake`) or `stop` is set."""
        deadline = time.monotonic() + delay
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self.wake.wait(min(left, 0.5)):
                self.wake.clear()
                return

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: waits for the master to accept this shard instance, then uploads as runs end."""

        def step() -> float:
            close_old_connections()
            self.find_ended()
            self.upload_pending(stop)
            return jittered(self.client.interval)

        run_once_accepted(
            self.client,
            stop,
            step,
            what="results upload",
            logger=log,
            backoff=Backoff(base_s=1.0, cap_s=RETRY_CAP_S),
            wait=lambda delay: self._pause(stop, delay),
        )
