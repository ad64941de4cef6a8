"""What the tests of built days share: the export read whole against the export with built days, and
a writer or builder on a connection of its own."""

import gzip
import json
import subprocess
import threading
import zlib
from typing import Any

from django.db import connection

from master.timeline.export import gzipped, trace_chunks, trace_events, trace_pieces
from master.timeline.query import Scope


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
