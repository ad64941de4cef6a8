"""`results compare` through the REST API: sides, revisions, A/B tags, verdicts, refusals."""

from datetime import timedelta

import pytest

from common.ab import make_plan
from common.models import HostQueueEntry
from master import services
from master.results.ingest import store_result_file
from master.results.models import TestRun
from tests.master.api.conftest import client_for
from tests.master.results.factories import T0, tf_file
from tests.support import assert_status

URL = "/api/v1/results/compare"
UPLOAD = "/api/v1/results/upload"


def _hqe(fleet, **job):
    hqe = HostQueueEntry.objects.get(job=fleet.job(**job))
    hqe.host = services.get_hosts(["a1"])[0]
    hqe.save(update_fields=["host"])
    return hqe


def _ab_job(fleet, repeats: int, slow: dict[str, float], hour: int = 0, **job) -> HostQueueEntry:
    """An A/B job's runs as a shard uploads them: `base` then `new`, `repeats` times, with the new
    variant's entries slower by the factors in `slow`."""
    hqe = _hqe(fleet, ab=make_plan(["base", "new"], repeats), **job)
    for r in range(1, repeats + 1):
        for v, variant in enumerate(("base", "new")):
            noise = 1 + 0.004 * ((r * 7 + v * 3) % 5 - 2)
            timings = {e: noise * (slow.get(e, 1.0) if variant == "new" else 1.0) for e in ("fast_path", "slow_path")}
            start = T0 + timedelta(hours=hour, minutes=2 * r + v)
            store_result_file(
                tf_file("suite", start, timings),
                f"{variant}-{r}.json",
                hqe=hqe,
                shard=fleet.lab1,
                acting_user=None,
                variant=variant,
                repeat=r,
            )
    return hqe


def test_an_ab_job_whose_new_variant_is_15_percent_slower_on_one_entry(fleet, staff):
    hqe = _ab_job(fleet, repeats=8, slow={"slow_path": 1.15})
    rows = staff.get(URL, {"base": f"{hqe.job_id}:base", "new": f"{hqe.job_id}:new"})
    assert_status(rows, 200)
    by_entry = {row["entry"]: row for row in rows.json()}
    assert by_entry["slow_path"]["verdict"] == "slower"
    assert by_entry["slow_path"]["change_pct"] == pytest.approx(15, abs=1)
    assert by_entry["slow_path"]["ci_low_pct"] > 2 and by_entry["slow_path"]["p_value"] < 0.05
    assert by_entry["fast_path"]["verdict"] == "no change"
    assert (by_entry["slow_path"]["base_runs"], by_entry["slow_path"]["new_runs"]) == (8, 8)
    assert [row["entry"] for row in rows.json()] == ["slow_path", "fast_path"]  # the largest slowdown first
    assert set(rows.json()[0]) == {
        "test",
        "entry",
        "base_median_s",
        "new_median_s",
        "change_pct",
        "ci_low_pct",
        "ci_high_pct",
        "p_value",
        "base_runs",
        "new_runs",
        "verdict",
    }


def test_too_few_runs_and_entries_one_side_lacks(fleet, staff):
    hqe = _ab_job(fleet, repeats=2, slow={"slow_path": 1.5})
    rows = staff.get(URL, {"base": f"{hqe.job_id}:base", "new": f"{hqe.job_id}:new"}).json()
    assert {row["verdict"] for row in rows} == {"too few runs"}
    assert all(row["p_value"] is None and row["change_pct"] is not None for row in rows)


def test_runs_carry_the_jobs_revision_keyval_else_the_files_commit_and_compare_by_revision(fleet, staff):
    old = _hqe(fleet, keyvals={"revision": "r100"})
    for i in range(6):
        store_result_file(
            tf_file("suite", T0 + timedelta(minutes=i), {"e": 1.0 + i * 0.001}),
            "x.json",
            hqe=old,
            shard=fleet.lab1,
            acting_user=None,
        )
    for i in range(6):
        data = tf_file("suite", T0 + timedelta(hours=1, minutes=i), {"e": 2.0 + i * 0.001}, commitId={"hash": "abc1"})
        upload = staff.post(f"{UPLOAD}?name=y{i}.json", data=data, content_type="application/octet-stream")
        assert_status(upload, 201)
        assert upload.json()["run"]["revision"] == "abc1"
    assert set(TestRun.objects.filter(job=old.job).values_list("revision", flat=True)) == {"r100"}
    runs = staff.get("/api/v1/results/runs/", {"test": "suite", "revision": "r100"}).json()
    assert runs["count"] == 6 and {r["revision"] for r in runs["results"]} == {"r100"}
    rows = staff.get(URL, {"base": "rev:r100", "new": "rev:abc1"}).json()
    assert rows[0]["verdict"] == "slower" and rows[0]["change_pct"] == pytest.approx(100, abs=1)


