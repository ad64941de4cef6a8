"""The wire contract's parsers: any JSON value anywhere gives a record or a WireError, nothing else."""

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from common.wire import (
    HeartbeatRequest,
    HeartbeatResponse,
    HostEvent,
    RejectedUpdate,
    Update,
    WireError,
    clean_text,
    depth_exceeds,
    dumps,
    loads,
    parse_time,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

REQUEST = {
    "protocol": 1,
    "shard": "lab1",
    "instance": "5f0c7a2e-8d1b-4c3e-9a77-2b6f1d0e4c11",
    "client_version": "0.1.0",
    "known_hosts": [{"id": 12, "version": 3, "status": "Ready"}],
    "known_jobs": [{"id": 99, "version": 1}],
    "updates": [
        {"seq": 7, "hqe": 501, "job": 99, "status": "Running", "host": 12, "started_on": "2026-11-22T10:00:00Z"},
        {"seq": 8, "hqe": 501, "job": 99, "status": "Failed", "failure": "test", "exit_code": 3, "log_tail": "x"},
    ],
    "host_events": [{"seq": 9, "host": 12, "status": "Repairing", "at": "2026-11-22T10:05:00.25Z"}],
}


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _paths(item, (*path, i))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


def test_the_designs_example_request_round_trips():
    req = HeartbeatRequest.parse(REQUEST)
    assert all(isinstance(u, Update) for u in req.updates)
    assert [(e.seq, e.host, e.status, e.at.microsecond) for e in req.host_events] == [(9, 12, "Repairing", 250000)]
    assert HeartbeatRequest.parse(req.to_wire()) == req


def test_host_events_are_optional_bounded_and_share_no_seq_with_an_update():
    without = {k: v for k, v in REQUEST.items() if k != "host_events"}
    assert HeartbeatRequest.parse(without).host_events == []
    for events, field in [
        ({}, "host_events"),
        ([{"seq": 9, "host": 12, "status": "Ready", "at": "2026-11-22T10:05:00Z"}] * 1001, "host_events"),
        ([{"seq": 8, "host": 12, "status": "Ready", "at": "2026-11-22T10:05:00Z"}], "host_events[0].seq"),
        ([{"host": 12}], "host_events[0].seq"),
    ]:
        with pytest.raises(WireError) as refused:
            HeartbeatRequest.parse({**REQUEST, "host_events": events})
        assert refused.value.field == field


@settings(max_examples=300, deadline=None, derandomize=True)
@given(path=st.sampled_from(_paths(REQUEST)), value=json_values)
def test_any_value_in_any_request_field_parses_or_names_the_field(path, value):
    body = _replace(REQUEST, path, value)
    try:
        req = HeartbeatRequest.parse(body)
    except WireError as exc:
        assert exc.field and exc.message
        return
    assert all(isinstance(u, Update | RejectedUpdate) for u in req.updates)
    assert all(isinstance(e, HostEvent | RejectedUpdate) for e in req.host_events)
    again = HeartbeatRequest.parse(json.loads(json.dumps(req.to_wire())))
    assert again.updates == [u for u in req.updates if isinstance(u, Update)]
    assert again.host_events == [e for e in req.host_events if isinstance(e, HostEvent)]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(body=json_values)
def test_any_json_value_as_a_response_parses_or_is_a_wire_error(body):
    try:
        response = HeartbeatResponse.parse(body)
    except WireError:
        return
    json.dumps(response.to_wire())


def test_unsafe_text_is_cleaned_and_refused():
    assert clean_text("a\x00b\ud800c\udfff") == "a\ufffdb\ufffdc\ufffd"
    assert clean_text("plain ✓") == "plain ✓"


@pytest.mark.parametrize(
    "text, ok",
    [
        ("2026-11-22T10:00:00Z", True),
        ("2026-11-22T10:00:00+02:00", True),
        ("2000-01-01T00:00:00Z", True),
        ("2100-01-01T00:00:00Z", True),
        ("2100-01-01T00:00:01Z", False),
        ("1999-12-31T23:59:59Z", False),
        ("9999-12-31T23:59:59-23:59", False),
        ("0001-01-01T00:00:00+23:59", False),
        ("2026-11-22T10:00:00", False),
        ("yesterday", False),
    ],
)
def test_times_are_zoned_and_between_2000_and_2100(text, ok):
    if ok:
        assert parse_time(text).tzinfo == UTC
    else:
        with pytest.raises(ValueError):
            parse_time(text)


def test_nesting_is_measured_without_recursion():
    assert not depth_exceeds(json.loads("[" * 32 + "]" * 32), 32)
    assert depth_exceeds(json.loads("[" * 33 + "]" * 33), 32)

    # Objects count as lists do, and so do both mixed; a deep branch beside shallow ones still counts.
    def nest(depth: int, kinds: str) -> Any:
        value: Any = {} if kinds[(depth - 1) % len(kinds)] == "o" else []
        for level in range(depth - 2, -1, -1):
            value = {"a": value} if kinds[level % len(kinds)] == "o" else [value]
        return value

    for depth, deeper in ((32, False), (33, True)):
        for value in (nest(depth, "o"), nest(depth, "lo"), nest(depth, "ol"), [1, {}, [[]], nest(depth - 1, "o"), "x"]):
            text = json.dumps(value)
            assert depth_exceeds(json.loads(text), 32) is deeper, text
            if deeper:
                with pytest.raises(WireError, match="nested deeper than 32"):
                    loads(text)
            else:
                assert loads(text) == value
    nested: Any = []
    for _ in range(200_000):
        nested = [nested]
    assert depth_exceeds(nested, 32)
    with pytest.raises(WireError, match="nested deeper than 32"):
        loads("[" * 100_000 + "]" * 100_000)


def test_format_and_parse_agree():
    when = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    update = Update(seq=1, hqe=2, status="Running", started_on=when)
    assert update.to_wire()["started_on"] == "2026-11-22T10:00:00Z"


@pytest.mark.parametrize("raw", ['{"a": NaN}', "[Infinity]", "-Infinity"])
def test_nan_and_infinity_are_not_json(raw):
    with pytest.raises(WireError, match="not JSON"):
        loads(raw)


def test_a_malformed_removed_id_or_suite_keyvals_costs_only_itself():
    """A bad entry in `removed_host_ids` or `suite_keyvals` used to fail the whole answer, so one bad
    record of the master stopped every heartbeat of the shard (and it never got accepted)."""
    job = {
        "id": 100,
        "version": 1,
        "name": "smoke",
        "owner": "ana",
        "priority": 40,
        "command": "true",
        "timeout_mins": 10,
        "max_runtime_mins": 10,
        "hqes": [{"id": 500, "host_id": None, "meta_host": "board:x"}],
    }
    body = {
        "protocol": 1,
        "removed_host_ids": [13, "x", True, 0],
        "jobs": [{**job, "parent_id": 7}, {**job, "id": 101, "parent_id": 8}, {**job, "id": 102}],
        "suite_keyvals": {"7": {"suite": {"nested": 1}}, "8": {"suite": "bvt"}},
        "acks": [{"seq": 1, "result": "accepted"}],
    }
    parsed = HeartbeatResponse.parse(body)
    assert parsed.removed_host_ids == [13]
    # Job 100 needs its parent's keyvals, which are malformed: skipped, so the master sends it again.
    assert [j.id for j in parsed.jobs] == [101, 102]
    assert parsed.suite_keyvals == {"8": {"suite": "bvt"}}
    assert len(parsed.acks) == 1
    assert len(parsed.skipped) == 5


known_records = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.integers(min_value=1, max_value=40)
            | st.sampled_from([0, -1, 2**63 - 1, 2**63, True, 1.0])
            | json_values,
            "version": st.integers(min_value=1, max_value=2**63 - 1) | st.sampled_from([0, 2**63, True, 1.0]),
            "status": st.sampled_from(["Ready", "Running", "Repair Failed"]) | json_values,
        },
        optional={"extra": json_values},
    )
    | json_values,
    max_size=6,
)


