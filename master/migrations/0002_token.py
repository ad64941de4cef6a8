"""Token moves from common to master: the master alone issues and checks tokens.

The model's state moves here with its table as it stands (`common_token`, created by common's 0001),
then the table is renamed, so an existing master keeps every token. It runs before common's 0004,
which drops Token from common's state.
"""

from typing import Any

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def move_content_types(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Moves the content types along, so permissions granted on these models (and admin history) stay."""
    _relabel(apps, schema_editor, "common", "master")


def move_content_types_back(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _relabel(apps, schema_editor, "master", "common")


def _relabel(apps: Any, schema_editor: BaseDatabaseSchemaEditor, old: str, new: str) -> None:
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    for model in ("token",):
        if not content_types.filter(app_label=new, model=model).exists():
            content_types.filter(app_label=old, model=model).update(app_label=new)


class Migration(migrations.Migration):
    dependencies = [
        ("master", "0001_audit"),
        ("common", "0003_shard_instances"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    run_before = [("common", "0004_role_models")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Token",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("digest", models.CharField(max_length=64, unique=True)),
                        (
                            "prefix",
                            models.CharField(help_text="The first characters, to tell tokens apart.", max_length=16),
                        ),
                        ("description", models.CharField(blank=True, default="", max_length=255)),
                        ("created_on", models.DateTimeField(default=django.utils.timezone.now)),
                        ("last_used", models.DateTimeField(blank=True, null=True)),
                        (
                            "shard",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="tokens",
                                to="common.shard",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="api_tokens",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "ordering": ["-created_on"],
                        "db_table": "common_token",
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(
                                    models.Q(("shard__isnull", True), ("user__isnull", False)),
                                    models.Q(("shard__isnull", False), ("user__isnull", True)),
                                    _connector="OR",
                                ),
                                name="token_for_user_xor_shard",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.AlterModelTable(name="token", table=None),
        migrations.RunPython(move_content_types, move_content_types_back),
    ]
