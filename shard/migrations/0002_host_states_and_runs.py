"""The scheduler's bookkeeping moves from common's columns into shard's own tables: HostState (a host's
runner, failed repair version, retirement) and Run (an HQE's runner, pid, results directory).

The tables are created and filled from the columns, in batches, before common's 0005 drops them, so a
running shard keeps its claims and its runs across the upgrade: every host gets its state, and every HQE
that was ever claimed its run. Backwards, common's 0005 is undone first (the columns come back empty)
and the values are copied back before the tables go.
"""

from collections.abc import Iterator
from typing import Any

import django.db.models.deletion
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

BATCH = 1000
HOST_FIELDS = ("runner", "repair_failed_version", "retired")
RUN_FIELDS = ("runner", "pid", "results_dir")


def _batches(rows: Any, key: str) -> Iterator[list[dict[str, Any]]]:
    """The rows in `key` order, BATCH at a time, so a large shard never loads them all at once."""
    last = None
    while True:
        page = rows.order_by(key) if last is None else rows.filter(**{f"{key}__gt": last}).order_by(key)
        batch = list(page[:BATCH])
        if not batch:
            return
        last = batch[-1][key]
        yield batch


def copy_to_tables(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    db = schema_editor.connection.alias
    host_state, run = (apps.get_model("shard", name).objects.using(db) for name in ("HostState", "Run"))
    hosts = apps.get_model("common", "Host").objects.using(db).values("id", *HOST_FIELDS)
    for batch in _batches(hosts, "id"):
        host_state.bulk_create(host_state.model(host_id=row.pop("id"), **row) for row in batch)
    hqes = apps.get_model("common", "HostQueueEntry").objects.using(db).values("id", *RUN_FIELDS)
    claimed = hqes.exclude(runner="", pid__isnull=True, results_dir="")
    for batch in _batches(claimed, "id"):
        run.bulk_create(run.model(hqe_id=row.pop("id"), **row) for row in batch)


def copy_back(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    db = schema_editor.connection.alias
    host, hqe = (apps.get_model("common", name) for name in ("Host", "HostQueueEntry"))
    states = apps.get_model("shard", "HostState").objects.using(db).values("host_id", *HOST_FIELDS)
    for batch in _batches(states, "host_id"):
        rows = [host(id=row.pop("host_id"), **row) for row in batch]
        host.objects.using(db).bulk_update(rows, HOST_FIELDS)
    runs = apps.get_model("shard", "Run").objects.using(db).values("hqe_id", *RUN_FIELDS)
    for batch in _batches(runs, "hqe_id"):
        rows = [hqe(id=row.pop("hqe_id"), **row) for row in batch]
        hqe.objects.using(db).bulk_update(rows, RUN_FIELDS)


class Migration(migrations.Migration):
    dependencies = [("common", "0004_role_models"), ("shard", "0001_initial")]
    run_before = [("common", "0005_shard_bookkeeping")]

    operations = [
        migrations.CreateModel(
            name="HostState",
            fields=[
                (
                    "host",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="state",
                        serialize=False,
                        to="common.host",
                    ),
                ),
                ("runner", models.CharField(blank=True, default="", max_length=255)),
                ("repair_failed_version", models.PositiveIntegerField(blank=True, null=True)),
                ("retired", models.BooleanField(default=False)),
            ],
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                (
                    "hqe",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="run",
                        serialize=False,
                        to="common.hostqueueentry",
                    ),
                ),
                ("runner", models.CharField(blank=True, default="", max_length=255)),
                ("pid", models.IntegerField(blank=True, null=True)),
                ("results_dir", models.CharField(blank=True, default="", max_length=1024)),
            ],
        ),
        migrations.RunPython(copy_to_tables, copy_back),
    ]
