"""`fleetshard shard ...`: shards (labs), each owning labels and, through them, hosts and jobs."""

import copy
from typing import Any

import click

from cli.action import Run, action
from cli.client import CliError, segment
from cli.inputs import LABELS_FILE, need, read_list, split
from cli.output import Column, fields, plural, when, with_moves

SHARD_COLUMNS: list[Column] = [
    ("Hostname", "hostname"),
    ("Status", "status"),
    ("Last Heartbeat", when("last_heartbeat")),
    ("Hosts", lambda s: len(s["hosts"])),
    ("Labels", "labels"),
]


@click.group()
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
    run.rows(shards, SHARD_COLUMNS, "shards")


@shard.command("stat")
@click.argument("hostname")
@action
def shard_stat(run: Run, hostname: str) -> None:
    """Show one shard: online or not, its last heartbeat, version, outbox, hosts and jobs by status."""
    obj = run.api.get(f"/shards/{segment(hostname)}/")

    def counts(key: str) -> str:
        return ", ".join(f"{n} {status}" for status, n in obj[key].items()) or "none"

    shown = {
        **obj,
        "last_heartbeat": when("last_heartbeat")(obj) or "never",
        "hosts_by_status": counts("hosts_by_status"),
        "jobs_by_status": counts("jobs_by_status"),
        "outbox": "unknown" if obj["outbox_depth"] is None else f"{obj['outbox_depth']} updates waiting",
        "discovered": f"{obj.get('discovered_count', 0)} hosts (generation {obj.get('discovered_generation', 0)})",
        "refused": "; ".join(f"{r['hostname']}: {r['reason']}" for r in obj.get("discovered_rejected") or []) or "none",
        "pools": "; ".join(
            f"{', '.join(p.get('labels', []))} (at most {p.get('max_hosts')} hosts)" for p in obj.get("pools") or []
        )
        or "none",
    }
    keys = [
        ("Shard", "hostname"),
        ("Status", "status"),
        ("Last heartbeat", "last_heartbeat"),
        ("Client version", "client_version"),
        ("Outbox", "outbox"),
        ("Labels", "labels"),
        ("Hosts", "hosts_by_status"),
        ("Jobs", "jobs_by_status"),
    ]
    if obj.get("discovered_generation"):
        keys += [("Discovered", "discovered"), ("Refused", "refused")]
    if obj.get("pools"):
        keys.append(("Pools", "pools"))
    run.done(obj, lambda: fields(shown, keys))


@shard.command("add-label")
@click.argument("hostname")
@click.option("-l", "--labels", "labels", multiple=True, metavar="LABEL[,LABEL]", help="Labels to add.")
@LABELS_FILE
@action
def shard_add_boards(run: Run, hostname: str, labels: tuple[str, ...], label_file: str | None) -> None:
    """Give labels to a shard; the hosts with them move to it."""
    wanted = need([*split(labels), *read_list(label_file)], "label (-l LABEL[,LABEL] or -B FILE)")
    obj = run.api.post(f"/shards/{segment(hostname)}/add_labels/", {"labels": wanted})
    text = f"Added {plural('label', wanted)} to shard {obj['hostname']} ({_shard_summary(obj)})"
    run.done(obj, with_moves(text, obj["hosts_moved"]))


@shard.command("remove-label")
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


def _alias(command: click.Command, old: str) -> None:
    """An older name of an action, still taken (scripts use it) but left out of --help."""
    alias = copy.copy(command)
    alias.hidden = True
    shard.add_command(alias, old)


_alias(shard_add_boards, "add_boards")
_alias(shard_remove_board, "remove_board")
