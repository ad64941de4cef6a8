"""TensorFlow's `TestResults` JSON (tensorflow/core/util/test_log.proto, written as proto-JSON).

Proto-JSON writes int64 fields as strings ("iters": "100", "startTime": "1700000000") and leaves out
fields at their default, so a missing `wallTime` means "not measured" here (None), never 0.
"""

from datetime import UTC, datetime
from typing import Any

from common.result_formats.records import (
    MAX_ENTRIES,
    MAX_INT,
    ParsedEntry,
    ParsedRun,
    Reader,
    clean_info,
)
from common.wire import MAX_NAME_CHARS

FORMAT = "tensorflow"
_INF = float("inf")
_OWN_FIELDS = ("name", "startTime", "entries")


def looks_like(doc: dict[str, Any]) -> bool:
    return "entries" in doc and "benchmarks" not in doc


def parse(doc: dict[str, Any], r: Reader) -> ParsedRun:
    # `name` is the test; old writers only set `target` (the build target), which names it as well.
    if doc.get("name") not in (None, ""):
        test = r.name(doc["name"], "name")
    elif "target" in doc:
        test = r.name(doc["target"], "target")
    else:
        raise r.fail("name", "required")
    if "startTime" not in doc:
        raise r.fail("startTime", "required")
    seconds = r.number(doc["startTime"], "startTime", strings=True)
    try:
        start = datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        raise r.fail("startTime", f"not a time: {seconds!r}") from None
    start = r.start(start, "startTime")
    entries_obj = r.obj(doc["entries"], "entries")
    raw = r.items(entries_obj.get("entry", []), "entries.entry", MAX_ENTRIES)
    entries = tuple(
        _plain_entry(item, r) or _entry(r.obj(item, f"entries.entry[{i}]"), f"entries.entry[{i}]", r)
        for i, item in enumerate(raw)
    )
    _names_once(entries, "entries.entry", r)
    info = clean_info({k: v for k, v in doc.items() if k not in _OWN_FIELDS})
    return ParsedRun(test=test, start=start, info=info, entries=entries, format=FORMAT)


_PLAIN_KEYS = frozenset({"name", "wallTime", "cpuTime", "throughput", "iters"})


def _plain_entry(e: object, r: Reader) -> ParsedEntry | None:
    """The usual entry read quickly: only a name, times as JSON numbers and `iters` as a JSON integer
    or string of digits, each already within the rules `_entry` applies (a name within bounds, times
    finite and not negative, iterations from 0 to MAX_INT). None for anything else, which `_entry`
    then reads (and refuses, naming the field) as ever; for what it takes, it returns what `_entry`
    would."""
    if type(e) is not dict or not _PLAIN_KEYS.issuperset(e) or not r.plain:
        return None
    name = e.get("name")
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_CHARS or not name.strip():
        return None
    times: list[float | None] = []
    for key in ("wallTime", "cpuTime", "throughput"):
        value = e.get(key)
        if value is None:
            times.append(None)
        elif type(value) is float and 0.0 <= value < _INF:
            times.append(value)
        else:
            return None
    iters = e.get("iters")
    if type(iters) is str and 0 < len(iters) <= 20 and iters.isascii() and iters.isdigit():
        iters = int(iters)
    if not (iters is None or (type(iters) is int and 0 <= iters <= MAX_INT)):
        return None
    return ParsedEntry(name, times[0], times[1], iters, times[2])


def _entry(e: dict[str, Any], path: str, r: Reader) -> ParsedEntry:
    def optional_number(key: str) -> float | None:
        return None if e.get(key) is None else r.number(e[key], f"{path}.{key}", strings=True)

    if "name" not in e:
        raise r.fail(f"{path}.name", "required")
    extras: dict[str, float | str] = {}
    extras_obj = r.obj(e.get("extras", {}), f"{path}.extras")
    for key, value in extras_obj.items():
        at = f"{path}.extras.{key}"
        key = r.extras_key(key, at, extras)
        value = r.obj(value, at)
        if "doubleValue" in value:
            extras[key] = r.number(value["doubleValue"], f"{at}.doubleValue", negative=True, strings=True)
        elif "stringValue" in value:
            extras[key] = r.text(value["stringValue"], f"{at}.stringValue")
        elif not value:
            extras[key] = 0.0  # proto-JSON leaves out a doubleValue of 0
        else:
            raise r.fail(at, 'expected {"doubleValue": x} or {"stringValue": s}')
    for i, metric in enumerate(r.items(e.get("metrics", []), f"{path}.metrics", 100)):
        at = f"{path}.metrics[{i}]"
        metric = r.obj(metric, at)
        key = r.extras_key(f"metrics.{r.name(metric.get('name'), f'{at}.name')}", f"{at}.name", extras)
        extras[key] = r.number(metric.get("value", 0), f"{at}.value", negative=True, strings=True)
    iters = e.get("iters")
    return ParsedEntry(
        name=r.name(e["name"], f"{path}.name"),
        wall_time_s=optional_number("wallTime"),
        cpu_time_s=optional_number("cpuTime"),
        iterations=None if iters is None else r.count(iters, f"{path}.iters", strings=True),
        throughput=optional_number("throughput"),
        extras=extras,
    )


def _names_once(entries: tuple[ParsedEntry, ...], path: str, r: Reader) -> None:
    """Entry names key the series: two entries of one name in one run would be one point twice."""
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if entry.name in seen:
            raise r.fail(f"{path}[{i}].name", f"{entry.name!r} appears twice")
        seen.add(entry.name)
