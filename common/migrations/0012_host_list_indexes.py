"""Indexes for the staff pages at fleet size (100,000 hosts): the fleet overview's hosts counted by
shard, status and lock from an index alone; the host list sorted by status; and, on PostgreSQL only,
its search (Django's icontains: UPPER(hostname) LIKE UPPER('%part%')) through a pg_trgm index, which
no btree can answer. SQLite has no trigram index: there the search reads the table, as before."""

from typing import Any

from django.db import migrations, models

TRIGRAM_INDEX = "host_hostname_trgm_idx"


def create_trigram_index(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            return  # a server without the contrib extensions: the search reads the table, as on SQLite
    # pg_trgm is a trusted extension (PostgreSQL 13 and later): the database's owner may create it.
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        f'CREATE INDEX IF NOT EXISTS {TRIGRAM_INDEX} ON common_host USING gin ((UPPER("hostname"::text)) gin_trgm_ops)'
    )


def drop_trigram_index(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {TRIGRAM_INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("common", "0011_host_created_on"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="host",
            index=models.Index(fields=["shard", "status", "locked"], name="host_shard_status_idx"),
        ),
        migrations.AddIndex(
            model_name="host",
            index=models.Index(fields=["status", "id"], name="host_status_idx"),
        ),
        migrations.RunPython(create_trigram_index, drop_trigram_index),
    ]
