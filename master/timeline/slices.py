"""Each slice's Chrome trace JSON text, written by the database (docs/design.md, "Timelines"): the
export streams it, and master.timeline.days builds closed days of it once."""

from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, suppress
from typing import Any

from django.db import connection, transaction
from django.db.models import BigIntegerField, F, Func

from master.timeline.query import sqlite_micros

CHUNK_ROWS = 5000
NO_SHARD = 0  # the pid of intervals whose shard was deleted


def _quoted(sql: str) -> str:
    """A JSON string literal of a text column, made by the database."""
    return f"to_json(({sql})::text)::text" if connection.vendor == "postgresql" else f"json_quote({sql})"


def _text(sql: str) -> str:
    return f"COALESCE(CAST({sql} AS TEXT), 'null')"


def slice_texts(rows: Any, *, batched: bool = False) -> Iterator[str]:
    """Each slice's JSON text, written by the database: formatting a million rows in Python would
    take longer than reading them. `batched`: each fetch's slices joined by commas, as one text."""
    inner = rows.order_by().values(
        k=F("kind"),
        p=F("shard_id"),
        t=F("host_id"),
        j=F("job_id"),
        q=F("hqe_id"),
        ts=Micros(F("clip_start")),
        te=Micros(F("clip_end")),
        nm=F("job__name"),
        ow=F("job__owner"),
        st=F("hqe__status"),
        fl=F("hqe__failure"),
        ec=F("hqe__exit_code"),
    )
    sql, params = inner.query.sql_with_params()
    common = (
        f"""',"ph":"X","pid":' || COALESCE(p, {NO_SHARD}) || ',"tid":' || t || ',"ts":' || ts || ',"dur":' || """
        "(CASE WHEN te > ts THEN te - ts ELSE 0 END)"
    )
    name = _quoted("COALESCE(nm, 'job ' || j, 'run')")  # a run's job, its id once deleted
    line = (
        f"""CASE WHEN k = 'run' THEN '{{"name":' || {name} || ',"cat":"run"' || """
        f"""{common} || ',"args":{{"job":' || {_text("j")} || ',"hqe":' || {_text("q")} || """
        f"""',"owner":' || {_quoted("COALESCE(ow, '')")} || ',"status":' || {_quoted("COALESCE(st, '')")} || """
        f"""',"failure":' || {_quoted("COALESCE(fl, '')")} || ',"exit_code":' || {_text("ec")} || '}}}}' """
        f"""ELSE '{{"name":' || {_quoted("k")} || ',"cat":"host"' || {common} || '}}' END"""
    )
    # In a transaction, PostgreSQL streams a server-side cursor; outside one (WITH HOLD) it would
    # first store the whole result. Unsorted: viewers sort, and sorting a million rows doubled the time.
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as setup:
                setup.execute("SET LOCAL jit = off")  # compiling costs more than it saves on one scan
        # OFFSET 0 keeps PostgreSQL from inlining the subquery, which computed each time and
        # duration three times over (in the line, the comparison and the difference): a third of its work.
        fence = " OFFSET 0" if connection.vendor == "postgresql" else ""
        cursor = connection.chunked_cursor()
        try:
            cursor.execute(f"SELECT {line} FROM ({sql}{fence}) AS i", params)
            # Closed before the cursor, whatever ends the export: its fetch must be over first.
            with closing(_fetched_ahead(cursor)) as batches:
                for batch in batches:
                    if batched:
                        yield ",".join([text for (text,) in batch])
                    else:
                        for (text,) in batch:
                            yield text
        finally:
            cursor.close()


def _fetched_ahead(cursor: Any) -> Generator[list[tuple[Any, ...]], None, None]:
    """The cursor's rows a fetch at a time, the next fetch already under way in a thread while the
    caller handles this one: the database formats the next rows while this process compresses and
    sends the last (the driver and zlib both let go of the GIL), instead of each waiting on the other.
    The thread uses the export's cursor, not a connection of its own (serve's connection budget
    holds). Ends no earlier than its fetch, so the cursor is never closed or reused under it."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="timeline-fetch") as ahead:
        pending = ahead.submit(cursor.fetchmany, CHUNK_ROWS)
        try:
            while batch := pending.result():
                pending = ahead.submit(cursor.fetchmany, CHUNK_ROWS)
                yield batch
        finally:
            with suppress(Exception):
                pending.result()  # a fetch left running when the reader went away or an error came


class Micros(Func):
    """A time as integer microseconds since the epoch."""

    output_field = BigIntegerField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="round(date_part('epoch', %(expressions)s) * 1000000)::bigint"
        )

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.get_source_expressions()[0])
        return sqlite_micros(sql), [*params, *params]
