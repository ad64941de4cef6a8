"""Days of the timeline built once (master/timeline/days.py), and the triggers that mark a day unbuilt
when anything its slices show changes: its intervals (inserted, changed, deleted), the HQE a run's
slice names (status, failure, exit code; deleted) or its job (name, owner; deleted). Triggers, not
the services: every writer goes through them, the heartbeat's bulk statements, the admin and a
`manage.py shell` alike. A change marks its day in its own transaction, taking the day's row lock,
so a builder reading the day meanwhile is either waited for or waits.

Only days before today (UTC, by the database's clock) are watched: today's intervals, which every
heartbeat writes, cost the trigger's check and no write (a day is built an hour after it ends).
Django's SQLite schema editor drops a table's triggers when it rebuilds the table (an AlterField):
a later migration that rebuilds master_interval, common_hostqueueentry or common_job must create
them again (tests/master/timeline/test_days.py fails on SQLite if it does not)."""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models


_PG_UNBUILD = (
    "INSERT INTO master_traceday (day, built, format, intervals)"
    " VALUES (floor(extract(epoch FROM t) / 86400)::integer, false, 0, 0)"
    " ON CONFLICT (day) DO UPDATE SET built = false"
)
_PG_TODAY = "date_trunc('day', clock_timestamp(), 'UTC')"
POSTGRESQL = [
    f"CREATE FUNCTION master_trace_unbuild(t timestamptz) RETURNS void LANGUAGE sql AS $$ {_PG_UNBUILD} $$",
    f"""
    CREATE FUNCTION master_interval_unbuild() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP <> 'INSERT' AND OLD.start < {_PG_TODAY} THEN
            PERFORM master_trace_unbuild(OLD.start);
        END IF;
        IF TG_OP <> 'DELETE' AND NEW.start < {_PG_TODAY} THEN
            PERFORM master_trace_unbuild(NEW.start);
        END IF;
        RETURN NULL;
    END $$
    """,
    "CREATE TRIGGER master_interval_unbuild_insert AFTER INSERT ON master_interval FOR EACH ROW"
    f" WHEN (NEW.start < {_PG_TODAY}) EXECUTE FUNCTION master_interval_unbuild()",
    "CREATE TRIGGER master_interval_unbuild_update AFTER UPDATE ON master_interval FOR EACH ROW"
    f" WHEN (OLD.start < {_PG_TODAY} OR NEW.start < {_PG_TODAY}) EXECUTE FUNCTION master_interval_unbuild()",
    "CREATE TRIGGER master_interval_unbuild_delete AFTER DELETE ON master_interval FOR EACH ROW"
    f" WHEN (OLD.start < {_PG_TODAY}) EXECUTE FUNCTION master_interval_unbuild()",
    f"""
    CREATE FUNCTION master_hqe_unbuild() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM master_trace_unbuild(start) FROM master_interval WHERE hqe_id = OLD.id AND start < {_PG_TODAY};
        RETURN NULL;
    END $$
    """,
    "CREATE TRIGGER master_hqe_unbuild_update AFTER UPDATE OF status, failure, exit_code ON common_hostqueueentry"
    " FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.failure IS DISTINCT FROM NEW.failure"
    " OR OLD.exit_code IS DISTINCT FROM NEW.exit_code) EXECUTE FUNCTION master_hqe_unbuild()",
    "CREATE TRIGGER master_hqe_unbuild_delete AFTER DELETE ON common_hostqueueentry FOR EACH ROW"
    " EXECUTE FUNCTION master_hqe_unbuild()",
    f"""
    CREATE FUNCTION master_job_unbuild() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM master_trace_unbuild(start) FROM master_interval WHERE job_id = OLD.id AND start < {_PG_TODAY};
        RETURN NULL;
    END $$
    """,
    "CREATE TRIGGER master_job_unbuild_update AFTER UPDATE OF name, owner ON common_job FOR EACH ROW"
    " WHEN (OLD.name IS DISTINCT FROM NEW.name OR OLD.owner IS DISTINCT FROM NEW.owner)"
    " EXECUTE FUNCTION master_job_unbuild()",
    "CREATE TRIGGER master_job_unbuild_delete AFTER DELETE ON common_job FOR EACH ROW EXECUTE FUNCTION master_job_unbuild()",
]
POSTGRESQL_REVERSE = [
    "DROP TRIGGER master_job_unbuild_delete ON common_job",
    "DROP TRIGGER master_job_unbuild_update ON common_job",
    "DROP FUNCTION master_job_unbuild()",
    "DROP TRIGGER master_hqe_unbuild_delete ON common_hostqueueentry",
    "DROP TRIGGER master_hqe_unbuild_update ON common_hostqueueentry",
    "DROP FUNCTION master_hqe_unbuild()",
    "DROP TRIGGER master_interval_unbuild_delete ON master_interval",
    "DROP TRIGGER master_interval_unbuild_update ON master_interval",
    "DROP TRIGGER master_interval_unbuild_insert ON master_interval",
    "DROP FUNCTION master_interval_unbuild()",
    "DROP FUNCTION master_trace_unbuild(timestamptz)",
]
# SQLite keeps times as UTC text ("YYYY-MM-DD HH:MM:SS[.ffffff]"), which sorts as the times do.
_SQLITE_TODAY = "strftime('%Y-%m-%d 00:00:00', 'now')"


