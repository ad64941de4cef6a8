"""The validator refuses what a trace viewer would show wrong, and reads big files event by event."""

import io
import json

import pytest

from tests.master.timeline.validate import TraceInvalid, iter_events, validate


def _named(*events):
    meta = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "lab1"}},
        {"name": "process_sort_index", "ph": "M", "pid": 1, "tid": 0, "args": {"sort_index": 0}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 7, "args": {"name": "a1"}},
        {"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": 7, "args": {"sort_index": 0}},
    ]
    return {"traceEvents": meta + list(events), "displayTimeUnit": "ms"}


def x(ts, dur, name="job", tid=7):
    return {"name": name, "ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_a_well_formed_trace_passes_with_nested_slices_and_counters():
    summary = validate(
        _named(
            x(0, 100),
            x(10, 20, "inner"),
            x(100, 5),
            {"name": "HQEs", "ph": "C", "pid": 1, "ts": 0, "args": {"queued": 2, "running": 1.0}},
        )
    )
    assert (summary.slices, summary.counters, summary.threads) == (3, 1, 1)
    assert summary.slice_us == {"job": 105, "inner": 20}


def test_a_jobs_own_events_named_like_the_fleets_slices_are_totalled_apart():
    run = {**x(0, 100, "smoke"), "cat": "run"}
    state = {**x(100, 50, "Cleaning"), "cat": "host"}
    nested = [{**x(10, 30, "run"), "cat": "job"}, {**x(40, 20, "Cleaning"), "cat": "job"}]
    summary = validate(_named(run, state, *nested))
    assert summary.slice_us == {"run": 100, "Cleaning": 50, "job:run": 30, "job:Cleaning": 20}


@pytest.mark.parametrize(
    ("trace", "problem"),
    [
        ([], "an object with a"),
        ({"traceEvents": {}}, "an object with a"),
        (_named(x(0, 10), x(5, 10)), "partial overlap"),
        (_named(x(0, -1)), "dur -1"),
        (_named(x("0", 1)), "ts '0'"),
        (_named(x(0, True)), "dur True"),
        (_named(x(0, 1, tid=8)), "thread 8 of pid 1 has no thread_name"),
        (_named({**x(0, 1), "pid": 2}), "pid 2 has no process_name"),
        (_named({"name": "HQEs", "ph": "C", "pid": 1, "ts": 0, "args": {"queued": "2"}}), "non-numeric args"),
        (_named({"name": "b", "ph": "B", "pid": 1, "tid": 7, "ts": 0}), "phase 'B'"),
    ],
)
def test_what_a_viewer_would_show_wrong_is_refused(trace, problem):
    with pytest.raises(TraceInvalid, match=problem):
        validate(trace)


def test_events_are_read_one_at_a_time_across_chunk_boundaries():
    trace = _named(*(x(i * 10, 5, name="n" * (i % 13)) for i in range(500)))
    events = list(iter_events(io.StringIO(json.dumps(trace)), chunk_chars=97))
    assert events == trace["traceEvents"]
    with pytest.raises(TraceInvalid, match="cut short"):
        list(iter_events(io.StringIO(json.dumps(trace)[:-40]), chunk_chars=97))
