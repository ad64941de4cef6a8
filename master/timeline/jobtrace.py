"""A job's own Chrome trace (`trace.json` in its results directory), taken as hostile input: bounded in
bytes, events and nesting, text cleaned, and reduced to what the export nests in the run's slice.

Only complete events (`"ph": "X"`, or a thread's `B` and `E` events paired like brackets) with
numeric, finite `ts` and `dur >= 0` are kept; their times become whole microseconds from the trace's
first event, and events that partially overlap the one they start in are cut to end with it, so
whatever the job wrote, the slices nest as a trace viewer needs.
"""

import math
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from common.errors import NotFound
from common.models import HostQueueEntry
from common.wire import MAX_DEPTH, WireError, clean_text, loads
from master.services.hqe_guard import hold_hqe
from master.timeline.models import RunTrace

MAX_TRACE_BYTES = 4 * 1024 * 1024
MAX_TRACE_EVENTS = 10_000
MAX_NAME_CHARS = 200
MAX_CATEGORY_CHARS = 64
# About 115 days in microseconds: a longer span is no run's.
MAX_SPAN_US = 10**13


class TraceRejected(ValueError):
    """The file is no Chrome trace the export could use; the message says why."""


@dataclass(frozen=True)
class Stored:
    trace: RunTrace
    created: bool


def _number(value: object) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer of hundreds of digits
        return False


def _key(value: object) -> object:
    """A pid or tid as a dict key (a job may write any JSON there)."""
    return value if isinstance(value, int | float | str) else None


def _text(value: object, limit: int) -> str:
    return clean_text(value[:limit]) if isinstance(value, str) else ""


def sanitised(data: bytes) -> tuple[list[list[Any]], int]:
    """The events to keep ([name, category, ts_us, dur_us], by ts) and how many were dropped."""
    if len(data) > MAX_TRACE_BYTES:
        raise TraceRejected(f"larger than {MAX_TRACE_BYTES} bytes")
    try:
        parsed = loads(data)
    except WireError as exc:
        raise TraceRejected(f"not a Chrome trace: {exc.message}") from None
    raw = parsed.get("traceEvents") if isinstance(parsed, dict) else parsed
    if not isinstance(raw, list):
        raise TraceRejected('not a Chrome trace: expected {"traceEvents": [...]} or an array of events')
    # (ts, dur, name, cat, how many of the file's events it stands for: a B/E pair is two)
    kept: list[tuple[float, float, str, str, int]] = []
    begun: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in raw:
        if not isinstance(event, dict):
            continue
        ph: Any = event.get("ph")
        ts: Any = event.get("ts")
        dur: Any = event.get("dur", 0)
        weight = 1
        if ph in ("B", "E"):
            # Begin and end events of one thread pair up like brackets into one complete event.
            thread = (_key(event.get("pid")), _key(event.get("tid")))
            if ph == "B":
                if _number(ts):
                    begun.setdefault(thread, []).append(event)
                continue
            opened = begun.get(thread)
            if not opened or not _number(ts):
                continue
            event = opened.pop()
            dur, ts, weight = ts - event["ts"], event["ts"], 2
        elif ph != "X":
            continue
        if not _number(ts) or not _number(dur) or dur < 0 or abs(ts) > 1e18 or dur > MAX_SPAN_US:
            continue
        name = _text(event.get("name"), MAX_NAME_CHARS) or "(unnamed)"
        kept.append((float(ts), float(dur), name, _text(event.get("cat"), MAX_CATEGORY_CHARS), weight))
        if len(kept) > MAX_TRACE_EVENTS:
            raise TraceRejected(f"more than {MAX_TRACE_EVENTS} complete events")
    if not kept:
        raise TraceRejected('no complete ("ph": "X") event or B/E pair with a numeric ts and a dur >= 0')
    # The first event near the bulk of them: one stray event (a `ts` of 0 among epoch microseconds)
    # would otherwise push every other one past MAX_SPAN_US, and only the stray would be kept.
    starts = sorted(ts for ts, *_ in kept)
    median = starts[len(starts) // 2]
    origin = next(ts for ts in starts if ts >= median - MAX_SPAN_US)
    spans = sorted(
        ((round(ts - origin), round(dur), name, cat, weight) for ts, dur, name, cat, weight in kept),
        key=lambda e: (e[0], -e[1]),
    )
    events: list[list[Any]] = []
    stack: list[int] = []
    represented = 0
    for start, dur, name, cat, weight in spans:
        if start < 0 or start > MAX_SPAN_US:
            continue
        end = start + dur
        while stack and stack[-1] <= start:
            stack.pop()
        if stack and end > stack[-1]:
            end = stack[-1]  # a partial overlap: cut to end with the slice it starts in
        if len(stack) >= MAX_DEPTH:
            continue
        stack.append(end)
        events.append([name, cat, start, end - start])
        represented += weight
    return events, len(raw) - represented


@transaction.atomic
def store_run_trace(hqe: HostQueueEntry, data: bytes) -> Stored:
    """Stores the HQE's trace once: a second upload (a retry after a lost answer) changes nothing.

    Raises TraceRejected (nothing stored) for a file the export could not use, NotFound when the HQE
    is gone (purged) by now."""
    if not hold_hqe(hqe.id):
        raise NotFound(f"hqe: unknown HQE {hqe.id}", field="hqe")
    existing = RunTrace.objects.filter(hqe=hqe).first()
    if existing is not None:
        return Stored(existing, False)
    events, dropped = sanitised(data)
    try:
        with transaction.atomic():
            return Stored(RunTrace.objects.create(hqe=hqe, events=events, dropped=dropped), True)
    except IntegrityError:
        return Stored(RunTrace.objects.get(hqe=hqe), False)
