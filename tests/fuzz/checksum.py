"""A checksum of the whole shared data model, to prove that a refused request changed nothing."""

import hashlib

from django.db import connection


def fleet_tables() -> list[str]:
    """The tables of fleetshard's own apps (common, master, shard), not Django's."""
    with connection.cursor() as cursor:
        names = connection.introspection.table_names(cursor)
        return sorted(t for t in names if t.startswith(("common_", "master_", "shard_")))


BOOKKEEPING = {("master_token", "last_used")}


def database_checksum() -> str:
    """SHA-256 over every row of every fleetshard table, by primary key: equal before and after means unchanged.

    A token's `last_used` is left out: it records that a request came (at most once in 5 minutes), even
    one that was refused for its content.
    """
    digest = hashlib.sha256()
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table in fleet_tables():
            columns = [
                c.name
                for c in connection.introspection.get_table_description(cursor, table)
                if (table, c.name) not in BOOKKEEPING
            ]
            # By the primary key, which is not always `id` (shard_hoststate's is its host); SQLite would
            # take an unknown quoted "id" for a string and order nothing.
            key = connection.introspection.get_primary_key_columns(cursor, table) or columns
            cursor.execute(f"SELECT {', '.join(map(qn, columns))} FROM {qn(table)} ORDER BY {', '.join(map(qn, key))}")
            digest.update(table.encode())
            for row in cursor.fetchall():
                digest.update(repr(row).encode())
    return digest.hexdigest()
