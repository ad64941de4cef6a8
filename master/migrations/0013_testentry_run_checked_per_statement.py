"""An entry's run is checked once per statement, not once per row (docs/design.md, "Benchmark results").

PostgreSQL checked the foreign key entry -> run with one deferred trigger event per entry: at commit, a
lookup and a row lock of the run for each of a file's up to 10,000 entries, a third of an upload's
database time. The constraint goes; triggers keep its two rules:
- an entry (inserted, or its run changed) names a run that exists: on PostgreSQL once per statement,
  over the statement's rows (a COPY of a file's entries is one), locking each distinct run FOR KEY
  SHARE as the foreign key's check did, so a run deleted meanwhile is waited for and then refused;
- a deleted run's entries go with it (ON DELETE CASCADE, as the model says; the ORM deletes them
  first anyway, and `manage.py flush` on SQLite deletes tables in any order).
SQLite (not where ingest speed is measured) checks per row. Its triggers live on the tables, and
Django's SQLite schema editor drops them when it rebuilds a table (a later AlterField): a later
migration that rebuilds master_testentry or master_testrun must create them again (tests of the rules
run on both databases, and fail if it does not)."""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

POSTGRESQL = [
    """
    CREATE FUNCTION master_testentry_run_exists() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        wanted bigint;
        found bigint;
    BEGIN
        SELECT count(DISTINCT run_id) INTO wanted FROM new_entries;
        SELECT count(*) INTO found FROM (
            SELECT 1 FROM master_testrun WHERE id IN (SELECT run_id FROM new_entries) FOR KEY SHARE
        ) AS runs;
        IF found <> wanted THEN
            RAISE foreign_key_violation USING MESSAGE =
                'insert or update on table "master_testentry" names a run that does not exist';
        END IF;
        RETURN NULL;
    END $$
    """,
    "CREATE TRIGGER master_testentry_run_exists_insert AFTER INSERT ON master_testentry"
    " REFERENCING NEW TABLE AS new_entries FOR EACH STATEMENT EXECUTE FUNCTION master_testentry_run_exists()",
    "CREATE TRIGGER master_testentry_run_exists_update AFTER UPDATE ON master_testentry"
    " REFERENCING NEW TABLE AS new_entries FOR EACH STATEMENT EXECUTE FUNCTION master_testentry_run_exists()",
    """
    CREATE FUNCTION master_testrun_delete_entries() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM master_testentry WHERE run_id IN (SELECT id FROM old_runs);
        RETURN NULL;
    END $$
    """,
    "CREATE TRIGGER master_testrun_delete_entries AFTER DELETE ON master_testrun"
    " REFERENCING OLD TABLE AS old_runs FOR EACH STATEMENT EXECUTE FUNCTION master_testrun_delete_entries()",
]
POSTGRESQL_REVERSE = [
    "DROP TRIGGER master_testrun_delete_entries ON master_testrun",
    "DROP FUNCTION master_testrun_delete_entries()",
    "DROP TRIGGER master_testentry_run_exists_update ON master_testentry",
    "DROP TRIGGER master_testentry_run_exists_insert ON master_testentry",
    "DROP FUNCTION master_testentry_run_exists()",
]
_NO_RUN = "SELECT RAISE(ABORT, 'FOREIGN KEY constraint failed: master_testentry names a run that does not exist')"
SQLITE = [
    "CREATE TRIGGER master_testentry_run_exists_insert BEFORE INSERT ON master_testentry"
    " WHEN NOT EXISTS (SELECT 1 FROM master_testrun WHERE id = NEW.run_id)"
    f" BEGIN {_NO_RUN}; END",
    "CREATE TRIGGER master_testentry_run_exists_update BEFORE UPDATE OF run_id ON master_testentry"
    " WHEN NOT EXISTS (SELECT 1 FROM master_testrun WHERE id = NEW.run_id)"
    f" BEGIN {_NO_RUN}; END",
    "CREATE TRIGGER master_testrun_delete_entries AFTER DELETE ON master_testrun"
    " BEGIN DELETE FROM master_testentry WHERE run_id = OLD.id; END",
]
SQLITE_REVERSE = [
    "DROP TRIGGER master_testrun_delete_entries",
    "DROP TRIGGER master_testentry_run_exists_update",
    "DROP TRIGGER master_testentry_run_exists_insert",
]


def _run(statements: dict[str, list[str]]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('master', '0012_subscription_creator_cascade'),
    ]

    operations = [
        migrations.AlterField(
            model_name='testentry',
            name='run',
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name='entries',
                to='master.testrun',
            ),
        ),
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}),
            _run({"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}),
        ),
    ]