def _one_record_at_a_time(body: dict[str, Any], key: str) -> list[tuple[Any, ...]] | str:
    """What the known list parses to when each record is parsed alone: the records, or the error."""
    records: list[tuple[Any, ...]] = []
    for i, item in enumerate(body[key]):
        try:
            records += getattr(HeartbeatRequest.parse({**body, "known_hosts": [], "known_jobs": [], key: [item]}), key)
        except WireError as exc:
            return str(exc).replace(f"{key}[0]", f"{key}[{i}]")
    ids = [r[0] for r in records]
    repeated = next((i for i, x in enumerate(ids) if x in ids[:i]), None)
    kind = "host" if key == "known_hosts" else "job"
    return f"{key}[{repeated}].id: {kind} {ids[repeated]} is listed twice" if repeated is not None else records


@settings(max_examples=300)
@given(records=known_records, key=st.sampled_from(["known_hosts", "known_jobs"]))
def test_a_known_list_read_a_column_at_a_time_agrees_with_reading_each_record(records, key):
    body = {**REQUEST, key: records}
    try:
        got: list[tuple[Any, ...]] | str = list(getattr(HeartbeatRequest.parse(body), key))
    except WireError as exc:
        got = str(exc)
    assert got == _one_record_at_a_time(body, key)


def _typed(value: Any) -> Any:
    """`value` with every scalar's type beside it: 1 and 1.0 and True differ."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, repr(value))


def _refuse(name: str) -> None:
    raise ValueError(name)


def _json_only(raw: bytes) -> Any:
    """What json alone makes of a body, with the wire's rules: no NaN or infinities, 32 levels."""
    try:
        value = json.loads(raw, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return "refused"
    return "refused" if depth_exceeds(value, 32) else _typed(value)


wide_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=16,
)


