"""Whether this role's database is migrated: `serve` and `run_shard` refuse to start on one that is not.

Each role has its own tables (server/settings/), so a database not migrated since an upgrade, or one of
the other role, fails on every request or heartbeat ("no such table") rather than once, clearly, here.
"""

import logging

from django.conf import settings
from django.core.management.base import CommandError
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

log = logging.getLogger(__name__)


def pending_migrations() -> list[tuple[str, str]]:
    """(app, migration) of each migration this role's code has that its database has not; raises
    DatabaseError when the database cannot be asked."""
    executor = MigrationExecutor(connection)
    return [
        (migration.app_label, migration.name)
        for migration, _ in executor.migration_plan(executor.loader.graph.leaf_nodes())
    ]


def check_migrated() -> None:
    """Raises when migrations are pending. A database not reachable yet is no reason to refuse: both
    commands wait for it and retry, as they always did."""
    try:
        pending = pending_migrations()
    except DatabaseError as exc:
        log.warning("cannot check the database's migrations now (%s); starting anyway", exc)
        connection.close()
        return
    if pending:
        app, name = pending[0]
        raise CommandError(
            f"the database is not migrated for the {settings.ROLE} ({len(pending)} migrations pending, first "
            f"{app}.{name}): run `FLEETSHARD_ROLE={settings.ROLE} python manage.py migrate`, "
            "and check that DATABASE_URL names this role's database, not the other role's"
        )
