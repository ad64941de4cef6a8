"""One UPDATE statement for many rows with different values.

Django's bulk_update splits into batches of 999 parameters on SQLite, so its query count grows with
the rows; the heartbeat must not. Rows travel as one JSON parameter and the database unpacks them.
"""

import json
from datetime import date, datetime
from typing import Any

from django.db import connection
from django.db.models import Field, Model


def _json_default(value: object) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"cannot send {type(value).__name__} to bulk_set")


def _column(model: type[Model], name: str) -> "tuple[Field[Any, Any], str]":
    """A field and its column: get_field also answers for reverse relations, which have no column."""
    field = model._meta.get_field(name)
    if not isinstance(field, Field) or field.column is None:
        raise ValueError(f"{model.__name__}.{name} is not a column bulk_set can write")
    return field, field.column


def bulk_set(model: type[Model], rows: list[dict[str, Any]], fields: list[str]) -> int:
    """Sets `fields` on each row matched by its "id"; returns the number of rows updated."""
    if not rows:
        return 0
    meta = model._meta
    columns = [_column(model, name) for name in fields]
    payload = [
        {"id": row["id"], **{col: f.get_db_prep_value(row[f.name], connection) for f, col in columns}} for row in rows
    ]
    qn = connection.ops.quote_name
    table = qn(meta.db_table)
    assignments = ", ".join(f"{qn(col)} = v.{qn(col)}" for _, col in columns)
    if connection.vendor == "postgresql":
        record = ", ".join([f"{qn('id')} bigint"] + [f"{qn(col)} {f.db_type(connection)}" for f, col in columns])
        sql = (
            f"UPDATE {table} SET {assignments} FROM jsonb_to_recordset(%s::jsonb) AS v({record}) "
            f"WHERE {table}.{qn('id')} = v.{qn('id')}"
        )
    elif connection.vendor == "sqlite":
        picks = ", ".join(
            [f"value ->> '$.id' AS {qn('id')}"] + [f"value ->> '$.{col}' AS {qn(col)}" for _, col in columns]
        )
        sql = (
            f"UPDATE {table} SET {assignments} FROM (SELECT {picks} FROM json_each(%s)) AS v "
            f"WHERE {table}.{qn('id')} = v.{qn('id')}"
        )
    else:  # pragma: no cover - only the two supported databases
        raise NotImplementedError(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(sql, [json.dumps(payload, default=_json_default)])
        updated: int = cursor.rowcount
        return updated
