"""The export in Perfetto's protobuf format: the same processes, threads, slices and counters as the
Chrome trace, read back with the perfetto package's own Trace message."""

import json

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

from common.models import HostQueueEntry
from master.timeline.export import trace_chunks
from master.timeline.jobtrace import sanitised
from master.timeline.models import RunTrace
from master.timeline.pftrace import pftrace_chunks
from master.timeline.query import scope
from tests.master.timeline.factories import add_run, add_state, at


def test_pftrace_holds_what_the_chrome_trace_holds(fleet):
    run = add_run("a1", 0, 60, created=0, name="smoke")
    add_state("a1", "Repairing", 60, 90)
    add_run("b1", 10, 20, created=5, name="other")
    job_events = sanitised(json.dumps([{"name": "step", "ph": "X", "ts": 0, "dur": 1_000_000}]).encode())[0]
    RunTrace.objects.create(hqe=HostQueueEntry.objects.get(id=run.hqe_id), events=job_events)
    s = scope(at(3600))
    chrome = json.loads("".join(trace_chunks(s)))["traceEvents"]
    trace = Trace.FromString(b"".join(pftrace_chunks(s)))
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}
    processes = sorted(t.process.process_name for t in tracks.values() if t.HasField("process"))
    threads = sorted(t.thread.thread_name for t in tracks.values() if t.HasField("thread"))
    assert processes == ["lab1", "lab2"] and threads == ["a1", "b1"]
    begins = [p for p in trace.packet if p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN]
    ends = [p for p in trace.packet if p.track_event.type == TrackEvent.TYPE_SLICE_END]
    slices = sorted((e["name"], e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in chrome if e["ph"] == "X")
    assert sorted((b.track_event.name, b.timestamp, e.timestamp) for b, e in zip(begins, ends, strict=True)) == slices
    assert {b.track_event.name for b in begins} == {"smoke", "other", "Repairing", "step"}
    smoke = next(b for b in begins if b.track_event.name == "smoke")
    assert {a.name for a in smoke.track_event.debug_annotations} >= {"job", "hqe", "owner", "status"}
    assert tracks[smoke.track_event.track_uuid].thread.thread_name == "a1"
    counters = [p for p in trace.packet if p.track_event.type == TrackEvent.TYPE_COUNTER]
    assert len(counters) == 2 * sum(1 for e in chrome if e["ph"] == "C")
    assert all(p.trusted_packet_sequence_id == 1 for p in trace.packet)
