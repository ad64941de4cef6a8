"""`fleetshard host ...`: the lab devices that run jobs."""

from typing import Any

import click

from cli.action import Run, action
from cli.client import segment
from cli.inputs import HOSTS_FILE, LABELS_FILE, key_values, need, read_list, split
from cli.output import Column, fields, names, table, when
from common.constants import HostOrigin, HostStatus

RUN_COLUMNS: list[Column] = [
    ("Job", "job"),
    ("Name", "job_name"),
    ("Entry", "id"),
    ("Status", "status"),
    ("Failure", "failure"),
    ("Exit", "exit_code"),
    ("Started", when("started_on")),
    ("Finished", when("finished_on")),
]

HOST_COLUMNS = [
    ("Hostname", "hostname"),
    ("Status", "status"),
    ("Shard", "shard"),
    ("Locked", "locked"),
    ("Lock Reason", "lock_reason"),
    ("Labels", "labels"),
]


@click.group()
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
@click.option("--status", type=click.Choice(HostStatus.ALL, case_sensitive=False), help="Only hosts in this status.")
@click.option("--origin", type=click.Choice(HostOrigin.ALL), help="Only hosts declared by people, or discovered.")
@action
def host_list(run: Run, label: str | None, shard: str | None, status: str | None, origin: str | None) -> None:
    """List hosts."""
    status = next((s for s in HostStatus.ALL if status and s.lower() == status.lower()), None)
    hosts = run.api.list("/hosts/", label=label, shard=shard, status=status, origin=origin)
    run.rows(hosts, HOST_COLUMNS, "hosts")


@host.command("stat")
@click.argument("hostname")
@action
def host_stat(run: Run, hostname: str) -> None:
    """Show one host, the job it runs now and its last runs with their outcomes."""
    obj = run.api.get(f"/hosts/{segment(hostname)}/")
    now = "; ".join(f"job {e['job']} ({e['job_name']}), entry {e['id']}, {e['status']}" for e in obj["running"])
    obj_shown = {**obj, "now": now or "nothing"}
    keys = [
        ("Host", "hostname"),
        ("Id", "id"),
        ("Status", "status"),
        ("Shard", "shard"),
        ("Locked", "locked"),
        ("Lock reason", "lock_reason"),
        ("Labels", "labels"),
        ("Attributes", "attributes"),
        ("Running", "now"),
    ]
    if obj.get("discovered_by"):
        keys[-1:-1] = [("Origin", "origin"), ("Discovered by", "discovered_by"), ("Last seen", "last_seen")]
    runs = obj.get("recent_runs") or []
    last = f"\n\nLast {len(runs)} runs:\n" + table(runs, RUN_COLUMNS) if runs else "\n\nNo runs yet."
    run.done(obj, lambda: fields(obj_shown, keys) + last)


@host.command("mod")
@click.argument("hostnames", metavar="HOSTNAME...", nargs=-1)
@click.option("--lock", is_flag=True, help="Lock the hosts: no new work starts on them.")
@click.option("--unlock", is_flag=True, help="Unlock the hosts.")
@click.option("-r", "--lock-reason", "lock_reason", default="", metavar="REASON", help="Why they are locked.")
@click.option(
    "-i", "--attribute", "attributes", multiple=True, metavar="KEY=VALUE", help="Set an attribute (repeatable)."
)
@click.option("--remove-attribute", "removed", multiple=True, metavar="KEY", help="Remove an attribute (repeatable).")
@HOSTS_FILE
@action
def host_mod(
    run: Run,
    hostnames: tuple[str, ...],
    lock: bool,
    unlock: bool,
    lock_reason: str,
    attributes: tuple[str, ...],
    removed: tuple[str, ...],
    host_file: str | None,
) -> None:
    """Lock or unlock hosts, or set and remove their attributes (jobs see FLEETSHARD_HOST_ATTR_<KEY>)."""
    if lock and unlock:
        raise click.UsageError("give one of --lock and --unlock, not both")
    if not (lock or unlock or attributes or removed):
        raise click.UsageError("give --lock, --unlock, --attribute KEY=VALUE or --remove-attribute KEY")
    if unlock and lock_reason or lock_reason and not lock:
        raise click.UsageError("-r/--lock-reason goes with --lock")
    wanted = need([*hostnames, *read_list(host_file)], "HOSTNAME")
    said = []
    hosts: list[dict[str, Any]] = []
    if attributes or removed:
        changes = key_values(attributes, "-i")
        hosts = run.api.post("/hosts/attributes/", {"hostnames": wanted, "set": changes, "remove": list(removed)})
        parts = [", ".join(f"{k}={v}" for k, v in changes.items())] if changes else []
        parts += [f"removed {', '.join(removed)}"] if removed else []
        said.append(f"Attributes of hosts {names(hosts, 'hostname')}: {'; '.join(parts)}")
    if lock:
        hosts = run.api.post("/hosts/lock/", {"hostnames": wanted, "reason": lock_reason})
        why = f" ({lock_reason})" if lock_reason else ""
        said.append(f"Locked hosts{why}: {names(hosts, 'hostname')}")
    elif unlock:
        hosts = run.api.post("/hosts/unlock/", {"hostnames": wanted})
        said.append(f"Unlocked hosts: {names(hosts, 'hostname')}")
    run.done({"hosts": hosts}, "\n".join(said))


@host.command("delete")
@click.argument("hostnames", metavar="HOSTNAME...", nargs=-1)
@HOSTS_FILE
@action
def host_delete(run: Run, hostnames: tuple[str, ...], host_file: str | None) -> None:
    """Delete hosts (refused while one runs a job)."""
    wanted = need([*hostnames, *read_list(host_file)], "HOSTNAME")
    run.api.post("/hosts/delete/", {"hostnames": wanted})
    run.done({"deleted": wanted}, f"Deleted hosts: {', '.join(wanted)}")
