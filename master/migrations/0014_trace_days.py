"""Days of the timeline built once (master/timeline/days.py), and the triggers that note a change to
what a day before today shows, in the changing transaction: its intervals (inserted, changed,
deleted); an HQE whose run started that day (inserted, its status, failure, exit code or start
changed, deleted: a run's interval starts when its HQE did; its interval's day is noted too); a job
whose intervals it holds (inserted, renamed, its owner changed, deleted; a rename locks the job's
HQEs, so a run recorded meanwhile is waited for and its day noted). Triggers, not the services:
every writer goes through them, the heartbeat's bulk statements, the admin, a restore and a
`manage.py shell` alike.

A change is a row appended to master_tracechange, one a day and transaction at most: writers never
update a shared row, so they never wait for each other or deadlock. Only days before today (UTC, by
the database's clock) are watched: today's intervals and HQEs, which every heartbeat writes, cost the
trigger's WHEN and nothing more (a day is built an hour after it ends).
Django's SQLite schema editor drops a table's triggers when it rebuilds the table (an AlterField):
a later migration that rebuilds master_interval, common_hostqueueentry or common_job must create
them again (tests/master/timeline/test_days.py fails on SQLite if it does not)."""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models


_PG_TODAY = "date_trunc('day', clock_timestamp(), 'UTC')"
# PL/pgSQL, not SQL: a SQL function's statements are planned again at each call (~150 us a row).
_PG_CHANGED = """
    DECLARE
        noted integer := floor(extract(epoch FROM t) / 86400)::integer;
        mine bigint := pg_current_xact_id()::text::bigint;
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM master_tracechange WHERE day = noted AND xact = mine) THEN
            INSERT INTO master_tracechange (day, xact) VALUES (noted, mine);
        END IF;
    END
"""


def _pg_rows(old: str, new: str) -> str:
    """A trigger function's body noting the days of OLD's `old` and NEW's `new` times, where watched."""
    return f"""
    BEGIN
        IF TG_OP <> 'INSERT' AND OLD.{old} < {_PG_TODAY} THEN
            PERFORM master_trace_changed(OLD.{old});
        END IF;
        IF TG_OP <> 'DELETE' AND NEW.{new} < {_PG_TODAY} THEN
            PERFORM master_trace_changed(NEW.{new});
        END IF;
        RETURN NULL;
    END
    """


_HQE_SHOWN = ("status", "failure", "exit_code", "started_on", "id")
_JOB_SHOWN = ("name", "owner", "id")


def _pg_changed_any(columns: tuple[str, ...]) -> str:
    return " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in columns)