@settings(max_examples=400)
@given(value=wide_values, ascii_only=st.booleans(), cut=st.integers(min_value=0, max_value=40))
def test_loads_parses_as_json_does_whatever_the_body(value, ascii_only, cut):
    """The fast parser never decides: a body parses to the same values and types as with json, or is
    refused as json refuses it (big integers, lone surrogates, NaN, cut-off bodies included)."""
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    for body in (raw, raw[: len(raw) - cut], raw.replace(b"1", b"1e999", 1), raw.replace(b"0", b"NaN", 1)):
        try:
            got = _typed(loads(body))
        except WireError:
            got = "refused"
        assert got == _json_only(body)


@pytest.mark.parametrize(
    "body",
    [
        b"[0.00012345678901234567891, 18446744073709551616]",
        b'{"a": 0.00012345678901234567891, "b": [[-9223372036854775809]]}',
        b"[0.00012345678901234567891, 18446744073709551615, -9223372036854775808]",
        b"[0.00012345678901234567891, 1.8446744073709552e19]",
        b"12345678901234567890123",
        b'{"x": 0.1234567890123456789012}',
    ],
)
def test_a_long_fraction_beside_a_big_integer_parses_as_json_does(body):
    """19 digits in a row no longer send a body to json by themselves (a result file's floats have them):
    orjson's answer stands unless it holds a float of 2**63 or more, where a big integer may have been."""
    assert _typed(loads(body)) == _json_only(body)


@settings(max_examples=200, derandomize=True)
@given(json_values | st.just({"big": 2**70, "lone": "\ud800", "text": "é\u2028"}))
def test_a_response_body_reads_back_as_the_value_whatever_orjson_refuses(value):
    assume(not any(isinstance(v, float) and math.isinf(v) for v in _leaves(value)))  # no JSON for them
    assert json.loads(dumps(value).decode("utf-8", "surrogatepass")) == value


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _near_halfway(x: float, digits: int, nudge: int) -> str:
    """A decimal of `digits` significant digits at, or a last digit off, the exact midpoint between `x`
    and the next float up: the literals a float parser rounds wrong if any."""
    from decimal import Context, Decimal

    mid = (Decimal(x) + Decimal(math.nextafter(x, math.inf))) / 2
    text = format(Context(prec=digits).plus(Decimal(mid)), "e")
    mantissa, exponent = text.split("e")
    sign = "-" if mantissa.startswith("-") else ""
    whole = mantissa.lstrip("-").replace(".", "")
    last = (int(whole[-1]) + nudge) % 10
    whole = whole[:-1] + str(last)
    return f"{sign}{whole[0]}.{whole[1:]}e{int(exponent)}"


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    x=st.floats(min_value=5e-324, max_value=1.7e308, allow_nan=False, allow_infinity=False),
    digits=st.integers(min_value=19, max_value=60),
    nudge=st.sampled_from([-1, 0, 1]),
    negative=st.booleans(),
)
def test_a_long_fraction_parses_to_the_float_json_makes_to_the_last_bit(x, digits, nudge, negative):
    """Bodies with 19 digits or more in a row now take orjson's float unless one is 2**63 or more: its
    float parser must round every such literal as json (Python's float()) does, halfway cases included."""
    literal = ("-" if negative else "") + _near_halfway(x, digits, nudge)
    for body in (f"[{literal}]", f'{{"entry": [{{"wallTime": {literal}, "iters": "10"}}]}}'):
        assert _typed(loads(body.encode())) == _json_only(body.encode()), body
