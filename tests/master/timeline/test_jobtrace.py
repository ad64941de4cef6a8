"""A job's own trace.json: uploaded by its shard as hostile input, kept bounded and nested, and nested
in its run's slice in the export, shifted to the run and clipped to it."""

import json
import tracemalloc

import pytest

from common.models import HostQueueEntry
from master import services
from master.timeline.export import trace_chunks
from master.timeline.jobtrace import MAX_TRACE_BYTES, MAX_TRACE_EVENTS, TraceRejected, sanitised
from master.timeline.models import RunTrace
from master.timeline.query import scope
from tests.master.api.conftest import client_for
from tests.master.timeline.factories import add_run, add_state, at
from tests.master.timeline.validate import validate
from tests.support import assert_status

URL = "/api/v1/timeline/trace"


def x(name, ts, dur, **extra):
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": 1, **extra}


def post(client, hqe_id, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(f"{URL}?hqe={hqe_id}", data=data, content_type="application/octet-stream")


def test_only_complete_events_are_kept_relative_to_the_first_and_partial_overlaps_are_cut():
    events, dropped = sanitised(
        json.dumps(
            {
                "traceEvents": [
                    x("outer", 1000, 500, cat="setup"),
                    x("overlaps", 1400, 300),
                    {"name": "begin", "ph": "B", "ts": 1100},
                    x("bad", "soon", 1),
                    x("negative", 1200, -5),
                    x("a\x00b", 1600, 10.4),
                ]
            }
        ).encode()
    )
    assert events == [["outer", "setup", 0, 500], ["overlaps", "", 400, 100], ["a\ufffdb", "", 600, 10]]
    assert dropped == 3


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "not a Chrome trace: not valid JSON"),
        (b"[" * 40 + b"]" * 40, "nested deeper than 32"),
        (b'{"traceEvents": 3}', 'expected {"traceEvents"'),
        (b'[{"ph": "X", "ts": NaN, "dur": 1}]', "not valid JSON"),
        (json.dumps([{"ph": "B", "ts": 1}]).encode(), "no complete"),
        (json.dumps([x("e", i, 1) for i in range(MAX_TRACE_EVENTS + 1)]).encode(), "more than 10000"),
        (b" " * (MAX_TRACE_BYTES + 1), "larger than"),
    ],
)
def test_hostile_files_are_refused_with_the_reason(data, message):
    with pytest.raises(TraceRejected, match=message.replace("{", "\\{").replace("[", "\\[")):
        sanitised(data)


def test_begin_and_end_events_pair_per_thread_into_complete_ones():
    """Many tools write B/E pairs, not X events: such a trace was refused as having no complete event."""
    data = [
        {"name": "outer", "ph": "B", "ts": 100, "tid": 1},
        {"name": "other thread", "ph": "B", "ts": 310, "tid": 2},
        {"name": "inner", "ph": "B", "ts": 120, "tid": 1, "cat": "io"},
        {"ph": "E", "ts": 150, "tid": 1},
        {"ph": "E", "ts": 300, "tid": 1},
        {"ph": "E", "ts": 330, "tid": 2},
        {"name": "never ended", "ph": "B", "ts": 140, "tid": 1},
        {"ph": "E", "ts": 500, "tid": 3},
        {"name": "odd ids", "ph": "B", "ts": 160, "tid": {"a": 1}, "pid": [1]},
        {"ph": "E", "ts": 170, "tid": {"a": 1}, "pid": [1]},
    ]
    events, dropped = sanitised(json.dumps(data).encode())
    assert events == [
        ["outer", "", 0, 200],
        ["inner", "io", 20, 30],
        ["odd ids", "", 60, 10],
        ["other thread", "", 210, 20],
    ]
    assert dropped == 2


def test_a_time_of_hundreds_of_digits_is_dropped_not_an_error():
    """math.isfinite raised OverflowError on such an integer: the upload answered 500."""
    events, dropped = sanitised(b'[{"ph":"X","ts":1' + b"0" * 400 + b',"dur":1},{"ph":"X","ts":5,"dur":1}]')
    assert events == [["(unnamed)", "", 0, 1]] and dropped == 1