POSTGRESQL = [
    f"CREATE FUNCTION master_trace_changed(t timestamptz) RETURNS void LANGUAGE plpgsql AS $${_PG_CHANGED}$$",
    f"CREATE FUNCTION master_interval_changed() RETURNS trigger LANGUAGE plpgsql AS $${_pg_rows('start', 'start')}$$",
    "CREATE TRIGGER master_interval_changed_insert AFTER INSERT ON master_interval FOR EACH ROW"
    f" WHEN (NEW.start < {_PG_TODAY}) EXECUTE FUNCTION master_interval_changed()",
    "CREATE TRIGGER master_interval_changed_update AFTER UPDATE ON master_interval FOR EACH ROW"
    f" WHEN (OLD.start < {_PG_TODAY} OR NEW.start < {_PG_TODAY}) EXECUTE FUNCTION master_interval_changed()",
    "CREATE TRIGGER master_interval_changed_delete AFTER DELETE ON master_interval FOR EACH ROW"
    f" WHEN (OLD.start < {_PG_TODAY}) EXECUTE FUNCTION master_interval_changed()",
    f"""
    CREATE FUNCTION master_hqe_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP <> 'INSERT' AND OLD.started_on < {_PG_TODAY} THEN
            PERFORM master_trace_changed(OLD.started_on);
        END IF;
        IF TG_OP <> 'DELETE' AND NEW.started_on < {_PG_TODAY} THEN
            PERFORM master_trace_changed(NEW.started_on);
        END IF;
        -- Its run's interval too, should its start have been set apart from the HQE's.
        PERFORM master_trace_changed(start) FROM master_interval
        WHERE (hqe_id = OLD.id OR hqe_id = NEW.id) AND start < {_PG_TODAY};
        RETURN NULL;
    END $$
    """,
    "CREATE TRIGGER master_hqe_changed_insert AFTER INSERT ON common_hostqueueentry FOR EACH ROW"
    f" WHEN (NEW.started_on < {_PG_TODAY}) EXECUTE FUNCTION master_hqe_changed()",
    f"CREATE TRIGGER master_hqe_changed_update AFTER UPDATE OF {', '.join(_HQE_SHOWN)} ON common_hostqueueentry"
    f" FOR EACH ROW WHEN ((OLD.started_on < {_PG_TODAY} OR NEW.started_on < {_PG_TODAY})"
    f" AND ({_pg_changed_any(_HQE_SHOWN)})) EXECUTE FUNCTION master_hqe_changed()",
    "CREATE TRIGGER master_hqe_changed_delete AFTER DELETE ON common_hostqueueentry FOR EACH ROW"
    f" WHEN (OLD.started_on < {_PG_TODAY}) EXECUTE FUNCTION master_hqe_changed()",
    f"""
    CREATE FUNCTION master_job_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        hqe record;
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            -- A run of the job recorded meanwhile is not among the intervals this statement sees: its
            -- HQE, locked, waits for that writer and then shows its start.
            FOR hqe IN SELECT started_on FROM common_hostqueueentry WHERE job_id = OLD.id ORDER BY id FOR SHARE LOOP
                IF hqe.started_on < {_PG_TODAY} THEN
                    PERFORM master_trace_changed(hqe.started_on);
                END IF;
            END LOOP;
        END IF;
        PERFORM master_trace_changed(start) FROM master_interval
        WHERE (job_id = OLD.id OR job_id = NEW.id) AND start < {_PG_TODAY};
        RETURN NULL;
    END $$
    """,
    "CREATE TRIGGER master_job_changed_insert AFTER INSERT ON common_job FOR EACH ROW"
    " EXECUTE FUNCTION master_job_changed()",
    f"CREATE TRIGGER master_job_changed_update AFTER UPDATE OF {', '.join(_JOB_SHOWN)} ON common_job FOR EACH ROW"
    f" WHEN ({_pg_changed_any(_JOB_SHOWN)}) EXECUTE FUNCTION master_job_changed()",
    "CREATE TRIGGER master_job_changed_delete AFTER DELETE ON common_job FOR EACH ROW"
    " EXECUTE FUNCTION master_job_changed()",
]
_TRIGGERS = {
    "master_interval": ("master_interval_changed", ("insert", "update", "delete")),
    "common_hostqueueentry": ("master_hqe_changed", ("insert", "update", "delete")),
    "common_job": ("master_job_changed", ("insert", "update", "delete")),
}
POSTGRESQL_REVERSE = [
    *(
        f"DROP TRIGGER {function}_{event} ON {table}"
        for table, (function, events) in _TRIGGERS.items()
        for event in events
    ),
    *(f"DROP FUNCTION {function}()" for function, _ in _TRIGGERS.values()),
    "DROP FUNCTION master_trace_changed(timestamptz)",
]
# SQLite keeps times as UTC text ("YYYY-MM-DD HH:MM:SS[.ffffff]"), which sorts as the times do; the
# day comes from the whole seconds (strftime would round the fraction, 23:59:59.9996 to the next day).
_SQLITE_TODAY = "strftime('%Y-%m-%d 00:00:00', 'now')"