def _sqlite_unbuild(start: str, source: str = "", where: str = "") -> str:
    """An upsert marking unbuilt the day of `start` (of `source`'s rows, when given) before today."""
    day = f"CAST(strftime('%s', {start}) AS INTEGER) / 86400"
    rows = f" FROM {source} WHERE {where} AND" if source else " WHERE"
    return (
        f"INSERT INTO master_traceday (day, built, format, intervals) SELECT {day}, 0, 0, 0{rows} {start} < {_SQLITE_TODAY}"
        " ON CONFLICT (day) DO UPDATE SET built = 0;"
    )


SQLITE = [
    f"CREATE TRIGGER master_interval_unbuild_insert AFTER INSERT ON master_interval"
    f" BEGIN {_sqlite_unbuild('NEW.start')} END",
    f"CREATE TRIGGER master_interval_unbuild_update AFTER UPDATE ON master_interval"
    f" BEGIN {_sqlite_unbuild('OLD.start')} {_sqlite_unbuild('NEW.start')} END",
    f"CREATE TRIGGER master_interval_unbuild_delete AFTER DELETE ON master_interval"
    f" BEGIN {_sqlite_unbuild('OLD.start')} END",
    "CREATE TRIGGER master_hqe_unbuild_update AFTER UPDATE OF status, failure, exit_code ON common_hostqueueentry"
    " WHEN OLD.status IS NOT NEW.status OR OLD.failure IS NOT NEW.failure OR OLD.exit_code IS NOT NEW.exit_code"
    f" BEGIN {_sqlite_unbuild('start', 'master_interval', 'hqe_id = OLD.id')} END",
    "CREATE TRIGGER master_hqe_unbuild_delete AFTER DELETE ON common_hostqueueentry"
    f" BEGIN {_sqlite_unbuild('start', 'master_interval', 'hqe_id = OLD.id')} END",
    "CREATE TRIGGER master_job_unbuild_update AFTER UPDATE OF name, owner ON common_job"
    " WHEN OLD.name IS NOT NEW.name OR OLD.owner IS NOT NEW.owner"
    f" BEGIN {_sqlite_unbuild('start', 'master_interval', 'job_id = OLD.id')} END",
    "CREATE TRIGGER master_job_unbuild_delete AFTER DELETE ON common_job"
    f" BEGIN {_sqlite_unbuild('start', 'master_interval', 'job_id = OLD.id')} END",
]
SQLITE_REVERSE = [
    f"DROP TRIGGER {name}"
    for name in (
        "master_job_unbuild_delete",
        "master_job_unbuild_update",
        "master_hqe_unbuild_delete",
        "master_hqe_unbuild_update",
        "master_interval_unbuild_delete",
        "master_interval_unbuild_update",
        "master_interval_unbuild_insert",
    )
]


def _run(statements: dict[str, list[str]]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('master', '0013_testentry_run_checked_per_statement'),
    ]

    operations = [
        migrations.CreateModel(
            name='TraceDay',
            fields=[
                ('day', models.IntegerField(help_text="Days since 1970-01-01 (UTC) of the intervals' start.", primary_key=True, serialize=False)),
                ('built', models.BooleanField(default=False)),
                ('format', models.PositiveSmallIntegerField(default=0, help_text="The slices' format it was built in.")),
                ('intervals', models.PositiveIntegerField(default=0)),
                ('max_end', models.DateTimeField(blank=True, help_text='The latest end of its slices.', null=True)),
                ('built_on', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='TracePiece',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.PositiveIntegerField()),
                ('body', models.BinaryField()),
                ('crc', models.BigIntegerField(help_text='CRC-32 of the text, for the gzip trailer.')),
                ('size', models.BigIntegerField(help_text='Bytes of the text (UTF-8).')),
                ('day', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='pieces', to='master.traceday')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('day', 'seq'), name='tracepiece_unique_seq')],
            },
        ),
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}),
            _run({"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}),
        ),
    ]
