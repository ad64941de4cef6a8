"""`fleetshard TOPIC ACTION`: the master's REST API from a shell, with the grammar of Autotest's `atest`.

Exit status: 0 on success, 1 on a failure (one line on stderr), 2 on bad usage (click's own).
"""

import functools
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from cli.client import DEFAULT_SERVER, Api, CliError, segment
from cli.output import emit_json, fields, names, plural, printable, table, when, with_moves

TERMINAL_JOB_STATUSES = ("Completed", "Failed", "Aborted", "Expired")
HOST_STATUSES = ("Ready", "Running", "Cleaning", "Repairing", "Repair Failed")
JOB_STATUSES = ("Queued", "Running", *TERMINAL_JOB_STATUSES)


@dataclass
class Run:
    """What every action gets: the API client and whether to print JSON."""

    api: Api
    as_json: bool

    def done(self, data: Any, text: str | Callable[[], str]) -> None:
        if self.as_json:
            emit_json(data)
        else:
            click.echo(printable(text() if callable(text) else text))


def action(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds --json, --server and --token to an action; the action's own --server/--token beat the global ones."""

    @functools.wraps(fn)
    def wrapper(*args: Any, as_json: bool, server: str | None, token: str | None, **kwargs: Any) -> Any:
        root = click.get_current_context().find_root().params
        api = Api(server or root.get("server") or DEFAULT_SERVER, token or root.get("token"))
        return fn(Run(api, as_json), *args, **kwargs)

    wrapper = click.option("--token", metavar="TOKEN", help="API token (overrides FLEETSHARD_TOKEN).")(wrapper)
    wrapper = click.option("--server", metavar="URL", help="Master URL (overrides FLEETSHARD_SERVER).")(wrapper)
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(wrapper)


# Lists given as "a,b" options, repeated options, arguments and -M/-B files (one or more names a line).


def split(values: Iterable[str] | str | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def read_list(path: str | None) -> list[str]:
    if not path:
        return []
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return [item for line in lines for item in line.replace(",", " ").split()]


def need(items: list[str], what: str) -> list[str]:
    if not items:
        raise click.UsageError(f"give at least one {what}")
    return list(dict.fromkeys(items))


def key_values(pairs: Iterable[str], option: str) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint=option)
        result[key] = value
    return result


HOSTS_FILE = click.option("-M", "--mlist", "host_file", metavar="FILE", help="Read hostnames from FILE too.")
LABELS_FILE = click.option("-B", "--blist", "label_file", metavar="FILE", help="Read labels from FILE too.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--server",
    envvar="FLEETSHARD_SERVER",
    default=DEFAULT_SERVER,
    show_default=True,
    metavar="URL",
    help="The master's URL [env FLEETSHARD_SERVER].",
)
@click.option("--token", envvar="FLEETSHARD_TOKEN", metavar="TOKEN", help="Your API token [env FLEETSHARD_TOKEN].")
@click.version_option("0.1.0", prog_name="fleetshard")
def main(server: str, token: str | None) -> None:
    """Drive a fleetshard master: labels, hosts, shards and jobs."""


# Labels

LABEL_COLUMNS = [("Id", "id"), ("Name", "name"), ("Shard", "shard")]
HOST_COLUMNS = [
    ("Hostname", "hostname"),
    ("Status", "status"),
    ("Shard", "shard"),
    ("Locked", "locked"),
    ("Lock Reason", "lock_reason"),
    ("Labels", "labels"),
]


@main.group()
def label() -> None:
    """Labels: they decide which shard owns which hosts and jobs."""


@label.command("create")
@click.argument("names_", metavar="NAME...", nargs=-1)
@LABELS_FILE
@action
def label_create(run: Run, names_: tuple[str, ...], label_file: str | None) -> None:
    """Create labels."""
    labels = run.api.post("/labels/", {"names": need([*names_, *read_list(label_file)], "label NAME")})
    run.done({"labels": labels}, f"Created labels: {names(labels, 'name')}")


@label.command("delete")
@click.argument("names_", metavar="NAME...", nargs=-1)
@LABELS_FILE
@action
def label_delete(run: Run, names_: tuple[str, ...], label_file: str | None) -> None:
    """Delete labels (refused while an active job uses one)."""
    wanted = need([*names_, *read_list(label_file)], "label NAME")
    result = run.api.post("/labels/delete/", {"names": wanted})
    run.done(result, with_moves(f"Deleted {plural('label', result['deleted'])}", result["hosts_moved"]))


@label.command("list")
@click.option("--shard", metavar="SHARD", help="Only the labels of this shard.")
@action
def label_list(run: Run, shard: str | None) -> None:
    """List labels."""
    labels = run.api.list("/labels/", shard=shard)
    run.done(labels, lambda: table(labels, LABEL_COLUMNS))


def _label_hosts(run: Run, verb: str, name: str, hosts: tuple[str, ...], host_file: str | None) -> None:
    hostnames = need([*split(hosts), *read_list(host_file)], "host (-m HOST[,HOST] or -M FILE)")
    result = run.api.post(f"/labels/{segment(name)}/{verb}_hosts/", {"hosts": hostnames})
    preposition = "to" if verb == "add" else "from"
    listed = names(result["hosts"], "hostname")
    text = f"{'Added' if verb == 'add' else 'Removed'} label {name} {preposition} hosts: {listed}"
    run.done(result, with_moves(text, result["hosts_moved"]))


@label.command("add")
@click.argument("name")
@click.option("-m", "--machine", "hosts", multiple=True, metavar="HOST[,HOST]", help="Hosts to label.")
@HOSTS_FILE
@action
def label_add(run: Run, name: str, hosts: tuple[str, ...], host_file: str | None) -> None:
    """Add label NAME to hosts (their shard follows the label)."""
    _label_hosts(run, "add", name, hosts, host_file)


@label.command("remove")
@click.argument("name")
@click.option("-m", "--machine", "hosts", multiple=True, metavar="HOST[,HOST]", help="Hosts to unlabel.")
@HOSTS_FILE
@action
def label_remove(run: Run, name: str, hosts: tuple[str, ...], host_file: str | None) -> None:
    """Remove label NAME from hosts."""
    _label_hosts(run, "remove", name, hosts, host_file)


# Hosts


@main.group()
def host() -> None:
    """Hosts: the lab devices that run jobs."""


@host.command("create")
@click.argument("hostnames", metavar="HOSTNAME...", nargs=-1)
@click.option("-b", "--labels", "labels", multiple=True, metavar="LABEL[,LABEL]", help="Labels of the new hosts.")
@LABELS_FILE
@click.option("-i", "--attribute", "attributes", multiple=True, metavar="ATTR=VALUE", help="A host attribute.")
@click.option("--lock", is_flag=True, help="Create the hosts locked.")
@click.option("-r", "--lock-reason", "lock_reason", default="", metavar="REASON", help="Why they are locked.")
@HOSTS_FILE
@action
def host_create(
    run: Run,
    hostnames: tuple[str, ...],
    labels: tuple[str, ...],
    label_file: str | None,
    attributes: tuple[str, ...],
    lock: bool,
    lock_reason: str,
    host_file: str | None,
) -> None:
    """Create hosts; a host belongs to the shard owning one of its labels."""
    body = {
        "hostnames": need([*hostnames, *read_list(host_file)], "HOSTNAME"),
        "labels": [*split(labels), *read_list(label_file)],
        "attributes": key_values(attributes, "-i"),
        "locked": lock,
        "lock_reason": lock_reason,
    }
    hosts = run.api.post("/hosts/", body)
    summary = ", ".join(f"{h['hostname']} (shard {h['shard'] or 'none'})" for h in hosts)
    run.done({"hosts": hosts}, f"Created hosts: {summary}")


@host.command("list")
@click.option("--label", metavar="LABEL", help="Only hosts with this label.")
@click.option("--shard", metavar="SHARD", help="Only hosts of this shard.")
@click.option("--status", type=click.Choice(HOST_STATUSES, case_sensitive=False), help="Only hosts in this status.")
@action
def host_list(run: Run, label: str | None, shard: str | None, status: str | None) -> None:
    """List hosts."""
    status = next((s for s in HOST_STATUSES if status and s.lower() == status.lower()), None)
    hosts = run.api.list("/hosts/", label=label, shard=shard, status=status)
    run.done(hosts, lambda: table(hosts, HOST_COLUMNS))


@host.command("stat")
@click.argument("hostname")
@action
def host_stat(run: Run, hostname: str) -> None:
    """Show one host."""
    obj = run.api.get(f"/hosts/{segment(hostname)}/")
    keys = [
        ("Host", "hostname"),
        ("Id", "id"),
        ("Status", "status"),
        ("Shard", "shard"),
        ("Locked", "locked"),
        ("Lock reason", "lock_reason"),
        ("Labels", "labels"),
        ("Attributes", "attributes"),
    ]
    run.done(obj, fields(obj, keys))


@host.command("mod")
@click.argument("hostnames", metavar="HOSTNAME...", nargs=-1)
@click.option("--lock", is_flag=True, help="Lock the hosts: no new work starts on them.")
@click.option("--unlock", is_flag=True, help="Unlock the hosts.")
@click.option("-r", "--lock-reason", "lock_reason", default="", metavar="REASON", help="Why they are locked.")
@HOSTS_FILE
@action
def host_mod(
    run: Run, hostnames: tuple[str, ...], lock: bool, unlock: bool, lock_reason: str, host_file: str | None
) -> None:
    """Lock or unlock hosts."""
    if lock == unlock:
        raise click.UsageError("give exactly one of --lock and --unlock")
    if unlock and lock_reason:
        raise click.UsageError("-r/--lock-reason goes with --lock")
    wanted = need([*hostnames, *read_list(host_file)], "HOSTNAME")
    if lock:
        hosts = run.api.post("/hosts/lock/", {"hostnames": wanted, "reason": lock_reason})
        why = f" ({lock_reason})" if lock_reason else ""
        run.done({"hosts": hosts}, f"Locked hosts{why}: {names(hosts, 'hostname')}")
    else:
        hosts = run.api.post("/hosts/unlock/", {"hostnames": wanted})
        run.done({"hosts": hosts}, f"Unlocked hosts: {names(hosts, 'hostname')}")


@host.command("delete")
@click.argument("hostnames", metavar="HOSTNAME...", nargs=-1)
@HOSTS_FILE
@action
def host_delete(run: Run, hostnames: tuple[str, ...], host_file: str | None) -> None:
    """Delete hosts (refused while one runs a job)."""
    wanted = need([*hostnames, *read_list(host_file)], "HOSTNAME")
    run.api.post("/hosts/delete/", {"hostnames": wanted})
    run.done({"deleted": wanted}, f"Deleted hosts: {', '.join(wanted)}")


# Shards

SHARD_COLUMNS = [
    ("Hostname", "hostname"),
    ("Status", "status"),
    ("Last Heartbeat", when("last_heartbeat")),
    ("Hosts", lambda s: len(s["hosts"])),
    ("Labels", "labels"),
]


@main.group()
def shard() -> None:
    """Shards (labs), each owning labels and, through them, hosts and jobs."""


def _shard_summary(obj: dict[str, Any]) -> str:
    return f"labels: {', '.join(obj['labels']) or 'none'}; hosts: {', '.join(obj['hosts']) or 'none'}"


@shard.command("create")
@click.argument("hostname")
@click.option("-l", "--labels", "labels", multiple=True, metavar="LABEL[,LABEL]", help="Labels the shard owns.")
@LABELS_FILE
@action
def shard_create(run: Run, hostname: str, labels: tuple[str, ...], label_file: str | None) -> None:
    """Create a shard and print its heartbeat token, once."""
    obj = run.api.post("/shards/", {"hostname": hostname, "labels": [*split(labels), *read_list(label_file)]})
    run.done(
        obj,
        lambda: (
            f"Created shard {obj['hostname']} ({_shard_summary(obj)}).\n"
            "Its heartbeat token (FLEETSHARD_SHARD_TOKEN), shown only this once:\n"
            f"{obj['token']}"
        ),
    )


@shard.command("list")
@action
def shard_list(run: Run) -> None:
    """List shards, with their status (online when they heartbeat)."""
    shards = run.api.list("/shards/")
    run.done(shards, lambda: table(shards, SHARD_COLUMNS))


@shard.command("add_boards")
@click.argument("hostname")
@click.option("-l", "--labels", "labels", multiple=True, metavar="LABEL[,LABEL]", help="Labels to add.")
@LABELS_FILE
@action
def shard_add_boards(run: Run, hostname: str, labels: tuple[str, ...], label_file: str | None) -> None:
    """Give labels to a shard; the hosts with them move to it."""
    wanted = need([*split(labels), *read_list(label_file)], "label (-l LABEL[,LABEL] or -B FILE)")
    obj = run.api.post(f"/shards/{segment(hostname)}/add_labels/", {"labels": wanted})
    text = f"Added labels {', '.join(wanted)} to shard {obj['hostname']} ({_shard_summary(obj)})"
    run.done(obj, with_moves(text, obj["hosts_moved"]))


@shard.command("remove_board")
@click.argument("hostname")
@click.option("-l", "--label", "label_", required=True, metavar="LABEL", help="The label to remove.")
@action
def shard_remove_board(run: Run, hostname: str, label_: str) -> None:
    """Take a label from a shard; its hosts are unassigned, its running jobs finish."""
    obj = run.api.post(f"/shards/{segment(hostname)}/remove_label/", {"label": label_})
    text = f"Removed label {label_} from shard {obj['hostname']} ({_shard_summary(obj)})"
    run.done(obj, with_moves(text, obj["hosts_moved"]))


@shard.command("delete")
@click.argument("hostnames", metavar="HOSTNAME...", nargs=-1, required=True)
@click.option("--no-confirmation", is_flag=True, help="Do not ask; needed without a terminal.")
@action
def shard_delete(run: Run, hostnames: tuple[str, ...], no_confirmation: bool) -> None:
    """Delete shards: their hosts are unassigned and their active jobs aborted."""
    wanted = list(dict.fromkeys(hostnames))
    if not no_confirmation:
        question = f"Delete shards {', '.join(wanted)}? Their hosts are unassigned and their active jobs aborted."
        try:
            confirmed = click.confirm(question, default=False, err=True)
        except click.Abort:
            click.echo("", err=True)  # end the unanswered prompt's line
            raise CliError("no confirmation on standard input: pass --no-confirmation to delete anyway") from None
        if not confirmed:
            raise CliError("nothing deleted")
    result = run.api.post("/shards/delete/", {"hostnames": wanted})
    text = with_moves(f"Deleted shards: {', '.join(wanted)}", result["hosts_moved"])
    if result["jobs_aborted"]:
        text += f"; aborted {plural('job', result['jobs_aborted'])}"
    run.done(result, text)


# Jobs

JOB_COLUMNS = [
    ("Id", "id"),
    ("Name", "name"),
    ("Owner", "owner"),
    ("Priority", "priority"),
    ("Status", "status"),
    ("Shard", "shard"),
    ("Created", when("created_on")),
]
HQE_COLUMNS = [
    ("Entry", "id"),
    ("Host", "host"),
    ("Meta-host", "meta_host"),
    ("Status", "status"),
    ("Failure", "failure"),
    ("Exit", "exit_code"),
    ("Started", when("started_on")),
    ("Finished", when("finished_on")),
]


@main.group()
def job() -> None:
    """Jobs: a command to run on one or more hosts of one shard."""


@job.command("create")
@click.argument("name")
@click.option("-c", "--command", "command", required=True, help="Shell command to run on each host.")
@click.option(
    "-m",
    "--meta-hosts",
    "meta_hosts",
    multiple=True,
    metavar="LABEL[*N][,...]",
    help="Any N different hosts with LABEL.",
)
@click.option("--hosts", "hosts", multiple=True, metavar="HOST[,HOST]", help="These hosts.")
@HOSTS_FILE
@click.option("-d", "--dependencies", "deps", multiple=True, metavar="LABEL[,LABEL]", help="Labels every host needs.")
@click.option("-p", "--priority", default="default", show_default=True, help="low, default, high, super or a number.")
@click.option("--timeout-mins", type=click.IntRange(min=1), default=1440, show_default=True, help="Expire if queued.")
@click.option("--max-runtime-mins", type=click.IntRange(min=1), default=60, show_default=True, help="Kill after.")
@click.option("-k", "--keyval", "keyvals", multiple=True, metavar="KEY=VALUE", help="A keyval for the job.")
@click.option("--parent", type=click.IntRange(min=1), metavar="ID", help="The parent (suite) job.")
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
@click.option("--status", type=click.Choice(JOB_STATUSES, case_sensitive=False), help="Only jobs in this status.")
@click.option("--owner", metavar="USER", help="Only jobs of this owner.")
@click.option("--shard", metavar="SHARD", help="Only jobs of this shard.")
@click.option("--limit", type=click.IntRange(min=0), default=200, show_default=True, help="Newest N jobs; 0: all.")
@action
def job_list(run: Run, status: str | None, owner: str | None, shard: str | None, limit: int) -> None:
    """List jobs, newest first."""
    status = next((s for s in JOB_STATUSES if status and s.lower() == status.lower()), None)
    jobs = run.api.list("/jobs/", limit=limit or None, status=status, owner=owner, shard=shard)
    if len(jobs) < run.api.total:
        click.echo(f"(the newest {len(jobs)} of {run.api.total} jobs; --limit 0 shows all)", err=True)
    run.done(jobs, lambda: table(jobs, JOB_COLUMNS))


@job.command("stat")
@click.argument("job_id", metavar="ID", type=click.IntRange(min=1))
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
    run.done(obj, lambda: fields(obj, keys) + "\n\n" + table(obj["hqes"], HQE_COLUMNS) + log_tails(obj["hqes"]))


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
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True, type=click.IntRange(min=1))
@action
def job_abort(run: Run, job_ids: tuple[int, ...]) -> None:
    """Abort jobs (yours, or any if you are staff); their shard stops them."""
    jobs = run.api.post("/jobs/abort/", {"ids": list(dict.fromkeys(job_ids))})
    run.done({"jobs": jobs}, f"Aborted jobs: {names(jobs, 'id')} (their shard stops them at its next heartbeat)")