def _sqlite_changed(time: str, source: str = "", where: str = "") -> str:
    """Notes the day of `time` (of `source`'s rows, when given) if before today and not noted since
    its last build: SQLite has one writer at a time, so a change after a build is one it did not read."""
    day = f"CAST(strftime('%s', substr({time}, 1, 19)) AS INTEGER) / 86400"
    rows = f"FROM {source} WHERE ({where}) AND" if source else "WHERE"
    return (
        "INSERT INTO master_tracechange (day, xact) SELECT DISTINCT c.day, 0 FROM"
        f" (SELECT {day} AS day {rows} {time} < {_SQLITE_TODAY}) AS c"
        " WHERE NOT EXISTS (SELECT 1 FROM master_tracechange m WHERE m.day = c.day AND m.id >"
        " COALESCE((SELECT as_of FROM master_traceday t WHERE t.day = c.day), 0));"
    )


_HQE_CHANGED = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _HQE_SHOWN)
_JOB_CHANGED = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _JOB_SHOWN)
_JOB_DAYS = _RUN_DAYS = ("start", "master_interval")
SQLITE = [
    f"CREATE TRIGGER master_interval_changed_insert AFTER INSERT ON master_interval"
    f" BEGIN {_sqlite_changed('NEW.start')} END",
    f"CREATE TRIGGER master_interval_changed_update AFTER UPDATE ON master_interval"
    f" BEGIN {_sqlite_changed('OLD.start')} {_sqlite_changed('NEW.start')} END",
    f"CREATE TRIGGER master_interval_changed_delete AFTER DELETE ON master_interval"
    f" BEGIN {_sqlite_changed('OLD.start')} END",
    "CREATE TRIGGER master_hqe_changed_insert AFTER INSERT ON common_hostqueueentry"
    f" BEGIN {_sqlite_changed('NEW.started_on')} END",
    f"CREATE TRIGGER master_hqe_changed_update AFTER UPDATE OF {', '.join(_HQE_SHOWN)} ON common_hostqueueentry"
    f" WHEN {_HQE_CHANGED} BEGIN {_sqlite_changed('OLD.started_on')} {_sqlite_changed('NEW.started_on')}"
    f" {_sqlite_changed(*_RUN_DAYS, 'hqe_id = OLD.id OR hqe_id = NEW.id')} END",
    "CREATE TRIGGER master_hqe_changed_delete AFTER DELETE ON common_hostqueueentry"
    f" BEGIN {_sqlite_changed('OLD.started_on')} {_sqlite_changed(*_RUN_DAYS, 'hqe_id = OLD.id')} END",
    "CREATE TRIGGER master_job_changed_insert AFTER INSERT ON common_job"
    f" BEGIN {_sqlite_changed(*_JOB_DAYS, 'job_id = NEW.id')} END",
    f"CREATE TRIGGER master_job_changed_update AFTER UPDATE OF {', '.join(_JOB_SHOWN)} ON common_job"
    f" WHEN {_JOB_CHANGED} BEGIN {_sqlite_changed(*_JOB_DAYS, 'job_id = OLD.id OR job_id = NEW.id')} END",
    "CREATE TRIGGER master_job_changed_delete AFTER DELETE ON common_job"
    f" BEGIN {_sqlite_changed(*_JOB_DAYS, 'job_id = OLD.id')} END",
]
SQLITE_REVERSE = [
    f"DROP TRIGGER {function}_{event}" for function, events in _TRIGGERS.values() for event in events
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
                ('as_of', models.BigIntegerField(default=0, help_text='The newest TraceChange its pieces include.')),
                ('intervals', models.PositiveIntegerField(default=0)),
                ('max_end', models.DateTimeField(blank=True, help_text='The latest end of its slices.', null=True)),
                ('built_on', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='TraceChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.IntegerField()),
                ('xact', models.BigIntegerField(default=0)),
            ],
            options={
                'indexes': [models.Index(fields=['day', 'id'], name='tracechange_day_idx'), models.Index(fields=['day', 'xact'], name='tracechange_day_xact_idx')],
            },
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
