"""On PostgreSQL, a new outbox entry or host event NOTIFYs `fleetshard_outbox` once its transaction
commits: the process holding the shard's heartbeat listens and heartbeats at once, so a run that another
process (an elastic worker) started or ended reaches the master in well under a second, not at the
holder's next interval. A trigger, so every writer notifies without a statement of its own."""

from typing import Any

from django.db import migrations

CHANNEL = "fleetshard_outbox"

CREATE = f"""
CREATE OR REPLACE FUNCTION fleetshard_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', '');
    RETURN NULL;
END $$;
CREATE TRIGGER fleetshard_outbox_notify AFTER INSERT ON shard_outboxentry
    FOR EACH STATEMENT EXECUTE FUNCTION fleetshard_outbox_notify();
CREATE TRIGGER fleetshard_hostevent_notify AFTER INSERT ON shard_hostevent
    FOR EACH STATEMENT EXECUTE FUNCTION fleetshard_outbox_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS fleetshard_outbox_notify ON shard_outboxentry;
DROP TRIGGER IF EXISTS fleetshard_hostevent_notify ON shard_hostevent;
DROP FUNCTION IF EXISTS fleetshard_outbox_notify();
"""


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("shard", "0005_shardstate_purged_runs"),
    ]

    operations = [migrations.RunPython(create, drop)]