def _progress(jobs: list[dict[str, Any]]) -> str:
    counts = Counter(j["status"] for j in jobs)
    return f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}: " + ", ".join(
        f"{counts[s]} {s}" for s in JOB_STATUSES if counts[s]
    )


@job.command("wait")
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True, type=click.IntRange(min=1))
@click.option("--timeout", type=click.FloatRange(min=0), metavar="SECONDS", help="Give up after SECONDS.")
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Seconds between polls."
)
@action
def job_wait(run: Run, job_ids: tuple[int, ...], timeout: float | None, interval: float) -> None:
    """Wait for jobs to finish; exit status 1 unless every one Completed."""
    wanted = list(dict.fromkeys(job_ids))
    deadline = None if timeout is None else time.monotonic() + timeout
    live = sys.stderr.isatty()
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
        finished = all(j["status"] in TERMINAL_JOB_STATUSES for j in jobs)
        timed_out = not finished and deadline is not None and time.monotonic() >= deadline
        if finished or timed_out:
            break
        time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))
    if live:
        click.echo("", err=True)
    jobs.sort(key=lambda j: wanted.index(j["id"]))
    completed = all(j["status"] == "Completed" for j in jobs)
    run.done({"jobs": jobs, "completed": completed, "timed_out": timed_out}, lambda: table(jobs, JOB_COLUMNS))
    if timed_out:
        pending = ", ".join(f"{j['id']} ({j['status']})" for j in jobs if j["status"] not in TERMINAL_JOB_STATUSES)
        raise CliError(f"timed out after {timeout:g} s; not finished: job {pending}")
    if not completed:
        failed = ", ".join(f"{j['id']} ({j['status']})" for j in jobs if j["status"] != "Completed")
        raise CliError(f"not every job completed: job {failed}")


if __name__ == "__main__":
    main(prog_name="fleetshard")
