"""`fleetshard job log ID [--hqe N] [--follow]`: a job's output as its shard ships it to the master.

The log is read from a byte offset (GET /api/v1/jobs/{id}/log), so a follower asks only for what is
new, every FOLLOW_POLL_S, and stops once the master says nothing more is coming (the entry ended).
Text goes to stdout as the master serves it (UTF-8, invalid bytes as U+FFFD) and, as all job output
the command line prints, with terminal controls shown rather than acted on; `--json` gives the
slices as the API returns them (one object, or with --follow one per line as they arrive).

A log the master holds only in part once its entry ended (`"complete": false`: the shard has not
shipped the rest yet, after an outage say) is printed, then said so on stderr, and the exit status
is INCOMPLETE (75, "try again later"), never a silent 0. A follower whose entry's shard is offline
stops with a clear line and exit status 1: nothing more can come until the shard is back.
"""

import json
import sys
import time
from typing import Any
from urllib.parse import quote

import click

from cli.action import Run, action
from cli.client import CliError
from cli.errors import INCOMPLETE, TIMED_OUT
from cli.inputs import Id
from cli.output import emit_json, printable, shown_time
from common.constants import HQEStatus

FOLLOW_POLL_S = 0.5
# A follower that lost the master (a restart) tries again for this long before it gives up.
FOLLOW_OUTAGE_S = 120.0
# A follower that got nothing new for this long looks whether the entry's shard is still online (and
# again as often while nothing comes). It gives up when two looks in a row find it offline: one late
# heartbeat of a busy shard is not an outage.
SHARD_CHECK_S = 10.0


@click.command("log")
@click.argument("job_id", metavar="ID", type=Id("job"))
@click.option("--hqe", type=Id("entry"), metavar="N", help="The entry (HQE id); needed if the job has several.")
@click.option("-f", "--follow", is_flag=True, help="Print the output as it comes, until the entry ends.")
@action
def job_log(run: Run, job_id: int, hqe: int | None, follow: bool) -> None:
    """Print a job's log (one entry's), as far as its shard has shipped it."""
    reader = LogReader(run, job_id, hqe)
    if follow:
        reader.follow()
    else:
        reader.whole()


class LogReader:
    def __init__(
        self, run: Run, job_id: int, hqe: int | None, deadline: float | None = None, timeout: float | None = None
    ) -> None:
        self.run = run
        self.deadline = deadline  # monotonic; a follower past it stops with TIMED_OUT
        self.timeout = timeout
        self.job_id = job_id
        self.hqe = hqe
        self.offset = 0
        self.last: dict[str, Any] = {}
        self.quiet_since = time.monotonic()
        self.offline_at_last_look = False

    def fetch(self) -> dict[str, Any]:
        piece: dict[str, Any] = self.run.api.get(f"/jobs/{self.job_id}/log", hqe=self.hqe, offset=self.offset)
        # Later reads name the entry the first one resolved, so the follower stays on it.
        self.hqe = piece["hqe"]
        self.offset = piece["next_offset"]
        self.last = piece
        return piece

    def whole(self) -> None:
        """Everything kept so far, in as many reads as it takes."""
        texts = []
        while True:
            piece = self.fetch()
            texts.append(piece["text"])
            if not self.run.as_json:
                self.write(piece["text"])
            if not piece["text"] or self.offset >= piece["size"]:
                break
        if self.run.as_json:
            emit_json({**self.last, "offset": 0, "text": "".join(texts)})
            return
        self.epilogue(empty=not any(texts))

    def follow(self, quiet: bool = False) -> None:
        """New output every FOLLOW_POLL_S until the master says the entry's log ended. `quiet`: no
        epilogue (`job create --follow` says how the job ended instead)."""
        lost_since: float | None = None
        while True:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise CliError(
                    f"timed out after {self.timeout or 0:g} s; job {self.job_id} entry {self.hqe} has not ended",
                    exit_code=TIMED_OUT,
                )
            try:
                piece = self.fetch()
            except CliError as exc:
                # After a first answer, a master that went away (a restart) is waited for.
                if not self.last or (exc.status is not None and exc.status < 500):
                    raise
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    click.echo(f"lost the master ({exc.message}); still trying", err=True)
                elif now - lost_since > FOLLOW_OUTAGE_S:
                    raise
                time.sleep(FOLLOW_POLL_S * 2)
                continue
            lost_since = None
            if piece["text"]:
                self.quiet_since = time.monotonic()
                self.offline_at_last_look = False
            more = bool(piece["text"]) and self.offset < piece["size"]
            if self.run.as_json:
                if piece["text"] or piece["ended"]:
                    click.echo(json.dumps(piece))
            else:
                self.write(piece["text"])
            if piece["ended"] and not more:
                break
            if not more:
                self.check_shard()
                time.sleep(FOLLOW_POLL_S)
        if not self.run.as_json and not quiet:
            self.epilogue(empty=self.offset == 0)

    def check_shard(self) -> None:
        """Raises once the entry's shard is offline at two looks in a row: its log cannot move on until the
        shard is back, and a follower would otherwise wait for ever."""
        now = time.monotonic()
        if now - self.quiet_since < SHARD_CHECK_S:
            return
        self.quiet_since = now
        job = self.run.api.get(f"/jobs/{self.job_id}/")
        name = job.get("shard")
        shard = self.run.api.get(f"/shards/{quote(str(name), safe='')}/") if name else {}
        offline, self.offline_at_last_look = self.offline_at_last_look, shard.get("status") == "offline"
        if offline and self.offline_at_last_look:
            since = shown_time(shard["last_heartbeat"]) if shard.get("last_heartbeat") else "never"
            raise CliError(
                f"shard {name} is offline (last heartbeat: {since}): the log of job {self.job_id} entry "
                f"{self.hqe} stops here; follow it again once the shard is back"
            )

    @staticmethod
    def write(text: str) -> None:
        if text:
            sys.stdout.write(printable(text))
            sys.stdout.flush()

    def epilogue(self, *, empty: bool) -> None:
        """What is not the log itself goes to stderr: stdout holds only the job's output."""
        piece = self.last
        if piece.get("truncated"):
            click.echo(
                f"[fleetshard] the master keeps the first {piece['size']} bytes of this log "
                "(FLEETSHARD_MAX_LOG_BYTES): the rest is only in the run's job.log on its shard",
                err=True,
            )
            return
        if self.incomplete():
            click.echo(
                f"[fleetshard] incomplete: job {self.job_id} entry {piece.get('hqe')} ended "
                f"({piece.get('hqe_status')}) but its shard has shipped only {piece.get('size', 0)} bytes of its "
                "log so far (after an outage it catches up): try again in a minute",
                err=True,
            )
            raise SystemExit(INCOMPLETE)
        if empty:
            state = "(it ended)" if piece.get("ended") else f"yet ({piece.get('hqe_status')})"
            click.echo(f"job {self.job_id} entry {piece.get('hqe')} has no log {state}", err=True)

    def incomplete(self) -> bool:
        """The entry ran and ended, and the shard has not said its log ended: more of it is owed."""
        piece = self.last
        ran = piece.get("size", 0) > 0 or piece.get("hqe_status") in (HQEStatus.COMPLETED, HQEStatus.FAILED)
        ended = piece.get("hqe_status") in HQEStatus.TERMINAL
        return ran and ended and not piece.get("complete") and not piece.get("truncated")
