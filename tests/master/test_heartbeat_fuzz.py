"""Hypothesis against the real heartbeat endpoint: any value in any field is a 200 with one ack per
update or a 4xx that changed nothing; never a 5xx, never a terminal HQE regressing, never another
shard's HQE touched."""

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.constants import HQEStatus
from common.models import Host, HostQueueEntry
from tests.common.test_wire import _paths, _replace, json_values
from tests.master.test_heartbeat import _snapshot

HOSTILE = st.sampled_from(
    [2**63, 2**63 - 1, -1, 0, 2**31, -(2**31) - 1, True, 1.0, "\x00", "\ud800", "a\udfffb", "", "x" * 5000]
    + [json.loads("[" * 40 + "]" * 40), {"id": 1}, [1], None]
)


def _hqe_states() -> dict[int, tuple[str, int | None]]:
    return dict((i, (s, j)) for i, s, j in HostQueueEntry.objects.values_list("id", "status", "job__shard_id"))


def test_any_value_in_any_field_is_a_200_or_a_400_that_changed_nothing(fleet, heartbeat):
    mine = [fleet.job(f"m{i}").hqes.get() for i in range(3)]
    theirs = fleet.job("t", meta_hosts=[("board:b", 1)]).hqes.get()
    a1, b1 = Host.objects.get(hostname="a1"), Host.objects.get(hostname="b1")
    seqs = iter(range(1, 10**6))

    def base() -> dict[str, Any]:
        n = next(seqs) * 10
        return heartbeat.body(
            fleet.lab1,
            known_hosts=[{"id": a1.id, "version": 1, "status": "Running"}],
            known_jobs=[{"id": mine[0].job_id, "version": 1}],
            updates=[
                {"seq": n + 1, "hqe": mine[0].id, "job": mine[0].job_id, "status": "Running", "host": a1.id},
                {"seq": n + 2, "hqe": mine[1].id, "status": "Failed", "failure": "test", "exit_code": 1},
                {"seq": n + 3, "hqe": theirs.id, "status": "Running", "host": b1.id},
            ],
        )

    paths = _paths(base())
    cases = {"count": 0}

    @settings(
        max_examples=150,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(path=st.sampled_from(paths), value=json_values | HOSTILE)
    def check(path: tuple[Any, ...], value: Any) -> None:
        cases["count"] += 1
        body = _replace(base(), path, value)
        before, states = _snapshot(), _hqe_states()
        resp = heartbeat.post_raw(json.dumps(body), fleet.token1)
        # 403: `shard` named another shard; 409: `protocol` was another integer.
        assert resp.status_code in (200, 400, 403, 409), (path, value, resp.content)
        after = _hqe_states()
        if resp.status_code != 200:
            assert resp.json()["detail"]["field"] in {"protocol", "shard"} or resp.status_code == 400
            assert _snapshot() == before
            return
        updates = body["updates"]
        assert [a["seq"] for a in resp.json()["acks"]] == [u["seq"] for u in updates]
        for hqe_id, (status, shard_id) in states.items():
            if status in HQEStatus.TERMINAL or shard_id != fleet.lab1.id:
                assert after[hqe_id] == (status, shard_id), (hqe_id, path, value)

    check()
    assert cases["count"] >= 100
    assert HostQueueEntry.objects.get(id=theirs.id).status == "Queued"
