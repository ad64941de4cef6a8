"""The trace as docs/design.md ("Timelines") says: a process per shard, a thread per host, a slice per
interval with its job's args, counters of queued and running HQEs; streamed, gzipped for .gz."""

import gzip
import json
import threading

import pytest
from django.db import connection

from common.errors import FleetshardError, NotFound
from common.models import HostQueueEntry
from master.timeline import slices
from master.timeline.export import FLUSH_CHARS, trace_chunks, trace_events, us, write_trace
from master.timeline.query import scope
from tests.master.timeline.factories import add_run, add_state, at, host
from tests.master.timeline.validate import validate

NOW = at(3600)


@pytest.fixture
def day(fleet):
    """a1: a run, cleaning; a2: a failed run, repairing (open); b1 on lab2: a run still going."""
    runs = {
        "ok": add_run("a1", 100, 400, created=40, name="ok"),
        "bad": add_run("a2", 200, 260, created=50, name="bad", status="Failed", exit_code=3),
        "long": add_run("b1", 300, None, created=300, name="long"),
    }
    add_state("a1", "Cleaning", 400, 430)
    add_state("a2", "Repairing", 260, None)
    return runs


def _trace(tmp_path, name="t.json", **kw):
    path = tmp_path / name
    write_trace(scope(NOW, **kw), path)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _slices(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _meta(trace, name):
    return {(e["pid"], e["tid"]): e["args"] for e in trace["traceEvents"] if e["name"] == name and e["ph"] == "M"}


def test_processes_threads_slices_and_counters(tmp_path, fleet, day):
    trace = _trace(tmp_path)
    summary = validate(trace)
    assert trace["displayTimeUnit"] == "ms" and summary.slices == 5
    assert {args["name"] for args in _meta(trace, "process_name").values()} == {"lab1", "lab2"}
    assert sorted(args["sort_index"] for args in _meta(trace, "process_sort_index").values()) == [0, 1]
    threads = _meta(trace, "thread_name")
    assert threads == {
        (fleet.lab1.id, host("a1").id): {"name": "a1"},
        (fleet.lab1.id, host("a2").id): {"name": "a2"},
        (fleet.lab2.id, host("b1").id): {"name": "b1"},
    }
    bad = next(e for e in _slices(trace) if e["name"] == "bad")
    hqe = day["bad"].hqe
    assert bad["args"] == {
        "job": hqe.job_id,
        "hqe": hqe.id,
        "owner": "ana",
        "status": "Failed",
        "failure": "test",
        "exit_code": 3,
    }
    assert (bad["ts"], bad["dur"]) == (us(at(200)), 60_000_000)
    assert (bad["pid"], bad["tid"]) == (fleet.lab1.id, host("a2").id)
    by_name = {e["name"]: e for e in _slices(trace)}
    assert by_name["long"]["dur"] == us(NOW) - us(at(300))  # open: until now
    assert by_name["Repairing"]["dur"] == us(NOW) - us(at(260)) and "args" not in by_name["Repairing"]
    assert by_name["Cleaning"]["dur"] == 30_000_000
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    lab1 = [(e["ts"], e["args"]) for e in counters if e["pid"] == fleet.lab1.id]
    assert lab1[0] == (us(at(40)), {"queued": 1, "running": 0})
    assert lab1[-1] == (us(at(400)), {"queued": 0, "running": 0})
    assert max(args["running"] for _, args in lab1) == 2


@pytest.mark.parametrize("fraction", [0.0, 0.000001, 0.4995, 0.9995, 0.99998, 0.999999])
def test_a_slice_starts_and_ends_at_its_intervals_microsecond(tmp_path, fleet, fraction):
    """Whatever the fraction of a second: SQLite reads times to the millisecond, rounded, and a run ending
    at .999980 s was exported ending a second late, across the next slice of its host (CI saw it)."""
    add_run("a1", 100 + fraction, 200 + fraction, created=40, name="edge")
    (slice_,) = _slices(_trace(tmp_path))
    assert (slice_["ts"], slice_["ts"] + slice_["dur"]) == (us(at(100 + fraction)), us(at(200 + fraction)))


def test_gzipped_when_the_file_ends_gz(tmp_path, fleet, day):
    plain = _trace(tmp_path)
    assert _trace(tmp_path, "t.json.gz") == plain
    assert (tmp_path / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_filters_by_shard_label_job_and_window_clip_the_slices(tmp_path, fleet, day):
    lab2 = _trace(tmp_path, shards=["lab2"])
    assert [e["name"] for e in _slices(lab2)] == ["long"]
    assert {a["name"] for a in _meta(lab2, "process_name").values()} == {"lab2"}
    wifi = _trace(tmp_path, label="wifi")  # a1, a2 and b1 carry wifi; a3 has nothing
    assert len(_slices(wifi)) == 5
    job = _trace(tmp_path, jobs=[day["ok"].job_id])
    assert [e["name"] for e in _slices(job)] == ["ok"]
    window = _trace(tmp_path, since=at(250), until=at(410))
    validate(window)
    spans = {e["name"]: (e["ts"], e["dur"]) for e in _slices(window)}
    assert spans == {
        "ok": (us(at(250)), 150_000_000),
        "bad": (us(at(250)), 10_000_000),
        "Repairing": (us(at(260)), 150_000_000),
        "long": (us(at(300)), 110_000_000),
        "Cleaning": (us(at(400)), 10_000_000),
    }


def test_unknown_names_and_bad_windows_are_refused(fleet):
    with pytest.raises(NotFound, match="unknown shard nowhere"):
        scope(NOW, shards=["lab1", "nowhere"])
    with pytest.raises(NotFound, match="unknown label"):
        scope(NOW, label="board:zz")
    with pytest.raises(NotFound, match="unknown job 987654"):
        scope(NOW, jobs=[987654])
    with pytest.raises(FleetshardError, match="must be after since"):
        scope(NOW, since=at(10), until=at(10))


def test_an_empty_fleet_exports_an_empty_valid_trace(tmp_path, fleet):
    trace = _trace(tmp_path)
    assert validate(trace).slices == 0 and trace["traceEvents"] == []


def test_the_trace_leaves_in_pieces_not_at_once(fleet, monkeypatch):
    """A chunk holds at most one fetch of slices past the flush size: memory never holds the trace."""
    monkeypatch.setattr(slices, "CHUNK_ROWS", 50)
    for i in range(800):
        add_run("a1", i * 4, i * 4 + 2, name=f'job {i} \u00e9 "quoted"')
    chunks = list(trace_chunks(scope(NOW)))
    assert len(chunks) >= 3 and max(len(c) for c in chunks) < FLUSH_CHARS + 50 * 300
    assert validate(json.loads("".join(chunks))).slices == 800
    assert HostQueueEntry.objects.count() == 800


@pytest.mark.postgres_only(reason="needs a second connection writing while the export reads")
def test_an_interval_written_while_the_export_streams_is_not_half_in_it(fleet_committed):
    """The export reads one snapshot: a run recorded on another host mid-export was once a slice on a
    thread that had no name (its metadata already written), a trace the viewers show wrong."""
    add_run("a1", 0, 60)
    events = trace_events(scope(at(1000)))
    first = next(events)

    def record_elsewhere() -> None:
        try:
            add_run("b1", 10, 50)
        finally:
            connection.close()

    writer = threading.Thread(target=record_elsewhere)
    writer.start()
    writer.join()
    trace = {"traceEvents": [json.loads(e) for e in [first, *events]]}
    validate(trace)
    assert {e["tid"] for e in trace["traceEvents"] if e.get("cat") == "run"} == {host("a1").id}


def test_the_export_costs_a_fixed_number_of_queries_whatever_its_size(
    fleet, day, monkeypatch, django_assert_num_queries
):
    """Pinned (issue 30): the slices' fetches run ahead in a thread and both scans are fenced with
    OFFSET 0 on PostgreSQL; neither may add a query, nor may more rows. In the test's transaction the
    export's atomic blocks are savepoints: the pairs, the counters' start and buckets, the shards' and
    hosts' names, the built days it covers (none here: no pieces read), the slices (a savepoint around
    them, and on PostgreSQL `SET LOCAL jit`), the jobs' own traces. Fetches of a cursor already open
    are not queries."""
    monkeypatch.setattr(slices, "CHUNK_ROWS", 2)  # several fetches, each ahead of its consumer
    expected = 13 if connection.vendor == "postgresql" else 12
    with django_assert_num_queries(expected):
        few = "".join(trace_chunks(scope(NOW)))
    for i in range(40):
        add_run("a3", 1000 + i * 10, 1005 + i * 10, name=f"more {i}")
    with django_assert_num_queries(expected):
        many = "".join(trace_chunks(scope(NOW)))
    assert validate(json.loads(few)).slices == 5 and validate(json.loads(many)).slices == 45
