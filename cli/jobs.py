"""`fleetshard job ...`: a command to run on one or more hosts of one shard."""

import sys
import time
from collections import Counter
from typing import Any

import click

from cli.action import Run, action
from cli.client import CliError
from cli.errors import TIMED_OUT
from cli.inputs import HOSTS_FILE, Id, checked, key_values, read_list, split
from cli.job_log import job_log
from cli.output import Column, fields, names, table, when
from common.constants import DEFAULT_MAX_RUNTIME_MINS, DEFAULT_TIMEOUT_MINS, JobStatus
from common.syntax import parse_meta_hosts, parse_priority

JOB_ID = Id("job")

# A job in one of these statuses changes no more: `job wait` stops there.
FINISHED = tuple(s for s in JobStatus.ALL if s not in JobStatus.ACTIVE)

JOB_COLUMNS: list[Column] = [
    ("Id", "id"),
    ("Name", "name"),
    ("Owner", "owner"),
    ("Priority", "priority"),
    ("Status", "status"),
    ("Shard", "shard"),
    ("Created", when("created_on")),
]
HQE_COLUMNS: list[Column] = [
    ("Entry", "id"),
    ("Host", "host"),
    ("Meta-host", "meta_host"),
    ("Status", "status"),
    ("Failure", "failure"),
    ("Exit", "exit_code"),
    ("Started", when("started_on")),
    ("Finished", when("finished_on")),
]


@click.group()
def job() -> None:
    """Jobs: a command to run on one or more hosts of one shard."""


job.add_command(job_log)


@job.command("create")
@click.argument("name")
@click.option("-c", "--command", "command", required=True, help="Shell command to run on each host.")
@click.option(
    "-m",
    "--meta-hosts",
    "meta_hosts",
    multiple=True,
    metavar="LABEL[*N][,...]",
    callback=checked(parse_meta_hosts),
    help="Any N different hosts with LABEL.",
)
@click.option("--hosts", "hosts", multiple=True, metavar="HOST[,HOST]", help="These hosts.")
@HOSTS_FILE
@click.option("-d", "--dependencies", "deps", multiple=True, metavar="LABEL[,LABEL]", help="Labels every host needs.")
@click.option(
    "-p",
    "--priority",
    default="default",
    show_default=True,
    callback=checked(parse_priority),
    help="low, default, high, super or a number.",
)
@click.option(
    "--timeout-mins",
    type=click.IntRange(min=1),
    default=DEFAULT_TIMEOUT_MINS,
    show_default=True,
    help="Expire if queued.",
)
@click.option(
    "--max-runtime-mins",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_RUNTIME_MINS,
    show_default=True,
    help="Kill after.",
)
@click.option("-k", "--keyval", "keyvals", multiple=True, metavar="KEY=VALUE", help="A keyval for the job.")
@click.option("--parent", type=JOB_ID, metavar="ID", help="The parent (suite) job.")
@action
def job_create(
    run: Run,
    name: str,
    command: str,
    meta_hosts: tuple[str, ...],
    hosts: tuple[str, ...],
    host_file: str | None,
    deps: tuple[str, ...],
    priority: str,
    timeout_mins: int,
    max_runtime_mins: int,
    keyvals: tuple[str, ...],
    parent: int | None,
) -> None:
    """Create a job; it goes to the one shard that can run all of it."""
    host_list_ = [*split(hosts), *read_list(host_file)]
    if bool(meta_hosts) == bool(host_list_):
        raise click.UsageError("give either -m LABEL[*N] or --hosts HOST (or -M FILE), not both nor neither")
    body = {
        "name": name,
        "command": command,
        "meta_hosts": split(meta_hosts),
        "hosts": host_list_,
        "dependency_labels": split(deps),
        "priority": priority,
        "timeout_mins": timeout_mins,
        "max_runtime_mins": max_runtime_mins,
        "keyvals": key_values(keyvals, "-k"),
        "parent": parent,
    }
    obj = run.api.post("/jobs/", body)
    entries = len(obj["hqes"])
    run.done(
        obj,
        f"Created job {obj['id']} ({obj['name']}) on shard {obj['shard']}: "
        f"{entries} host queue entr{'y' if entries == 1 else 'ies'}, priority {obj['priority']}",
    )


@job.command("list")
@click.option("--status", type=click.Choice(JobStatus.ALL, case_sensitive=False), help="Only jobs in this status.")
@click.option("--owner", metavar="USER", help="Only jobs of this owner.")
@click.option("--shard", metavar="SHARD", help="Only jobs of this shard.")
@click.option("--limit", type=click.IntRange(min=0), default=200, show_default=True, help="Newest N jobs; 0: all.")
@action
def job_list(run: Run, status: str | None, owner: str | None, shard: str | None, limit: int) -> None:
    """List jobs, newest first."""
    status = next((s for s in JobStatus.ALL if status and s.lower() == status.lower()), None)
    jobs = run.api.list("/jobs/", limit=limit or None, status=status, owner=owner, shard=shard)
    if len(jobs) < run.api.total:
        click.echo(f"(the newest {len(jobs)} of {run.api.total} jobs; --limit 0 shows all)", err=True)
    run.rows(jobs, JOB_COLUMNS, "jobs")


