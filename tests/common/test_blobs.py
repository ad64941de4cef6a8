"""A job's `inputs` as both roles check them (common/blobs.py), and on the wire (common/wire.py):
a malformed list skips the job's record, never the heartbeat."""

import pytest

from common.blobs import BadInput, parse_inputs
from common.wire import HeartbeatResponse

GOOD = {"name": "model.bin", "digest": "a" * 64, "size": 10, "kind": "file"}


@pytest.mark.parametrize(
    "item,why",
    [
        ({**GOOD, "name": "../etc"}, "input name"),
        ({**GOOD, "name": ".hidden"}, "input name"),
        ({**GOOD, "name": "a/b"}, "input name"),
        ({**GOOD, "name": "x\x00"}, "input name"),
        ({**GOOD, "digest": "A" * 64}, "digest"),
        ({**GOOD, "digest": "a" * 63}, "digest"),
        ({**GOOD, "size": -1}, "size"),
        ({**GOOD, "size": True}, "size"),
        ({**GOOD, "kind": "dir"}, "kind"),
        ("model.bin", "an object"),
    ],
)
def test_a_malformed_input_is_refused_naming_what_is_wrong(item, why):
    with pytest.raises(BadInput, match=why):
        parse_inputs([item])


def test_names_are_unique_and_sizes_bounded():
    with pytest.raises(BadInput, match="twice"):
        parse_inputs([GOOD, GOOD])
    with pytest.raises(BadInput, match="FLEETSHARD_MAX_INPUT_BYTES"):
        parse_inputs([GOOD], max_bytes=9)
    assert [i.to_wire() for i in parse_inputs([GOOD])] == [GOOD]


def test_a_job_record_with_malformed_inputs_is_skipped_alone():
    job = {
        "id": 1,
        "version": 1,
        "name": "j",
        "owner": "ana",
        "priority": 0,
        "command": "true",
        "timeout_mins": 1,
        "max_runtime_mins": 1,
        "hqes": [{"id": 5, "host_id": None, "meta_host": "board:a"}],
    }
    body = {
        "protocol": 1,
        "jobs": [{**job, "inputs": [GOOD]}, {**job, "id": 2, "inputs": [{**GOOD, "name": "../x"}]}],
        "acks": [],
        "heartbeat_interval_s": 10,
    }
    parsed = HeartbeatResponse.parse(body)
    assert [j.id for j in parsed.jobs] == [1] and parsed.jobs[0].inputs == [GOOD]
    assert len(parsed.skipped) == 1 and "inputs" in parsed.skipped[0]
    assert "inputs" not in parsed.jobs[0].__class__(**{**parsed.jobs[0].__dict__, "inputs": []}).to_wire()
