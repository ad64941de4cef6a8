"""Role-only models leave common: Token for master (its 0002), the shard's state for shard (its 0001).

Those migrations run first and take their tables along. What is left under a `common_` name belongs to
the role this database is not (common's 0001 created every table on both roles): an empty one is
dropped, so a master has no outbox and a shard no token table; one holding rows is kept as it is and
reported, since no migration should lose data it cannot account for.
"""

import logging
from typing import Any

from django.apps import apps as installed
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

log = logging.getLogger(__name__)

# The app that now owns each moved model.
MOVED = {"Token": "master", "OutboxEntry": "shard", "DeadLetter": "shard", "ShardState": "shard"}


def _leftovers() -> dict[str, str]:
    """Each moved model whose owner app is not installed in this role: model name to its old table."""
    return {name: f"common_{name.lower()}" for name, app in MOVED.items() if not installed.is_installed(app)}


def drop_leftovers(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    existing = set(schema_editor.connection.introspection.table_names())
    for table in _leftovers().values():
        if table not in existing:
            continue
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM {schema_editor.quote_name(table)}")
            rows = cursor.fetchone()[0]
        if rows:
            log.warning("kept %s: this role does not use it, but it holds %d rows", table, rows)
        else:
            schema_editor.execute(f"DROP TABLE {schema_editor.quote_name(table)}")


def restore_leftovers(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Back to common 0003, which expects every table: recreates (empty) the ones dropped above."""
    existing = set(schema_editor.connection.introspection.table_names())
    for name, table in _leftovers().items():
        if table not in existing:
            schema_editor.create_model(apps.get_model("common", name))


class Migration(migrations.Migration):
    dependencies = [("common", "0003_shard_instances")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Token"),
                migrations.DeleteModel(name="OutboxEntry"),
                migrations.DeleteModel(name="DeadLetter"),
                migrations.DeleteModel(name="ShardState"),
            ],
            database_operations=[migrations.RunPython(drop_leftovers, restore_leftovers)],
        ),
    ]
