"""`fleetshard audit ...`: who changed what on the master, when, and why."""

from typing import Any

import click

from cli.action import Run, action
from cli.inputs import Id
from cli.output import Column, when


def _objects(row: dict[str, Any]) -> str:
    return ", ".join(f"{t['kind']} {t['name'] or t['id']}" for t in row["targets"]) or "-"


AUDIT_COLUMNS: list[Column] = [
    ("At", when("at")),
    ("User", "user"),
    ("Action", "action"),
    ("Objects", _objects),
    ("Reason", "reason"),
]


@click.group()
def audit() -> None:
    """The audit trail: every change made on the master, by whom."""


@audit.command("list")
@click.option("--host", metavar="HOST", help="Only changes that touched this host.")
@click.option("--job", "job_id", type=Id("job"), metavar="ID", help="Only changes that touched this job.")
@click.option("--user", metavar="USER", help="Only changes by this user ('system': the master's own).")
@click.option("--since", metavar="WHEN", help="Only changes since an ISO time or within an age (90m, 24h, 7d).")
@click.option("--limit", type=click.IntRange(min=0), default=200, show_default=True, help="Newest N changes; 0: all.")
@action
def audit_list(run: Run, host: str | None, job_id: int | None, user: str | None, since: str | None, limit: int) -> None:
    """List changes, newest first."""
    records = run.api.list("/audit/", limit=limit or None, host=host, job=job_id, user=user, since=since)
    if len(records) < run.api.total:
        click.echo(f"(the newest {len(records)} of {run.api.total} changes; --limit 0 shows all)", err=True)
    run.rows(records, AUDIT_COLUMNS, "changes")
