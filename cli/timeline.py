"""`fleetshard timeline ...`: what every host did when, as a Chrome trace file, and its totals."""

import os
from pathlib import Path
from typing import Any

import click

from cli.action import Run, action
from cli.client import CliError
from cli.inputs import Id
from cli.output import Column

WHEN = "an ISO time or an age (90m, 24h, 7d)"


def _seconds(key: str) -> Any:
    return lambda r: f"{r[key]:.0f}"


def _wait(key: str) -> Any:
    return lambda r: None if r[key] is None else f"{r[key]:.1f}"


STATS_COLUMNS: list[Column] = [
    ("Key", "key"),
    ("Running s", _seconds("running_s")),
    ("Cleaning s", _seconds("cleaning_s")),
    ("Repairing s", _seconds("repairing_s")),
    ("Idle s", _seconds("idle_s")),
    ("Utilisation", lambda r: f"{100 * r['utilisation']:.1f}%"),
    ("Runs", "runs"),
    ("Wait p50 s", _wait("wait_p50_s")),
    ("Wait p95 s", _wait("wait_p95_s")),
]

SHARDS = click.option("--shard", "shards", multiple=True, metavar="S", help="Only this shard (repeatable).")
LABEL = click.option("--label", metavar="L", help="Only hosts with this label.")
SINCE = click.option("--since", metavar="WHEN", help=f"From {WHEN}.")
UNTIL = click.option("--until", metavar="WHEN", help=f"Until {WHEN}.")


@click.group()
def timeline() -> None:
    """Timelines: every host's runs, cleaning and repairs as a trace, and utilisation totals."""


@timeline.command("export")
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    metavar="FILE",
    help="The trace file: Chrome JSON, gzipped if it ends .gz, Perfetto's protobuf if it ends .pftrace.",
)
@SHARDS
@LABEL
@click.option("--job", "jobs", multiple=True, type=Id("job"), metavar="ID", help="Only this job (repeatable).")
@SINCE
@UNTIL
@action
def timeline_export(
    run: Run,
    output: str,
    shards: tuple[str, ...],
    label: str | None,
    jobs: tuple[int, ...],
    since: str | None,
    until: str | None,
) -> None:
    """Write a Chrome trace (chrome://tracing, ui.perfetto.dev): a process per shard, a thread per host."""
    path = Path(output)
    params = {"shard": list(shards), "label": label, "job": list(jobs), "since": since, "until": until}
    params = {k: v for k, v in params.items() if v not in (None, [])}
    if path.name.endswith(".gz"):
        params["gzip"] = "true"
    elif path.name.endswith(".pftrace"):
        params["pftrace"] = "true"
    partial = path.with_name(path.name + ".part")
    try:
        with open(partial, "wb") as target:
            written = run.api.download("/timeline/export", target, params)
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise CliError(f"cannot write {output}: {exc.strerror or exc}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    run.done({"file": str(path), "bytes": written}, f"wrote {path} ({written} bytes)")


@timeline.command("stats")
@click.option("--by", type=click.Choice(["host", "label", "shard"]), default="host", show_default=True)
@SHARDS
@LABEL
@SINCE
@UNTIL
@action
def timeline_stats(
    run: Run, by: str, shards: tuple[str, ...], label: str | None, since: str | None, until: str | None
) -> None:
    """Seconds running, cleaning, repairing and idle, utilisation, runs and queue waits (default: last 24 h)."""
    rows = run.api.get("/timeline/stats", by=by, shard=list(shards) or None, label=label, since=since, until=until)
    run.rows(rows, STATS_COLUMNS, "hosts busy in that window")
