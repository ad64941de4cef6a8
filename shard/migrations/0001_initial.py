"""The shard's own state moves from common to shard: outbox, dead letters and the shard singleton.

Each model's state moves here with its table as it stands (created by common's 0001), then the table
is renamed, so an existing shard keeps its unacknowledged updates, dead letters and instance id. It
runs before common's 0004, which drops these models from common's state.
"""

from typing import Any

import django.utils.timezone
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def _id() -> models.BigAutoField:
    return models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")


def move_content_types(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Moves the content types along, so permissions granted on these models (and admin history) stay."""
    _relabel(apps, schema_editor, "common", "shard")


def move_content_types_back(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _relabel(apps, schema_editor, "shard", "common")


def _relabel(apps: Any, schema_editor: BaseDatabaseSchemaEditor, old: str, new: str) -> None:
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    for model in ("deadletter", "outboxentry", "shardstate"):
        if not content_types.filter(app_label=new, model=model).exists():
            content_types.filter(app_label=old, model=model).update(app_label=new)


class Migration(migrations.Migration):
    initial = True

    dependencies = [("common", "0003_shard_instances"), ("contenttypes", "0002_remove_content_type_name")]
    run_before = [("common", "0004_role_models")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="DeadLetter",
                    fields=[
                        ("id", _id()),
                        ("seq", models.BigIntegerField()),
                        ("hqe_id", models.BigIntegerField()),
                        ("job_id", models.BigIntegerField()),
                        ("payload", models.JSONField()),
                        ("error", models.TextField()),
                        ("created_on", models.DateTimeField(default=django.utils.timezone.now)),
                    ],
                    options={"ordering": ["-id"], "db_table": "common_deadletter"},
                ),
                migrations.CreateModel(
                    name="OutboxEntry",
                    fields=[
                        ("id", _id()),
                        ("seq", models.BigIntegerField(unique=True)),
                        ("hqe_id", models.BigIntegerField()),
                        ("job_id", models.BigIntegerField(db_index=True)),
                        ("payload", models.JSONField()),
                        ("created_on", models.DateTimeField(default=django.utils.timezone.now)),
                    ],
                    options={
                        "verbose_name_plural": "outbox entries",
                        "ordering": ["seq"],
                        "db_table": "common_outboxentry",
                    },
                ),
                migrations.CreateModel(
                    name="ShardState",
                    fields=[
                        ("id", _id()),
                        ("last_seq", models.BigIntegerField(default=0)),
                        ("last_heartbeat_ok", models.DateTimeField(blank=True, null=True)),
                        ("instance", models.CharField(blank=True, default="", max_length=36)),
                        ("identity", models.CharField(blank=True, default="", max_length=255)),
                    ],
                    options={"db_table": "common_shardstate"},
                ),
            ],
            database_operations=[],
        ),
        migrations.AlterModelTable(name="deadletter", table=None),
        migrations.AlterModelTable(name="outboxentry", table=None),
        migrations.AlterModelTable(name="shardstate", table=None),
        migrations.RunPython(move_content_types, move_content_types_back),
    ]
