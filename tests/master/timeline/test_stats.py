"""Totals per host, label and shard, computed in the database, equal the sums of the exported slices."""

import json
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import FleetshardError
from common.models import Host
from master.timeline.export import trace_chunks
from master.timeline.models import Interval, RunTrace
from master.timeline.query import scope
from master.timeline.stats import stats
from tests.master.timeline.factories import add_run, add_state, at, host
from tests.master.timeline.validate import validate

NOW = at(3600)


@pytest.fixture(autouse=True)
def hosts_existed_before_the_window(request):
    """The fleet's hosts are made now, their intervals long before: they existed all along."""
    if "fleet" in request.fixturenames:
        request.getfixturevalue("fleet")
        Host.objects.update(created_on=at(-86400 * 365))


def _row(rows, key):
    return next(r for r in rows if r["key"] == key)


def test_totals_of_a_known_hour(fleet, django_assert_num_queries, db_vendor):
    add_run("a1", 0, 600, created=0)
    add_run("a1", 900, 1800, created=300)
    add_state("a1", "Cleaning", 600, 660)
    add_run("a2", 100, 200, created=90)
    add_state("a2", "Repairing", 200, None)  # open: until now
    s = scope(NOW, since=at(0))
    with django_assert_num_queries(3):
        rows = stats(s, "host")
    assert [r["key"] for r in rows] == ["a1", "a2", "a3", "b1", "c1"]  # c1 did nothing: idle
    a1 = _row(rows, "a1")
    assert a1 == {
        "key": "a1",
        "running_s": pytest.approx(1500),
        "cleaning_s": pytest.approx(60),
        "repairing_s": 0.0,
        "idle_s": pytest.approx(3600 - 1560),
        "utilisation": pytest.approx(1500 / 3600),
        "runs": 2,
        # Waits of 0 and 600 s: interpolated on PostgreSQL, the nearest rank on SQLite.
        "wait_p50_s": pytest.approx(300 if db_vendor == "postgresql" else 0),
        "wait_p95_s": pytest.approx(570 if db_vendor == "postgresql" else 600),
        "repair_failed_s": 0.0,
        "hosts": 1,
    }
    a2 = _row(rows, "a2")
    assert (a2["repairing_s"], a2["idle_s"], a2["runs"], a2["wait_p50_s"]) == (
        pytest.approx(3400),
        pytest.approx(100),
        1,
        pytest.approx(10),
    )
    assert _row(rows, "a3")["idle_s"] == 3600 and _row(rows, "a3")["wait_p50_s"] is None
    by_shard = stats(s, "shard")
    assert [r["key"] for r in by_shard] == ["lab1", "lab2"]
    lab1 = _row(by_shard, "lab1")
    assert (lab1["hosts"], lab1["runs"], lab1["running_s"]) == (3, 3, pytest.approx(1600))
    assert lab1["idle_s"] == pytest.approx(3 * 3600 - 1600 - 60 - 3400)
    wifi = _row(stats(s, "label"), "wifi")  # a1, a2, b1
    assert (wifi["hosts"], wifi["runs"], wifi["running_s"]) == (3, 3, pytest.approx(1600))


@pytest.mark.parametrize("fraction", [0.0, 0.4995, 0.9995, 0.99998])
def test_a_runs_seconds_count_every_microsecond_whatever_its_fraction(fleet, fraction):
    """SQLite reads times to the millisecond, rounded: a run ending at .99998 s once counted a second more."""
    add_run("a1", 100.5, 200 + fraction, created=40)
    assert _row(stats(scope(NOW), "host"), "a1")["running_s"] == pytest.approx(99.5 + fraction, abs=1e-5)


def test_the_window_defaults_to_the_last_24_hours_and_clips(fleet):
    add_run("a1", 0, 3600)
    rows = stats(scope(at(3600 + 86400 - 60)), "host")
    assert _row(rows, "a1")["running_s"] == pytest.approx(60)
    assert _row(stats(scope(NOW, since=at(1800), until=at(2400))), "a1")["running_s"] == pytest.approx(600)


def test_a_window_starting_after_now_is_refused_not_summed_negative(fleet):
    """Open intervals clipped to [since, now) with since after now once summed to -3600 s running."""
    add_run("a1", 0, None)
    add_state("a2", "Repairing", 200, None)
    with pytest.raises(FleetshardError, match="since .* is after the master's clock") as refused:
        scope(NOW, since=at(7200))
    assert refused.value.field == "since"
    rows = stats(scope(NOW, since=NOW), "host")
    assert {(r["running_s"], r["repairing_s"], r["idle_s"]) for r in rows} == {(0.0, 0.0, 0.0)}


