"""`fleetshard job ...`: a command to run on one or more hosts of one shard."""

import os
import sys
import time
from collections import Counter
from typing import Any

import click

from cli.action import Run, action
from cli.blobs import prepare_inputs
from cli.client import CliError
from cli.errors import TIMED_OUT
from cli.inputs import HOSTS_FILE, Id, Number, checked, key_values, read_list, split
from cli.job_artifacts import job_artifacts
from cli.job_log import LogReader, job_log
from cli.output import Column, fields, one_line, plural, table, when
from common.ab import make_plan, parse_repeat, variant_input_name
from common.constants import DEFAULT_MAX_RUNTIME_MINS, DEFAULT_TIMEOUT_MINS, JobStatus
from common.errors import FleetshardError
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
job.add_command(job_artifacts)


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
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="PATH[:NAME]",
    help="A file or directory the runs read at $FLEETSHARD_INPUT_DIR/NAME (uploaded if the master lacks it).",
)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    metavar="NAME[=PATH]",
    help="An A/B job: give two, the baseline first; each run gets FLEETSHARD_VARIANT=NAME.",
)
@click.option(
    "--repeat",
    metavar="N|auto[:MAX]",
    callback=checked(parse_repeat),
    help="With --variant: runs of each variant, alternating (default 1); auto: until every entry is decided.",
)
@click.option("--revision", metavar="REV", help="What the job measures; its results carry it.")
@click.option("--wait", is_flag=True, help="Then wait for the job's end: exit 0 Completed, 1 not, 124 --timeout.")
@click.option("--follow", is_flag=True, help="Then print its log as it comes (entry by entry); exit as --wait.")
@click.option("--timeout", type=Number(min=0), metavar="SECONDS", help="With --wait/--follow: give up after.")
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
    variants: tuple[str, ...],
    repeat: str | None,
    revision: str | None,
    inputs: tuple[str, ...],
    wait: bool,
    follow: bool,
    timeout: float | None,
) -> None:
    """Create a job; it goes to the one shard that can run all of it.

    With --wait or --follow the command lasts as long as the job and exits with its outcome, as `job
    wait` does: 0 Completed, 1 Failed or Aborted (or Expired), 124 when --timeout ran out first."""
    if timeout is not None and not (wait or follow):
        raise click.UsageError("--timeout needs --wait or --follow")
    host_list_ = [*split(hosts), *read_list(host_file)]
    if bool(meta_hosts) == bool(host_list_):
        raise click.UsageError("give either -m LABEL[*N] or --hosts HOST (or -M FILE), not both nor neither")
    ab = ab_fields(variants, repeat)
    # A variant's PATH travels as the job's input `variant+NAME` (docs/design.md, "A/B runs").
    inputs += tuple(
        f"{path}:{variant_input_name(name)}" for name, _, path in (v.partition("=") for v in variants) if path
    )
    input_list = prepare_inputs(run.api, inputs) if inputs else []
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
        **ab,
        **({"revision": revision} if revision is not None else {}),
        **({"inputs": input_list} if input_list else {}),
    }
    obj = run.api.post("/jobs/", body)
    said = created_line(obj)
    submitted(run, obj, said, wait, follow, timeout)


def submitted(run: Run, obj: dict[str, Any], said: str, wait: bool, follow: bool, timeout: float | None) -> None:
    """Says a job was created; with --wait or --follow, waits for it (streaming its log) and exits with
    its outcome."""
    if not (wait or follow):
        run.done(obj, said)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    # Scripts get one JSON document, the outcome (so --follow waits as --wait does); people read what
    # was created at once.
    follow = follow and not run.as_json
    if not run.as_json:
        click.echo(said, err=follow)
    if follow:
        follow_entries(run, obj, deadline, timeout)
    await_jobs(run, [obj["id"]], deadline, timeout, interval=1.0, table_out=not follow)


