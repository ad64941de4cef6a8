"""A quiet heartbeat reads its shard's hosts (id, version, status) and active jobs (id, version,
priority) from an index alone on PostgreSQL. A shard's rows lie wherever they were written (a million
hosts bulk-loaded a shard at a time in turn put each of a shard's 200 hosts on its own page), and
reading them from the table took 258 pages a heartbeat at 1,000,000 hosts against 13 from these
(docs/benchmarks.md). Each new index is built before the one it replaces is dropped. SQLite has no
INCLUDE: there they stay the plain indexes they were.

An index alone answers only for pages that VACUUM has marked all-visible; a changed row's page is read
from the table until autovacuum comes by again. By default it comes once a fifth of a table changed
(200,000 hosts at a million): here once a fiftieth did. The builds block writes to both tables for
their seconds (under 3 s at a million hosts, measured)."""

from typing import Any

from django.db import migrations, models

TABLES = ("common_host", "common_job")
AUTOVACUUM = "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.02"


def vacuum_sooner(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"ALTER TABLE {table} SET ({AUTOVACUUM})")


def vacuum_as_before(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(
                f"ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor)"
            )


class Migration(migrations.Migration):
    dependencies = [
        ("common", "0013_shard_seq_seen"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="host",
            index=models.Index(fields=["shard", "id"], include=("version", "status"), name="host_shard_holdings_idx"),
        ),
        migrations.RemoveIndex(model_name="host", name="host_shard_idx"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                fields=["shard", "status"], include=("id", "version", "priority"), name="job_shard_holdings_idx"
            ),
        ),
        migrations.RemoveIndex(model_name="job", name="job_shard_status_idx"),
        migrations.RunPython(vacuum_sooner, vacuum_as_before),
    ]