def test_a_stray_event_far_from_the_others_is_dropped_not_the_others():
    """Times are taken from the first event near the bulk: a stray `ts` of 0 among epoch microseconds
    once became the origin, and every real event, now decades after it, was dropped."""
    epoch_us = 1_763_856_000_000_000
    stray = [x("boot", 0, 5), x("main", epoch_us, 100), x("step", epoch_us + 10, 20), x("tail", epoch_us + 200, 1)]
    events, dropped = sanitised(json.dumps(stray).encode())
    assert events == [["main", "", 0, 100], ["step", "", 10, 20], ["tail", "", 200, 1]] and dropped == 1
    late = [x("a", 0, 5), x("b", 10, 5), x("c", 20, 5), x("later", 10**18, 1)]
    events, dropped = sanitised(json.dumps(late).encode())
    assert [e[0] for e in events] == ["a", "b", "c"] and dropped == 1


def test_a_shard_uploads_its_hqes_trace_once_and_nothing_else_gets_in(fleet):
    run = add_run("a1", 0, 60)
    shard, other = client_for(fleet.token1), client_for(fleet.token2)
    first = post(shard, run.hqe_id, [x("step", 5, 10), {"ph": "C", "ts": 1}])
    assert_status(first, 201)
    assert first.json() == {"created": True, "events": 1, "dropped": 1}
    again = post(shard, run.hqe_id, [x("other", 0, 1)])
    assert_status(again, 200)
    assert again.json()["created"] is False
    assert RunTrace.objects.get().events == [["step", "", 0, 10]]
    assert_status(post(other, run.hqe_id, [x("e", 0, 1)]), 403)
    assert post(shard, 10**9, [x("e", 0, 1)]).json()["detail"]["field"] == "hqe"
    second = add_run("a2", 0, 60)
    refused = post(shard, second.hqe_id, b"not json")
    assert_status(refused, 400)
    assert refused.json()["error"].startswith("trace.json: not a Chrome trace")
    assert_status(post(shard, second.hqe_id, b" " * (MAX_TRACE_BYTES + 1)), 413)
    person = client_for(services.create_personal_token("boss", admin=True, acting_user=None)[1])
    assert_status(post(person, second.hqe_id, [x("e", 0, 1)]), 403)
    assert RunTrace.objects.count() == 1


def test_the_export_nests_a_jobs_events_in_its_run_shifted_and_clipped(fleet):
    run = add_run("a1", 100, 160)
    add_state("a1", "Cleaning", 160, 190)
    data = [x("setup", 7_000_000, 10_000_000), x("test", 8_000_000, 2_000_000), x("late", 60_000_000, 9_000_000)]
    RunTrace.objects.create(
        hqe=HostQueueEntry.objects.get(id=run.hqe_id), events=sanitised(json.dumps(data).encode())[0]
    )
    trace = json.loads("".join(trace_chunks(scope(at(1000)))))
    summary = validate(trace)
    jobs = {e["name"]: (e["ts"], e["dur"]) for e in trace["traceEvents"] if e.get("cat") == "job"}
    start = int(at(100).timestamp() * 1e6)
    assert jobs == {
        "setup": (start, 10_000_000),
        "test": (start + 1_000_000, 2_000_000),
        "late": (start + 53_000_000, 7_000_000),
    }
    assert summary.slice_us["run"] == 60_000_000
    clipped = json.loads("".join(trace_chunks(scope(at(1000), since=at(105), until=at(150)))))
    validate(clipped)
    assert {e["name"]: e["dur"] for e in clipped["traceEvents"] if e.get("cat") == "job"} == {"setup": 5_000_000}


def test_the_export_holds_a_few_jobs_traces_in_memory_at_a_time(fleet):
    """A trace may hold MAX_TRACE_EVENTS long-named events (about 5 MB as Python lists): read a hundred
    at a time, a hundred of them took 500 MB of the export's memory. A quarter of that size here."""
    events = [[f"{i:05d}" + "x" * 195, "c" * 64, i, 1] for i in range(MAX_TRACE_EVENTS // 4)]
    runs = [add_run("a1", 10 * n, 10 * n + 5) for n in range(20)]
    RunTrace.objects.bulk_create([RunTrace(hqe_id=run.hqe_id, events=events) for run in runs])
    del events
    tracemalloc.start()
    try:
        written = sum(len(chunk) for chunk in trace_chunks(scope(at(1000))))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert written > 20 * MAX_TRACE_EVENTS // 4 * 200
    assert peak < 10_000_000, f"peak {peak / 1e6:.0f} MB"
