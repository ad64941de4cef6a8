"""An A/B plan (common/ab.py): checked the same by the master, the wire and the shard's driver."""

import json

import pytest

from common.ab import ABPlan, make_plan, parse_repeat, tagged_name, tags_of
from common.errors import FleetshardError
from common.wire import HeartbeatResponse, JobRecord, WireError, _Fields


def test_a_plan_round_trips_through_json():
    plan = make_plan(["control", "treatment"], 20, auto=True, min_change=3.0)
    assert ABPlan.from_json(plan.to_json()) == plan
    assert ABPlan.from_json({}) is None and ABPlan.from_json(None) is None


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"variants": ["a", "b"], "repeat": 2, "extra": 1},
        {"variants": ["a"], "repeat": 2},
        {"variants": ["a", "b", "c"], "repeat": 2},
        {"variants": ["a", 1], "repeat": 2},
        {"variants": ["a", "b"], "repeat": True},
        {"variants": ["a", "b"], "repeat": 0},
        {"variants": ["a", "b"], "repeat": 2, "auto": "yes"},
        {"variants": ["a\\n", "b"], "repeat": 2},
        {"variants": ["a", "b"], "repeat": 2, "min_change": -1},
        {"variants": ["a", "b"], "repeat": 2, "min_change": 10**400},  # float() of it overflowed
        {"variants": ["a", "b"], "repeat": 2, "min_change": "5"},  # was taken silently as the default
        {"variants": ["a", "b"], "repeat": 2, "min_change": float("nan")},
        {"variants": ["a", "b"], "repeat": 10**4000},
    ],
)
def test_malformed_plans_are_refused(data):
    with pytest.raises(FleetshardError):
        ABPlan.from_json(data)


def test_repeat_syntax():
    assert parse_repeat("5") == (5, False)
    assert parse_repeat("auto") == (50, True)
    assert parse_repeat("AUTO:12") == (12, True)
    for bad in ("", "-1", "auto:", "auto:x", "1.5", "1e3"):
        with pytest.raises(FleetshardError):
            parse_repeat(bad)


def test_tags_read_back_only_what_the_driver_wrote():
    assert tags_of(tagged_name(3, "treat.v2", "bench.json")) == ("treat.v2", 3, "bench.json")
    assert tags_of("bench.json") is None
    assert tags_of("ab-0-x--a.json") is None
    assert tags_of("ab-1-../x--a.json") is None
    assert tags_of("ab-99999-x--a.json") is None
    # A job's own name may have `--` in it: the variant ends at the first (the greedy match took
    # `my-bench--v2.json` of variant `ctl` for variant `ctl--my-bench`); a variant name has none.
    assert tags_of(tagged_name(1, "ctl", "my-bench--v2.json")) == ("ctl", 1, "my-bench--v2.json")
    assert tags_of(tagged_name(2, "t.1-b", "--.json")) == ("t.1-b", 2, "--.json")
    for bad in ("a--b", "a-", "-a", ".a", "a" * 65):
        with pytest.raises(FleetshardError, match="invalid variant name"):
            make_plan([bad, "b"], 1)
    assert make_plan(["a-b.c_d", "B"], 1).variants == ("a-b.c_d", "B")


def _job(**extra):
    return {
        "id": 1,
        "version": 1,
        "name": "j",
        "owner": "o",
        "priority": 1,
        "command": "true",
        "timeout_mins": 1,
        "max_runtime_mins": 1,
        "dependency_labels": [],
        "keyvals": {},
        "parent_id": None,
        "aborted": False,
        "created_on": None,
        "hqes": [],
        **extra,
    }


def test_job_records_carry_the_plan_and_leave_it_off_for_a_plain_job():
    plan = make_plan(["a", "b"], 2).to_json()
    record = JobRecord.parse(_Fields(_job(ab=plan), "jobs[0]"))
    assert record.ab == plan and record.to_wire()["ab"] == plan
    plain = JobRecord.parse(_Fields(_job(), "jobs[0]"))
    assert plain.ab == {} and "ab" not in plain.to_wire()
    with pytest.raises(WireError, match=r"jobs\[0\]\.ab: .*exactly 2 variants"):
        JobRecord.parse(_Fields(_job(ab={"variants": ["a"], "repeat": 1}), "jobs[0]"))


def test_a_job_record_with_a_malformed_plan_is_skipped_and_nothing_else():
    """A malformed `ab` from a master (an integer past any float) raised OverflowError out of the
    whole heartbeat answer's parse: every heartbeat of the shard failed, not just that job."""
    hqe = {"id": 500, "host_id": None, "meta_host": "board:x"}
    body = {
        "protocol": 1,
        "jobs": [
            _job(id=1, hqes=[hqe], ab={"variants": ["a", "b"], "repeat": 2, "min_change": 10**400}),
            _job(id=2, hqes=[{**hqe, "id": 501}], ab={"variants": ["a", "x" * 100_000], "repeat": 2}),
            _job(id=3, hqes=[{**hqe, "id": 502}], ab={"variants": ["a", "b"], "repeat": 10**4000}),
            _job(id=4, hqes=[{**hqe, "id": 503}], ab=make_plan(["a", "b"], 2).to_json()),
        ],
    }
    parsed = HeartbeatResponse.parse(json.loads(json.dumps(body)))
    assert [job.id for job in parsed.jobs] == [4]
    assert len(parsed.skipped) == 3 and all(len(reason) < 300 for reason in parsed.skipped)
    assert "min_change must be a percentage" in parsed.skipped[0]
