"""One UPDATE (or INSERT) statement for many rows with different values.

Django's bulk_update and bulk_create split into batches of 999 parameters on SQLite, so their query
count grows with the rows; the heartbeat and the results upload must not. Rows travel as one JSON
parameter and the database unpacks them, which also spares Django's per-row model and per-value
preparation (most of bulk_create's time for a result file's entries).
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


# Fields whose values JSON carries as they are (the database casts them): only the others (times,
# dates) are prepared by Django, which is most of the per-row cost when done for every value.
_AS_IS = {
    "AutoField",
    "BigAutoField",
    "BigIntegerField",
    "BooleanField",
    "CharField",
    "FloatField",
    "ForeignKey",
    "IntegerField",
    "JSONField",  # JSON inside the payload, not a JSON string of JSON
    "PositiveIntegerField",
    "SmallIntegerField",
    "TextField",
}


def _payload(columns: "list[tuple[Field[Any, Any], str]]", rows: list[dict[str, Any]], with_id: bool) -> str:
    plain = [(f.name, col) for f, col in columns if f.get_internal_type() in _AS_IS]
    prepared = [(f, col) for f, col in columns if f.get_internal_type() not in _AS_IS]
    memo: dict[tuple[str, Any], Any] = {}  # rows often share a value (a run's start)
    payload = []
    for row in rows:
        out = {col: row[name] for name, col in plain}
        for f, col in prepared:
            value = row[f.name]
            key = (col, value)
            if key not in memo:
                memo[key] = f.get_db_prep_value(value, connection)
            out[col] = memo[key]
        if with_id:
            out["id"] = row["id"]
        payload.append(out)
    return json.dumps(payload, default=_json_default)


def _pg_type(f: "Field[Any, Any]") -> str:
    return "jsonb" if f.get_internal_type() == "JSONField" else str(f.db_type(connection))


def bulk_insert(model: type[Model], rows: list[dict[str, Any]], fields: list[str]) -> int:
    """Inserts `rows` (each a dict of `fields`) in one statement; returns how many. Values must be
    set for every field (no defaults are applied) and JSON fields' values must be JSON."""
    if not rows:
        return 0
    columns = [_column(model, name) for name in fields]
    qn = connection.ops.quote_name
    names = ", ".join(qn(col) for _, col in columns)
    if connection.vendor == "postgresql":
        record = ", ".join(f"{qn(col)} {_pg_type(f)}" for f, col in columns)
        source = f"SELECT {names} FROM jsonb_to_recordset(%s::jsonb) AS v({record})"
    elif connection.vendor == "sqlite":
        picks = ", ".join(f"value ->> '$.{col}'" for _, col in columns)
        source = f"SELECT {picks} FROM json_each(%s)"
    else:  # pragma: no cover - only the two supported databases
        raise NotImplementedError(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {qn(model._meta.db_table)} ({names}) {source}", [_payload(columns, rows, False)])
        inserted: int = cursor.rowcount
        return inserted


def bulk_set(model: type[Model], rows: list[dict[str, Any]], fields: list[str]) -> int:
    """Sets `fields` on each row matched by its "id"; returns the number of rows updated."""
    if not rows:
        return 0
    meta = model._meta
    columns = [_column(model, name) for name in fields]
    qn = connection.ops.quote_name
    table = qn(meta.db_table)
    assignments = ", ".join(f"{qn(col)} = v.{qn(col)}" for _, col in columns)
    if connection.vendor == "postgresql":
        record = ", ".join([f"{qn('id')} bigint"] + [f"{qn(col)} {_pg_type(f)}" for f, col in columns])
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
        cursor.execute(sql, [_payload(columns, rows, True)])
        updated: int = cursor.rowcount
        return updated
