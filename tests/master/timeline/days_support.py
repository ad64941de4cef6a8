"""What the tests of built days share: the export read whole against the export with built days, and
a writer or builder on a connection of its own."""

import gzip
import json
import subprocess
import threading
import zlib
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from master.timeline import days
from master.timeline.export import gzipped, trace_chunks, trace_events, trace_pieces
from master.timeline.query import Scope


def builder_an_hour_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder's two clocks, the app's and its reading of the database's, an hour (days.COOL) on
    from the real ones: yesterday has cooled at any hour of the test's day, the first after midnight
    too. The triggers keep the database's own clock, so what they call today is still today."""
    database_now = days.database_now
    monkeypatch.setattr(days, "database_now", lambda: database_now() + days.COOL)
    monkeypatch.setattr(days, "timezone", SimpleNamespace(now=lambda: timezone.now() + days.COOL))


def events_read_whole(s: Scope) -> list[str]:
    """The trace's events as an export reading every interval writes them, in a stable order."""
    return sorted(json.dumps(json.loads(e), sort_keys=True) for e in trace_events(s))


def events_of(trace: dict[str, Any]) -> list[str]:
    return sorted(json.dumps(e, sort_keys=True) for e in trace["traceEvents"])


def exported_gzipped(s: Scope) -> dict[str, Any]:
    """The gzipped export, checked to be one gzip member that zlib, Python's gzip and `gzip -t` read."""
    data = b"".join(gzipped(trace_pieces(s)))
    reader = zlib.decompressobj(31)
    text = reader.decompress(data)
    assert reader.eof and reader.unused_data == b"", "one gzip member, nothing after it"
    assert gzip.decompress(data) == text
    assert subprocess.run(["gzip", "-t"], input=data).returncode == 0
    return dict(json.loads(text))


def exported_json(s: Scope) -> dict[str, Any]:
    return dict(json.loads("".join(trace_chunks(s))))


def assert_same(s: Scope) -> None:
    whole = events_read_whole(s)
    assert events_of(exported_gzipped(s)) == whole
    assert events_of(exported_json(s)) == whole


def in_thread(target: Any, *args: Any) -> tuple[threading.Thread, list[BaseException]]:
    """Runs `target` in a thread on a connection of its own; returns the thread and what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target(*args)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors
