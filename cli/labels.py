"""`fleetshard label ...`: labels decide which shard owns which hosts and jobs."""

import click

from cli.action import Run, action
from cli.client import segment
from cli.inputs import HOSTS_FILE, LABELS_FILE, need, read_list, split
from cli.output import names, plural, with_moves

LABEL_COLUMNS = [("Id", "id"), ("Name", "name"), ("Shard", "shard")]


@click.group()
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
    run.rows(labels, LABEL_COLUMNS, "labels")


def _label_hosts(run: Run, verb: str, name: str, hosts: tuple[str, ...], host_file: str | None) -> None:
    hostnames = need([*split(hosts), *read_list(host_file)], "host (-m HOST[,HOST] or -M FILE)")
    result = run.api.post(f"/labels/{segment(name)}/{verb}_hosts/", {"hosts": hostnames})
    preposition = "to" if verb == "add" else "from"
    unchanged = result.get("unchanged") or []
    done = [h["hostname"] for h in result["hosts"] if h["hostname"] not in unchanged]
    parts = []
    if done:
        parts.append(f"{'Added' if verb == 'add' else 'Removed'} label {name} {preposition} hosts: {', '.join(done)}")
    if unchanged:
        parts.append(f"{plural('host', unchanged)} already had label {name}: nothing to do")
    run.done(result, with_moves("; ".join(parts), result["hosts_moved"]))


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
