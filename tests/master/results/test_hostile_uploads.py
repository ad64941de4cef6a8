"""Issue 23, finding 1: nothing a job writes can make the master answer 5xx. Each file here made the
upload answer 500 before (PostgreSQL refused the value, or the 400's own JSON failed to render);
now each is a 400 naming the file and the value, and the rejection is recorded for the job's stat."""

import json

import pytest
from django.test import Client

from common.constants import HQEStatus
from common.models import HostQueueEntry
from master import services
from master.models import RejectedResult, TestEntry, TestRun
from tests.master.api.conftest import client_for
from tests.master.results.test_formats import GB_SAMPLE, TF_SAMPLE
from tests.master.results.test_upload import upload
from tests.support import assert_status


def gb_with(rows: list[dict]) -> dict:
    return {**GB_SAMPLE, "benchmarks": rows}


def rep(name: str = "BM_X", **fields: object) -> dict:
    return {"name": name, "run_name": name, "run_type": "iteration", "iterations": 10, "real_time": 1.0, **fields}


def raw(doc: dict) -> bytes:
    # json.dumps writes lone surrogates as \udXXX escapes, as a job's JSON writer may.
    return json.dumps(doc).encode()


HOSTILE = {
    # The median of two repetitions of 1.7e308 s is (a + b) / 2: infinity.
    "median_overflows": (
        gb_with([rep(real_time=1.7e308, time_unit="s"), rep(real_time=1.7e308, time_unit="s")]),
        "benchmarks[0].real_time",
    ),
    # Two repetitions of 2^63-1 iterations: their sum is past bigint.
    "iterations_sum_overflows": (
        gb_with([rep(iterations=2**63 - 1), rep(iterations=2**63 - 1)]),
        "benchmarks[0].iterations",
    ),
    "extra_median_overflows": (
        gb_with([rep(items_per_second=1.7e308), rep(items_per_second=1.7e308)]),
        "benchmarks[0].items_per_second",
    ),
    "nul_in_extras_key": (gb_with([rep(**{"bad\x00key": 1.0})]), "benchmarks[0].bad\ufffdkey"),
    "surrogate_in_extras_key": (gb_with([rep(**{"bad\ud800key": 1.0})]), "benchmarks[0].bad\ufffdkey"),
    "surrogate_in_name": (gb_with([rep(name="BM_\udfff")]), "benchmarks[0].name"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_from_a_shard_is_a_400_naming_the_value_and_its_rejection_is_kept(fleet, shard_hqe, case):
    doc, field = HOSTILE[case]
    resp = upload(client_for(fleet.token1), raw(doc), name="evil.json", hqe=shard_hqe.id)
    assert_status(resp, 400)
    error = resp.json()["error"]
    assert error.startswith(f"evil.json: {field}: "), error
    assert "\x00" not in error and not any(0xD800 <= ord(c) <= 0xDFFF for c in error)
    (rejection,) = RejectedResult.objects.all()
    assert (rejection.hqe_id, rejection.name, rejection.reason) == (shard_hqe.id, "evil.json", error)
    assert not TestRun.objects.exists()


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_from_a_person_is_a_400_too(fleet, staff: Client, case):
    doc, field = HOSTILE[case]
    resp = upload(staff, raw(doc), name="evil.json")
    assert_status(resp, 400)
    assert resp.json()["error"].startswith(f"evil.json: {field}: ")
    assert not TestRun.objects.exists() and not RejectedResult.objects.exists()


def test_large_finite_repetitions_are_still_stored(fleet, staff):
    """The refusal is of what overflows, not of large values: one repetition of 1.7e308 s is a value."""
    doc = gb_with([rep(real_time=1.7e308, time_unit="s", iterations=2**63 - 1)])
    resp = upload(staff, raw(doc))
    assert_status(resp, 201)


def _ended(hqe: HostQueueEntry) -> HostQueueEntry:
    hqe.status = HQEStatus.COMPLETED
    hqe.save(update_fields=["status"])
    return hqe


def test_results_of_a_host_deleted_on_the_master_are_stored_under_their_shard(fleet, shard_hqe):
    """Finding 2: a deleted host's last results were a 409 forever (the shard retried them forever)."""
    _ended(shard_hqe)
    services.delete_hosts(["a1"], acting_user=None)
    resp = upload(client_for(fleet.token1), TF_SAMPLE, hqe=shard_hqe.id)
    assert_status(resp, 201)
    run = resp.json()["run"]
    assert (run["hqe"], run["job"], run["host"], run["shard"], run["label"]) == (
        shard_hqe.id,
        shard_hqe.job_id,
        None,
        "lab1",
        "",
    )


def test_the_same_bytes_from_two_hqes_credit_both_runs(fleet, shard_hqe, staff):
    """Finding 5: the second HQE got the first's run, and its own series (board:b) missed the point."""
    other = HostQueueEntry.objects.get(job=fleet.job("other", meta_hosts=[("board:b", 1)]))
    other.host = services.get_hosts(["b1"])[0]
    other.save(update_fields=["host"])
    first = upload(client_for(fleet.token1), TF_SAMPLE, hqe=shard_hqe.id)
    second = upload(client_for(fleet.token2), TF_SAMPLE, hqe=other.id)
    assert (first.status_code, second.status_code) == (201, 201), second.content
    runs = {r.hqe_id: (r.host.hostname, r.shard.hostname, r.label) for r in TestRun.objects.all()}
    assert runs == {shard_hqe.id: ("a1", "lab1", "board:a"), other.id: ("b1", "lab2", "board:b")}
    entry = TestEntry.objects.filter(run__hqe=shard_hqe).values_list("entry", flat=True).first()
    for label, host in (("board:a", "a1"), ("board:b", "b1")):
        rows = staff.get(
            "/api/v1/results/timings/", {"test": "adjust_contrast_benchmark", "entry": entry, "label": label}
        ).json()["results"]
        assert [row["host"] for row in rows] == [host]
    # Each HQE's retry is still its own run's, and a person's copy is one more, once.
    again = upload(client_for(fleet.token2), TF_SAMPLE, hqe=other.id)
    assert (again.status_code, again.json()["run"]["id"]) == (200, second.json()["run"]["id"])
    assert [upload(staff, TF_SAMPLE).status_code for _ in range(2)] == [201, 200]
    assert TestRun.objects.count() == 3