def created_line(obj: dict[str, Any]) -> str:
    entries = len(obj["hqes"])
    again = f", a rerun of job {obj['rerun_of']}," if obj.get("rerun_of") else ""
    return (
        f"Created job {obj['id']} ({obj['name']}){again} on shard {obj['shard']}: "
        f"{entries} host queue entr{'y' if entries == 1 else 'ies'}, priority {obj['priority']}"
    )


def ab_fields(variants: tuple[str, ...], repeat: str | None) -> dict[str, Any]:
    """`--variant NAME[=PATH]` twice and `--repeat` as the API's `variants` and `repeat`, refused as bad
    usage before anything is sent when the master would refuse them too."""
    if not variants:
        if repeat is not None:
            raise click.UsageError("--repeat needs --variant: only an A/B job repeats its runs")
        return {}
    names = []
    for text in variants:
        name, _, path = text.partition("=")
        # os.path.exists, not Path.exists: a path too long or unreadable is "not there", not a traceback.
        if path and not os.path.exists(path):
            shown = text if len(text) <= 200 else f"{text[:200]}..."
            raise click.UsageError(f"--variant {shown}: {shown.partition('=')[2]} does not exist")
        names.append(name)
    count, auto = parse_repeat(repeat) if repeat is not None else (1, False)
    try:
        make_plan(names, count, auto=auto)
    except FleetshardError as exc:
        raise click.UsageError(exc.message) from None
    return {"variants": names, **({"repeat": repeat} if repeat is not None else {})}


@job.command("rerun")
@click.argument("job_id", metavar="ID", type=JOB_ID)
@click.option("--wait", is_flag=True, help="Then wait for the new job's end: exit 0 Completed, 1 not, 124 --timeout.")
@click.option("--follow", is_flag=True, help="Then print its log as it comes; exit as --wait.")
@click.option("--timeout", type=Number(min=0), metavar="SECONDS", help="With --wait/--follow: give up after.")
@action
def job_rerun(run: Run, job_id: int, wait: bool, follow: bool, timeout: float | None) -> None:
    """Run a job again: a new job with the same spec (command, hosts or meta-hosts, priority...), yours."""
    if timeout is not None and not (wait or follow):
        raise click.UsageError("--timeout needs --wait or --follow")
    obj = run.api.post(f"/jobs/{job_id}/rerun/")
    submitted(run, obj, created_line(obj), wait, follow, timeout)


def follow_entries(run: Run, job: dict[str, Any], deadline: float | None, timeout: float | None) -> None:
    """Each entry's log in turn, as it comes: the first from its start, the next ones from what they
    have by then (they ran side by side) to their end."""
    several = len(job["hqes"]) > 1
    for hqe in job["hqes"]:
        if several:
            click.echo(f"[fleetshard] job {job['id']} entry {hqe['id']}:", err=True)
        reader = LogReader(Run(run.api, False), job["id"], hqe["id"], deadline=deadline, timeout=timeout)
        reader.follow(quiet=True)


@job.command("list")
@click.option("--status", type=click.Choice(JobStatus.ALL, case_sensitive=False), help="Only jobs in this status.")
@click.option("--owner", metavar="USER", help="Only jobs of this owner.")
@click.option("--shard", metavar="SHARD", help="Only jobs of this shard.")
@click.option("--name", metavar="PATTERN", help="Only jobs whose name matches: * any characters, ? one.")
@click.option("--since", metavar="WHEN", help="Only jobs created since an ISO time or within an age (90m, 24h, 7d).")
@click.option("--limit", type=click.IntRange(min=0), default=200, show_default=True, help="Newest N jobs; 0: all.")
@action
def job_list(
    run: Run,
    status: str | None,
    owner: str | None,
    shard: str | None,
    name: str | None,
    since: str | None,
    limit: int,
) -> None:
    """List jobs, newest first."""
    status = next((s for s in JobStatus.ALL if status and s.lower() == status.lower()), None)
    jobs = run.api.list(
        "/jobs/", limit=limit or None, status=status, owner=owner, shard=shard, name_like=name, since=since
    )
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
        ("Rerun of", "rerun_of"),
        ("Aborted", "aborted"),
        ("Inputs", "inputs"),
    ]
    shown = {**obj, "inputs": input_list_text(obj.get("inputs") or [])}
    run.done(
        obj,
        lambda: (
            fields(shown, keys)
            + "\n\n"
            + table(obj["hqes"], HQE_COLUMNS)
            + results_of(obj["hqes"], run.api.server)
            + quarantined(obj["hqes"])
            + log_tails(obj["hqes"])
        ),
    )


