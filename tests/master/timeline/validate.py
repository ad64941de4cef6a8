"""Checks a trace the way Chrome's trace viewer and Perfetto read it (issue 12, item 4), so tests and
the bench catch a trace that would open wrong: unnamed rows, negative or non-numeric times, slices of
one thread that overlap without nesting, counters without numbers.

`Validator` takes events one by one, so a trace of millions of events is checked without holding it.
"""

import json
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

ALLOWED_PHASES = {"M", "X", "C"}
PROCESS_META = ("process_name", "process_sort_index")
THREAD_META = ("thread_name", "thread_sort_index")


class TraceInvalid(ValueError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems[:10]) + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))
        self.problems = problems


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


@dataclass
class Summary:
    slices: int = 0
    counters: int = 0
    processes: int = 0
    threads: int = 0
    # Total duration per slice name: "run" for runs, "job:NAME" for the events of jobs' own traces.
    slice_us: dict[str, float] = field(default_factory=dict)


class Validator:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.meta: set[tuple[str, int, int | None]] = set()
        self.used_pids: set[int] = set()
        self.used_threads: set[tuple[int, int]] = set()
        self.spans: dict[tuple[int, int], tuple[array[float], array[float]]] = {}
        self.summary = Summary()

    def _fail(self, message: str) -> None:
        if len(self.problems) < 1000:
            self.problems.append(message)

    def feed(self, event: Any) -> None:
        if not isinstance(event, dict):
            return self._fail(f"an event is a {type(event).__name__}, not an object")
        ph: Any = event.get("ph")
        pid: Any = event.get("pid")
        tid: Any = event.get("tid")
        if ph not in ALLOWED_PHASES:
            return self._fail(f"event {event.get('name')!r} has phase {ph!r}, not one of M, X, C")
        if not isinstance(pid, int) or (ph != "C" and not isinstance(tid, int)):
            return self._fail(f"event {event.get('name')!r} has no integer pid/tid")
        if ph == "M":
            name: Any = event.get("name")
            args = event.get("args")
            if not isinstance(args, dict):
                return self._fail(f"metadata {name!r} of pid {pid} has no args")
            if name in ("process_name", "thread_name") and not isinstance(args.get("name"), str):
                return self._fail(f"{name} of pid {pid} tid {tid} is not a string")
            if name in ("process_sort_index", "thread_sort_index") and not isinstance(args.get("sort_index"), int):
                return self._fail(f"{name} of pid {pid} tid {tid} is not an integer")
            self.meta.add((name, pid, tid if name in THREAD_META else None))
            return None
        ts: Any = event.get("ts")
        if not _number(ts):
            return self._fail(f"event {event.get('name')!r} has ts {ts!r}, not a number of microseconds")
        self.used_pids.add(pid)
        if ph == "C":
            args = event.get("args")
            if not isinstance(args, dict) or not args or not all(_number(v) for v in args.values()):
                return self._fail(f"counter {event.get('name')!r} at {ts} has non-numeric args {args!r}")
            self.summary.counters += 1
            return None
        dur: Any = event.get("dur")
        if not _number(dur) or dur < 0:
            return self._fail(f"slice {event.get('name')!r} at {ts} has dur {dur!r}: a number >= 0 is needed")
        if not isinstance(event.get("name"), str):
            return self._fail(f"slice at {ts} on pid {pid} tid {tid} has no name")
        self.used_threads.add((pid, tid))
        starts, ends = self.spans.setdefault((pid, tid), (array("d"), array("d")))
        starts.append(ts)
        ends.append(ts + dur)
        self.summary.slices += 1
        # A job's own events (cat "job") apart: a job may name one "run" or "Cleaning", and its time is
        # its run's already.
        cat = event.get("cat")
        key = "run" if cat == "run" else f"job:{event['name']}" if cat == "job" else event["name"]
        self.summary.slice_us[key] = self.summary.slice_us.get(key, 0.0) + dur
        return None

    def finish(self) -> Summary:
        for pid in sorted(self.used_pids):
            for meta in PROCESS_META:
                if (meta, pid, None) not in self.meta:
                    self._fail(f"pid {pid} has no {meta}")
        for pid, tid in sorted(self.used_threads):
            for meta in THREAD_META:
                if (meta, pid, tid) not in self.meta:
                    self._fail(f"thread {tid} of pid {pid} has no {meta}")
        for (pid, tid), (starts, ends) in self.spans.items():
            self._check_nesting(pid, tid, starts, ends)
        if self.problems:
            raise TraceInvalid(self.problems)
        self.summary.processes = len({pid for _, pid, _ in self.meta})
        self.summary.threads = len(self.used_threads)
        return self.summary

    def _check_nesting(self, pid: int, tid: int, starts: "array[float]", ends: "array[float]") -> None:
        """Slices of a thread must nest: each starts after its enclosing one and ends within it."""
        order = sorted(range(len(starts)), key=lambda i: (starts[i], -ends[i]))
        stack: list[float] = []
        for i in order:
            while stack and stack[-1] <= starts[i]:
                stack.pop()
            if stack and ends[i] > stack[-1]:
                return self._fail(
                    f"thread {tid} of pid {pid}: the slice at {starts[i]:.0f} ends at {ends[i]:.0f}, after the "
                    f"slice it starts in (ending {stack[-1]:.0f}): a partial overlap"
                )
            stack.append(ends[i])
        return None


def validate(trace: Any) -> Summary:
    """Checks a parsed trace; raises TraceInvalid naming every problem."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceInvalid(['a trace is an object with a "traceEvents" array'])
    return validate_events(trace["traceEvents"])


def validate_events(events: Iterable[Any]) -> Summary:
    validator = Validator()
    for event in events:
        validator.feed(event)
    return validator.finish()


def iter_events(stream: IO[str], chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """The events of a trace file in object form, decoded one at a time from `stream`."""
    decoder = json.JSONDecoder()
    buffer = stream.read(chunk_chars)
    head = buffer.find('"traceEvents"')
    bracket = buffer.find("[", head)
    if head < 0 or bracket < 0:
        raise TraceInvalid(['a trace is an object with a "traceEvents" array'])
    pos = bracket + 1
    while True:
        while True:
            while pos < len(buffer) and buffer[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buffer) and buffer[pos] == "]":
                return
            try:
                event, end = decoder.raw_decode(buffer, pos)
                break
            except json.JSONDecodeError:
                more = stream.read(chunk_chars)
                if not more:
                    raise TraceInvalid(["the traceEvents array is cut short"]) from None
                buffer, pos = buffer[pos:] + more, 0
        yield event
        pos = end
        if pos > chunk_chars:
            buffer, pos = buffer[pos:], 0