@job.command("stat")
@click.argument("job_id", metavar="ID", type=JOB_ID)
@action
def job_stat(run: Run, job_id: int) -> None:
    """Show one job and its host queue entries."""
    obj = run.api.get(f"/jobs/{job_id}/")
    keys = [
        ("Job", "id"),
        ("Name", "name"),
        ("Owner", "owner"),
        ("Priority", "priority"),
        ("Status", "status"),
        ("Shard", "shard"),
        ("Created", "created_on"),
        ("Command", "command"),
        ("Dependencies", "dependency_labels"),
        ("Keyvals", "keyvals"),
        ("Parent", "parent"),
        ("Aborted", "aborted"),
    ]
    run.done(
        obj,
        lambda: (
            fields(obj, keys)
            + "\n\n"
            + table(obj["hqes"], HQE_COLUMNS)
            + quarantined(obj["hqes"])
            + log_tails(obj["hqes"])
        ),
    )


def quarantined(hqes: list[dict[str, Any]]) -> str:
    """Result files set aside (by the master or the shard), and why: the job still completed, their
    numbers did not arrive."""
    lines = [
        f"  entry {hqe['id']} ({hqe.get('host') or '-'}): {item['name']}: {item['reason']}"
        for hqe in hqes
        for item in hqe.get("quarantined") or []
    ]
    return "\n\nQuarantined result files:\n" + "\n".join(lines) if lines else ""


def log_tails(hqes: list[dict[str, Any]], lines: int = 20) -> str:
    """The last lines each entry's run printed: what a person reads first when a job failed."""
    parts = []
    for hqe in hqes:
        tail = (hqe.get("log_tail") or "").rstrip("\n").splitlines()[-lines:]
        if tail:
            parts.append(
                f"\n\nLog of entry {hqe['id']} on {hqe['host'] or '-'} (last {len(tail)} lines):\n" + "\n".join(tail)
            )
    return "".join(parts)


@job.command("abort")
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True, type=JOB_ID)
@action
def job_abort(run: Run, job_ids: tuple[int, ...]) -> None:
    """Abort jobs (yours, or any if you are staff); their shard stops them."""
    jobs = run.api.post("/jobs/abort/", {"ids": list(dict.fromkeys(job_ids))})
    run.done({"jobs": jobs}, f"Aborted jobs: {names(jobs, 'id')} (their shard stops them at its next heartbeat)")


def _progress(jobs: list[dict[str, Any]]) -> str:
    counts = Counter(j["status"] for j in jobs)
    return f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}: " + ", ".join(
        f"{counts[s]} {s}" for s in JobStatus.ALL if counts[s]
    )


@job.command("wait")
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True, type=JOB_ID)
@click.option("--timeout", type=click.FloatRange(min=0), metavar="SECONDS", help="Give up after SECONDS.")
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Seconds between polls."
)
@action
def job_wait(run: Run, job_ids: tuple[int, ...], timeout: float | None, interval: float) -> None:
    """Wait for jobs to finish; exit status 1 unless every one Completed, 124 when --timeout ran out first.

    Ctrl-C stops waiting (exit status 130); the jobs go on."""
    wanted = list(dict.fromkeys(job_ids))
    deadline = None if timeout is None else time.monotonic() + timeout
    live = sys.stderr.isatty()
    try:
        jobs, timed_out = _poll(run, wanted, deadline, interval, live)
    except KeyboardInterrupt:
        if live:
            click.echo("", err=True)  # end the progress line before "interrupted"
        raise
    if live:
        click.echo("", err=True)
    jobs.sort(key=lambda j: wanted.index(j["id"]))
    completed = all(j["status"] == JobStatus.COMPLETED for j in jobs)
    run.done({"jobs": jobs, "completed": completed, "timed_out": timed_out}, lambda: table(jobs, JOB_COLUMNS))
    if timed_out:
        pending = ", ".join(f"{j['id']} ({j['status']})" for j in jobs if j["status"] not in FINISHED)
        raise CliError(f"timed out after {timeout:g} s; not finished: job {pending}", exit_code=TIMED_OUT)
    if not completed:
        failed = ", ".join(f"{j['id']} ({j['status']})" for j in jobs if j["status"] != JobStatus.COMPLETED)
        raise CliError(f"not every job completed: job {failed}")


def _poll(
    run: Run, wanted: list[int], deadline: float | None, interval: float, live: bool
) -> tuple[list[dict[str, Any]], bool]:
    """Polls until every job finished or the deadline passed; shows the counts by status as they change."""
    shown = ""
    while True:
        jobs = run.api.list("/jobs/", ids=",".join(map(str, wanted)))
        missing = sorted(set(wanted) - {j["id"] for j in jobs})
        if missing:
            raise CliError(f"unknown job{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}")
        line = _progress(jobs)
        if line != shown:
            click.echo(f"\r\x1b[K{line}" if live else line, err=True, nl=not live)
            shown = line
        finished = all(j["status"] in FINISHED for j in jobs)
        timed_out = not finished and deadline is not None and time.monotonic() >= deadline
        if finished or timed_out:
            return jobs, timed_out
        time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))
