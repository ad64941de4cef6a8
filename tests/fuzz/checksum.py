"""A checksum of the whole shared data model, to prove that a refused request changed nothing."""

import hashlib

from django.db import connection


def common_tables() -> list[str]:
    with connection.cursor() as cursor:
        return sorted(t for t in connection.introspection.table_names(cursor) if t.startswith("common_"))


def database_checksum() -> str:
    """SHA-256 over every row of every common_* table, ordered by id: equal before and after means unchanged."""
    digest = hashlib.sha256()
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table in common_tables():
            cursor.execute(f"SELECT * FROM {qn(table)} ORDER BY {qn('id')}")
            digest.update(table.encode())
            for row in cursor.fetchall():
                digest.update(repr(row).encode())
    return digest.hexdigest()