def test_a_job_side_without_a_variant_takes_all_of_its_results(fleet, staff):
    first = _ab_job(fleet, repeats=5, slow={})
    second = _ab_job(fleet, repeats=5, slow={"fast_path": 0.7, "slow_path": 0.7}, hour=1)
    rows = staff.get(URL, {"base": first.job_id, "new": second.job_id, "test": "suite"}).json()
    by_entry = {row["entry"]: row for row in rows}
    assert by_entry["fast_path"]["base_runs"] == 10
    assert by_entry["fast_path"]["new_runs"] == 10
    # Half of the second job's runs (its base variant) are unchanged: the medians move, the verdict holds.
    assert {row["verdict"] for row in rows} <= {"faster", "no change"}


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"new": "1"}, "base", "base query parameter is required"),
        ({"base": "x", "new": "1"}, "base", "is not a side"),
        ({"base": "1", "new": "0"}, "new", "is not a side"),
        ({"base": "1", "new": "1:"}, "new", "is not a side"),
        ({"base": "rev:", "new": "1"}, "base", "needs a revision"),
        ({"base": "1", "new": "1"}, "new", "same side"),
        ({"base": "1", "new": "2", "min_change": "-1"}, "min_change", "percentage"),
        ({"base": "1", "new": "2", "min_change": "nan"}, "min_change", "percentage"),
        ({"base": "1", "new": "2"}, "base", "has no results"),
        ({"base": "1", "new": "2\x00"}, "new", "null"),
    ],
)
def test_bad_comparisons_are_one_line_400s_naming_the_field(fleet, staff, params, field, words):
    answer = staff.get(URL, params)
    assert_status(answer, 400)
    body = answer.json()
    assert words in body["error"] and body["detail"]["field"] == field
    assert "\n" not in body["error"]


def test_a_job_with_one_variant_only_is_a_clear_400(fleet, staff):
    hqe = _ab_job(fleet, repeats=4, slow={})
    answer = staff.get(URL, {"base": f"{hqe.job_id}:base", "new": f"{hqe.job_id}:other"})
    assert_status(answer, 400)
    assert answer.json()["error"] == f"new: {hqe.job_id}:other has no results"


def test_compare_needs_a_token(fleet):
    assert_status(client_for(None).get(URL, {"base": "1", "new": "2"}), 401)


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("variant=new", "give both"),
        ("variant=../x&repeat=1", "invalid variant name"),
        ("variant=new&repeat=0", "invalid repeat"),
        ("variant=new&repeat=1001", "invalid repeat"),
        ("variant=new&repeat=%C2%B2", "invalid repeat"),
    ],
)
def test_uploads_with_bad_ab_tags_are_refused_and_store_nothing(fleet, staff, query, words):
    data = tf_file("suite", T0, {"e": 1.0})
    answer = staff.post(f"{UPLOAD}?name=a.json&{query}", data=data, content_type="application/octet-stream")
    assert_status(answer, 400)
    assert words in answer.json()["error"]
    assert not TestRun.objects.exists()


def test_an_upload_tagged_with_variant_and_repeat_keeps_them(fleet, staff):
    data = tf_file("suite", T0, {"e": 1.0})
    answer = staff.post(
        f"{UPLOAD}?name=a.json&variant=new&repeat=3", data=data, content_type="application/octet-stream"
    )
    assert_status(answer, 201)
    assert {k: answer.json()["run"][k] for k in ("variant", "repeat")} == {"variant": "new", "repeat": 3}
    assert TestRun.objects.values_list("variant", "repeat").get() == ("new", 3)


def test_absurd_timings_compare_to_finite_numbers_not_a_500(fleet, staff):
    # A job may report any positive finite time: 1e-300 s against 1e300 s once overflowed exp() (a
    # 500), and a median of two timings near the largest float was infinity, which JSON cannot carry.
    hqe = _hqe(fleet, ab=make_plan(["base", "new"], 6))
    for r in range(1, 7):
        for variant, wall in (("base", 1e-300), ("new", 1e300)):
            data = tf_file("suite", T0 + timedelta(minutes=2 * r + (variant == "new")), {"e": wall, "f": 1.7e308})
            store_result_file(data, f"{variant}-{r}.json", hqe=hqe, shard=fleet.lab1, acting_user=None,
                              variant=variant, repeat=r)  # fmt: skip
    rows = staff.get(URL, {"base": f"{hqe.job_id}:base", "new": f"{hqe.job_id}:new"})
    assert_status(rows, 200)
    by_entry = {row["entry"]: row for row in rows.json()}
    assert by_entry["e"]["verdict"] == "slower" and by_entry["e"]["change_pct"] > 1e300
    assert by_entry["f"]["base_median_s"] == 1.7e308 and by_entry["f"]["verdict"] == "no change"


def test_refusals_show_at_most_80_characters_of_what_was_sent(fleet, staff):
    for params in ({"base": "rev:" + "x" * 300, "new": "1"}, {"base": "1", "new": "2", "min_change": "1" * 5000}):
        answer = staff.get(URL, params)
        assert answer.status_code == 400 and len(answer.json()["error"]) < 200
