"""`fleetshard job log ID [--hqe N] [--follow]`: a job's output as its shard ships it to the master.

The log is read from a byte offset (GET /api/v1/jobs/{id}/log), so a follower asks only for what is
new, every FOLLOW_POLL_S, and stops once the master says nothing more is coming (the entry ended).
Text goes to stdout as the master serves it (UTF-8, invalid bytes as U+FFFD) and, as all job output
the command line prints, with terminal controls shown rather than acted on; `--json` gives the
slices as the API returns them (one object, or with --follow one per line as they arrive).
"""

import json
import sys
import time
from typing import Any

import click

from cli.action import Run, action
from cli.client import CliError
from cli.inputs import Id
from cli.output import emit_json, printable

FOLLOW_POLL_S = 0.5
# A follower that lost the master (a restart) tries again for this long before it gives up.
FOLLOW_OUTAGE_S = 120.0


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
    def __init__(self, run: Run, job_id: int, hqe: int | None) -> None:
        self.run = run
        self.job_id = job_id
        self.hqe = hqe
        self.offset = 0
        self.last: dict[str, Any] = {}

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

    def follow(self) -> None:
        """New output every FOLLOW_POLL_S until the master says the entry's log ended."""
        lost_since: float | None = None
        while True:
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
            more = bool(piece["text"]) and self.offset < piece["size"]
            if self.run.as_json:
                if piece["text"] or piece["ended"]:
                    click.echo(json.dumps(piece))
            else:
                self.write(piece["text"])
            if piece["ended"] and not more:
                break
            if not more:
                time.sleep(FOLLOW_POLL_S)
        if not self.run.as_json:
            self.epilogue(empty=self.offset == 0)

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
        elif empty:
            state = "(it ended)" if piece.get("ended") else f"yet ({piece.get('hqe_status')})"
            click.echo(f"job {self.job_id} entry {piece.get('hqe')} has no log {state}", err=True)
