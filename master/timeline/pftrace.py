"""The export in Perfetto's native protobuf format (`.pftrace`), built with the `perfetto` package's
trace builder from the same events as the Chrome trace: a process track per shard, a thread track per
host, a slice (begin and end) per interval and per event of a job's own trace, counter tracks for the
queued and running HQEs. Streamed: each packet leaves as it is made.
"""

import json
from collections.abc import Iterator
from typing import IO, Any

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackEvent
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from master.timeline.export import cut_event, trace_events
from master.timeline.limits import Deadline
from master.timeline.query import Scope

SEQUENCE = 1
FLUSH_BYTES = 1 << 16
_COUNTER_BASE = 1 << 40  # counter tracks' uuids, apart from the processes' and threads'


class _Sink:
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)

    def take(self) -> bytes:
        data, self.parts, self.size = b"".join(self.parts), [], 0
        return data


def _process_uuid(pid: int) -> int:
    return 1 + pid * 2


def _thread_uuid(tid: int) -> int:
    return 2 + tid * 2


class _Builder:
    def __init__(self, out: IO[bytes] | _Sink) -> None:
        self.builder = StreamingTraceProtoBuilder(out)
        self.counters: dict[tuple[int, str], int] = {}
        self.first = True

    def _packet(self) -> TracePacket:
        packet = self.builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE
        if self.first:
            packet.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        return packet

    def feed(self, event: dict[str, Any]) -> None:
        ph, pid = event.get("ph"), event.get("pid", 0)
        if ph == "M":
            self._metadata(event, pid)
        elif ph == "X":
            self._slice(event, pid)
        elif ph == "C":
            self._counters(event, pid)

    def _metadata(self, event: dict[str, Any], pid: int) -> None:
        args = event.get("args", {})
        if event["name"] == "process_name":
            packet = self._packet()
            packet.track_descriptor.uuid = _process_uuid(pid)
            packet.track_descriptor.process.pid = pid
            packet.track_descriptor.process.process_name = args["name"]
            self.builder.write_packet(packet)
        elif event["name"] == "thread_name":
            packet = self._packet()
            packet.track_descriptor.uuid = _thread_uuid(event["tid"])
            packet.track_descriptor.parent_uuid = _process_uuid(pid)
            packet.track_descriptor.thread.pid = pid
            packet.track_descriptor.thread.tid = event["tid"]
            packet.track_descriptor.thread.thread_name = args["name"]
            self.builder.write_packet(packet)

    def _slice(self, event: dict[str, Any], pid: int) -> None:
        track = _thread_uuid(event["tid"])
        begin = self._packet()
        begin.timestamp = int(event["ts"]) * 1000
        begin.track_event.type = TrackEvent.TYPE_SLICE_BEGIN
        begin.track_event.track_uuid = track
        begin.track_event.name = event["name"]
        if event.get("cat"):
            begin.track_event.categories.append(event["cat"])
        for key, value in (event.get("args") or {}).items():
            note = begin.track_event.debug_annotations.add()
            note.name = key
            if isinstance(value, bool) or value is None:
                note.string_value = json.dumps(value)
            elif isinstance(value, int):
                note.int_value = value
            else:
                note.string_value = str(value)
        self.builder.write_packet(begin)
        end = self._packet()
        end.timestamp = (int(event["ts"]) + int(event["dur"])) * 1000
        end.track_event.type = TrackEvent.TYPE_SLICE_END
        end.track_event.track_uuid = track
        self.builder.write_packet(end)

    def _counters(self, event: dict[str, Any], pid: int) -> None:
        for key, value in sorted((event.get("args") or {}).items()):
            track = self.counters.get((pid, key))
            if track is None:
                track = self.counters[(pid, key)] = _COUNTER_BASE + len(self.counters)
                packet = self._packet()
                packet.track_descriptor.uuid = track
                packet.track_descriptor.parent_uuid = _process_uuid(pid)
                packet.track_descriptor.name = f"{event['name']} {key}"
                packet.track_descriptor.counter.SetInParent()
                self.builder.write_packet(packet)
            packet = self._packet()
            packet.timestamp = int(event["ts"]) * 1000
            packet.track_event.type = TrackEvent.TYPE_COUNTER
            packet.track_event.track_uuid = track
            packet.track_event.counter_value = int(value)
            self.builder.write_packet(packet)


def pftrace_chunks(s: Scope, deadline: Deadline | None = None) -> Iterator[bytes]:
    """The trace as Perfetto protobuf bytes, chunk by chunk; joined, one `Trace` message. Past
    `deadline` it ends early, with a process named for the reason (as the Chrome trace does)."""
    sink = _Sink()
    builder = _Builder(sink)

    def pack(text: str) -> list[bytes]:
        builder.feed(json.loads(text))
        return [sink.take()] if sink.size >= FLUSH_BYTES else []

    cut = yield from (deadline or Deadline.never()).chunks(trace_events(s), pack)
    if cut:
        for event in json.loads(f"[{cut_event(cut)}]"):
            builder.feed(event)
    yield sink.take()