def test_a_bad_grouping_is_refused(fleet):
    with pytest.raises(FleetshardError, match="invalid by 'job'"):
        stats(scope(NOW), "job")


HOSTS = ("a1", "a2", "b1")
KINDS = ("run", "run", "Cleaning", "Repairing", "Repair Failed")
TIMELINE = st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 900), st.sampled_from(KINDS)),  # gap, length, kind
    max_size=6,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    timelines=st.fixed_dictionaries({h: TIMELINE for h in HOSTS}),
    open_last=st.booleans(),
    window=st.tuples(st.integers(0, 2000), st.integers(1, 4000)),
    by=st.sampled_from(("host", "label", "shard")),
)
def test_totals_equal_the_sums_of_the_exported_slices(fleet, timelines, open_last, window, by):
    Interval.objects.all().delete()
    RunTrace.objects.all().delete()
    for hostname, pieces in timelines.items():
        t = 0.0
        for n, (gap, length, kind) in enumerate(pieces):
            start, end = t + gap + 0.25, t + gap + 0.25 + length
            is_open = open_last and n == len(pieces) - 1
            if kind == "run":
                run = add_run(hostname, start, None if is_open else end, created=start - gap)
                # The job's own events, named like the fleet's slices: nested in the run, never in totals.
                hostile = [["run", "", 0, 10**6], ["Cleaning", "", 0, 5 * 10**5], ["Repairing", "", 10**6, 10**6]]
                RunTrace.objects.create(hqe_id=run.hqe_id, events=hostile)
            else:
                add_state(hostname, kind, start, None if is_open else end)
            t = end
    s = scope(at(6000), since=at(window[0]), until=at(window[0] + window[1]))
    trace = json.loads("".join(trace_chunks(s)))
    totals = validate(trace).slice_us
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    sums: dict[tuple[str, str], float] = defaultdict(float)
    runs: dict[str, int] = defaultdict(int)
    groups = {"a1": ("a1", "lab1", ["board:a", "wifi"]), "a2": ("a2", "lab1", ["board:a", "wifi"])}
    groups["b1"] = ("b1", "lab2", ["board:b", "wifi"])
    for e in trace["traceEvents"]:
        if e["ph"] != "X" or e.get("cat") == "job":
            continue
        hostname, shard, labels = groups[names[(e["pid"], e["tid"])]]
        keys = {"host": [hostname], "shard": [shard], "label": labels}[by]
        kind = "run" if e.get("cat") == "run" else e["name"]
        for key in keys:
            sums[(key, kind)] += e["dur"] / 1e6
            runs[key] += kind == "run"
    field = {
        "run": "running_s",
        "Cleaning": "cleaning_s",
        "Repairing": "repairing_s",
        "Repair Failed": "repair_failed_s",
    }
    rows = stats(s, by)
    for row in rows:
        for kind, name in field.items():
            assert row[name] == pytest.approx(sums[(row["key"], kind)], abs=1e-3), (row, kind)
        assert row["runs"] == runs[row["key"]]
        busy = sum(row[name] for name in field.values())
        assert row["idle_s"] == pytest.approx(max(0.0, row["hosts"] * window[1] - busy), abs=1e-3)
    if by == "host":
        for kind, name in field.items():
            assert sum(r[name] for r in rows) == pytest.approx(totals.get(kind, 0) / 1e6, abs=1e-3), kind
    assert host("a1").shard == fleet.lab1


def test_a_host_made_during_the_window_counts_idle_only_since_it_was_made(fleet):
    """A lab made three minutes ago is not a day of idle hosts at 0% use."""
    Host.objects.filter(hostname="a3").update(created_on=at(3600 - 180))
    add_run("a3", 3600 - 120, 3600 - 60, created=3600 - 150)
    rows = stats(scope(NOW, since=at(0)), "host")
    a3 = _row(rows, "a3")
    assert a3["running_s"] == pytest.approx(60)
    assert a3["idle_s"] == pytest.approx(120)
    assert a3["utilisation"] == pytest.approx(60 / 180)
    # The shard's total: a1 and a2 the whole hour, a3 three minutes.
    lab1 = _row(stats(scope(NOW, since=at(0)), "shard"), "lab1")
    assert lab1["idle_s"] == pytest.approx(2 * 3600 + 180 - 60)
    # Made after the window ended: no capacity, no idle.
    Host.objects.filter(hostname="c1").update(created_on=at(7200))
    assert _row(stats(scope(NOW, since=at(0)), "host"), "c1")["idle_s"] == 0.0