def input_list_text(inputs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{i['name']} ({i['kind']}, {i['size']} bytes, sha256 {i['digest'][:12]})" for i in inputs)


def results_of(hqes: list[dict[str, Any]], server: str) -> str:
    """What each entry's result files stored, by test, with the admin page charting the test."""
    lines = []
    for hqe in hqes:
        for test in hqe.get("result_tests") or []:
            runs, entries = test["runs"], test["entries"]
            lines.append(
                f"  entry {hqe['id']} ({hqe.get('host') or '-'}): {test['test']}: "
                f"{runs} run{'s' if runs != 1 else ''}, "
                f"{entries} entr{'y' if entries == 1 else 'ies'}; chart: {server}{test['chart']}"
            )
    return "\n\nResults:\n" + "\n".join(lines) if lines else ""


def quarantined(hqes: list[dict[str, Any]]) -> str:
    """Result files set aside (by the master or the shard), and why: the job still completed, their
    numbers did not arrive."""
    lines = [
        f"  entry {hqe['id']} ({hqe.get('host') or '-'}): {one_line(item['name'])}: "
        + one_line(item["reason"].removeprefix(f"{item['name']}: "))
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
    wanted = list(dict.fromkeys(job_ids))
    before = {j["id"]: j["aborted"] for j in run.api.list("/jobs/", ids=",".join(map(str, wanted)))}
    jobs = run.api.post("/jobs/abort/", {"ids": wanted})
    fresh = [j["id"] for j in jobs if not before.get(j["id"])]
    again = [j["id"] for j in jobs if before.get(j["id"])]
    parts = [f"Aborted {plural('job', fresh)}"] if fresh else []
    if again:
        parts.append(f"{plural('job', again)} {'was' if len(again) == 1 else 'were'} already aborted")
    run.done({"jobs": jobs}, "; ".join(parts) + " (their shard stops them at its next heartbeat)")


def _progress(jobs: list[dict[str, Any]]) -> str:
    counts = Counter(j["status"] for j in jobs)
    return f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}: " + ", ".join(
        f"{counts[s]} {s}" for s in JobStatus.ALL if counts[s]
    )


@job.command("wait")
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True, type=JOB_ID)
@click.option("--timeout", type=Number(min=0), metavar="SECONDS", help="Give up after SECONDS.")
@click.option("--interval", type=Number(min=0.1), default=2.0, show_default=True, help="Seconds between polls.")
@action
def job_wait(run: Run, job_ids: tuple[int, ...], timeout: float | None, interval: float) -> None:
    """Wait for jobs to finish; exit status 1 unless every one Completed, 124 when --timeout ran out first.

    Ctrl-C stops waiting (exit status 130); the jobs go on."""
    deadline = None if timeout is None else time.monotonic() + timeout
    await_jobs(run, list(dict.fromkeys(job_ids)), deadline, timeout, interval)


def await_jobs(
    run: Run, wanted: list[int], deadline: float | None, timeout: float | None, interval: float, table_out: bool = True
) -> None:
    """Polls until the jobs ended or the deadline passed, then says how they ended; raises (exit 1 or
    124) unless every one Completed. `table_out` False: stdout holds a log, so only stderr's progress
    line says it."""
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
    if table_out or run.as_json:
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
