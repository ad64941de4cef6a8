"""POST /api/v1/results/upload: the contract the uploader and the shard rely on."""

import json
import math
import threading

import pytest
from django.db import connection
from django.test import Client

from common.constants import MAX_RESULT_FILE_BYTES
from common.result_formats.records import plain_bytes
from master import services
from master.models import AuditRecord, DirtySeries, RejectedResult, TestEntry, TestRun
from tests.master.api.conftest import client_for
from tests.master.results.test_formats import GB_SAMPLE, TF_SAMPLE
from tests.support import assert_status, tokens_just_used

URL = "/api/v1/results/upload"


def upload(client, data, name="bench.json", **params):
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    query = "&".join(f"{k}={v}" for k, v in {"name": name, **params}.items())
    return client.post(f"{URL}?{query}", data=body, content_type="application/octet-stream")


def test_a_person_uploads_both_formats_and_the_upload_is_audited(fleet, staff):
    tf = upload(staff, TF_SAMPLE, name="tf.json")
    assert_status(tf, 201)
    run = tf.json()["run"]
    assert tf.json()["created"] is True
    assert {k: run[k] for k in ("test", "job", "hqe", "host", "shard", "entries")} == {
        "test": "adjust_contrast_benchmark",
        "job": None,
        "hqe": None,
        "host": None,
        "shard": None,
        "entries": 2,
    }
    assert run["start"] == "2023-11-14T22:13:20Z"
    gb = upload(staff, GB_SAMPLE, name="gb.json")
    assert_status(gb, 201)
    assert gb.json()["run"]["test"] == "string_bench"
    stored = TestRun.objects.get(id=run["id"])
    assert stored.uploaded_by.username == "boss"
    assert stored.info["commitId"] == {"hash": "0123456789abcdef", "snapshot": ""}
    assert TestEntry.objects.get(run=stored, entry="BM_AdjustContrast_gpu_1_299x299").wall_time_s == 0.00025
    audits = AuditRecord.objects.filter(action="result.upload").order_by("id")
    assert [(a.actor, a.details["file"]) for a in audits] == [("boss", "tf.json"), ("boss", "gb.json")]


def test_the_same_file_twice_is_stored_once(fleet, staff):
    first = upload(staff, TF_SAMPLE)
    again = upload(staff, TF_SAMPLE)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == {"created": False, "run": first.json()["run"]}
    assert TestRun.objects.count() == 1 and TestEntry.objects.count() == 2
    assert AuditRecord.objects.filter(action="result.upload").count() == 1


def test_results_of_an_hqe_whose_host_the_master_has_not_heard_wait_for_the_heartbeat(fleet, shard_hqe):
    """An upload that overtook the heartbeat naming the run's host is refused for now (the shard retries),
    so no run is ever filed under no host."""
    shard_hqe.host = None
    shard_hqe.save(update_fields=["host"])
    resp = upload(client_for(fleet.token1), TF_SAMPLE, hqe=shard_hqe.id)
    assert_status(resp, 409)
    assert "has no host on the master yet" in resp.json()["error"]
    assert not TestRun.objects.exists() and not RejectedResult.objects.exists()
    shard_hqe.host = services.get_hosts(["a1"])[0]
    shard_hqe.save(update_fields=["host"])
    resp = upload(client_for(fleet.token1), TF_SAMPLE, hqe=shard_hqe.id)
    assert_status(resp, 201)
    assert resp.json()["run"]["host"] == "a1"


def test_a_shard_attaches_results_to_its_own_hqe(fleet, shard_hqe):
    resp = upload(client_for(fleet.token1), TF_SAMPLE, hqe=shard_hqe.id)
    assert_status(resp, 201)
    run = resp.json()["run"]
    assert (run["job"], run["hqe"], run["host"], run["shard"]) == (shard_hqe.job_id, shard_hqe.id, "a1", "lab1")
    stored = TestRun.objects.get(id=run["id"])
    assert (stored.label, stored.labels) == ("board:a", ["board:a", "wifi"])
    assert TestEntry.objects.filter(run=stored, label="board:a").count() == 2
    assert not AuditRecord.objects.filter(action="result.upload").exists()  # the system's, like heartbeats


def test_a_shard_cannot_attach_results_to_another_shards_hqe(fleet, shard_hqe):
    resp = upload(client_for(fleet.token2), TF_SAMPLE, hqe=shard_hqe.id)
    assert_status(resp, 403)
    message = f"hqe: HQE {shard_hqe.id} is not of a job on shard lab2"
    assert resp.json() == {"error": message, "detail": {"field": "hqe"}}
    assert_status(upload(client_for(fleet.token2), TF_SAMPLE, hqe=10**9), 404)
    assert not TestRun.objects.exists()


def test_a_person_cannot_pass_an_hqe(fleet, staff, shard_hqe):
    resp = upload(staff, TF_SAMPLE, hqe=shard_hqe.id)
    assert_status(resp, 400)
    assert resp.json()["detail"] == {"field": "hqe"}
    assert not TestRun.objects.exists()


def test_people_need_the_add_permission_or_staff(fleet, user):
    resp = upload(user, TF_SAMPLE)
    assert_status(resp, 403)
    assert "master.add_testrun" in resp.json()["error"]
    assert_status(upload(client_for(None), TF_SAMPLE), 401)
    assert_status(upload(client_for("fs_nope"), TF_SAMPLE), 401)
    assert not TestRun.objects.exists()


def test_a_malformed_file_is_400_naming_it_and_a_shards_rejection_is_recorded_once(fleet, shard_hqe):
    bad = {**TF_SAMPLE, "startTime": "soon"}
    shard = client_for(fleet.token1)
    for _ in range(2):
        resp = upload(shard, bad, name="broken.json", hqe=shard_hqe.id)
        assert_status(resp, 400)
        assert resp.json()["error"].startswith("broken.json: startTime: ")
    (rejection,) = RejectedResult.objects.all()
    assert (rejection.hqe_id, rejection.name, rejection.reason) == (shard_hqe.id, "broken.json", resp.json()["error"])
    assert not TestRun.objects.exists()


def test_a_malformed_upload_by_a_person_records_nothing(fleet, staff):
    resp = upload(staff, b"{not json", name="x.json")
    assert_status(resp, 400)
    assert resp.json()["error"].startswith("x.json: ")
    assert not RejectedResult.objects.exists() and not AuditRecord.objects.filter(action="result.upload").exists()


def test_a_file_over_the_bound_is_413(fleet):
    # Django's own test client: the schema checker would read the refused body after the view.
    token = services.create_personal_token("boss", admin=True, acting_user=None)[1]
    resp = upload(Client(HTTP_AUTHORIZATION=f"Bearer {token}"), b" " * (MAX_RESULT_FILE_BYTES + 1))
    assert_status(resp, 413)
    assert resp.json()["detail"] == {"field": "body"}


def test_a_file_over_djangos_10_mib_but_within_the_bound_is_stored(fleet, staff):
    body = json.dumps(TF_SAMPLE).encode() + b" " * (11 * 1024 * 1024)
    assert_status(upload(staff, body), 201)


def test_the_name_is_required(fleet, staff):
    resp = staff.post(URL, data=json.dumps(TF_SAMPLE), content_type="application/json")
    assert_status(resp, 400)
    assert resp.json()["detail"] == {"field": "name"}


def test_job_detail_lists_each_hqes_quarantined_files_and_results(fleet, shard_hqe, staff):
    shard = client_for(fleet.token1)
    upload(shard, {**TF_SAMPLE, "startTime": "soon"}, name="broken.json", hqe=shard_hqe.id)
    upload(shard, TF_SAMPLE, hqe=shard_hqe.id)
    (hqe,) = staff.get(f"/api/v1/jobs/{shard_hqe.job_id}/").json()["hqes"]
    assert hqe["results"] == 1
    assert hqe["result_tests"] == [
        {
            "test": "adjust_contrast_benchmark",
            "runs": 1,
            "entries": 2,
            "chart": "/admin/benchmarks/entries/?test=adjust_contrast_benchmark",
        }
    ]
    assert hqe["quarantined"] == [{"name": "broken.json", "reason": RejectedResult.objects.get().reason}]


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_identical_uploads_racing_store_one_run(fleet, staff):
    barrier = threading.Barrier(2)
    answers = []

    def go():
        try:
            barrier.wait()
            answers.append(upload(staff, TF_SAMPLE).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [200, 201]
    assert TestRun.objects.count() == 1 and TestEntry.objects.count() == 2


def many_entries(n):
    return {**TF_SAMPLE, "entries": {"entry": [{"name": f"BM_{i}", "iters": 10, "wallTime": 1e-3} for i in range(n)]}}


@pytest.mark.parametrize("entries", [1, 300, 5000])
def test_upload_query_counts_are_pinned_whatever_the_number_of_entries(
    fleet, staff, shard_hqe, django_assert_num_queries, entries
):
    doc = many_entries(entries)
    tokens_just_used()
    # token; BEGIN, savepoint, run, release; entries (one COPY on PostgreSQL, one INSERT on SQLite); dirty
    # series; audit record and target; COMMIT
    with django_assert_num_queries(10):
        assert_status(upload(staff, doc), 201)
    # the same file again: token; BEGIN, savepoint, run refused, rollback and release, the stored run; COMMIT
    with django_assert_num_queries(8):
        assert_status(upload(staff, doc), 200)
    # a shard's: token, HQE; BEGIN, the HQE held, host labels, savepoint, run, release; entries; dirty series;
    # COMMIT
    with django_assert_num_queries(11):
        assert_status(upload(client_for(fleet.token1), {**doc, "startTime": "1700000001"}, hqe=shard_hqe.id), 201)
    assert TestEntry.objects.count() == 2 * entries
    assert DirtySeries.objects.count() == 2 * entries  # one series per entry and board label


def test_a_shards_file_tagged_outside_its_jobs_ab_plan_is_refused_and_recorded(fleet, shard_hqe):
    """The tags come from the file's name, which the job chose: a plain job's `ab-1-x--a.json`, or an A/B
    job's variant or repeat its plan never had, are refused (the shard quarantines them), not stored."""
    from common.ab import make_plan

    shard = client_for(fleet.token1)
    resp = upload(shard, TF_SAMPLE, name="ab-1-x--a.json", hqe=shard_hqe.id, variant="x", repeat=1)
    assert_status(resp, 400)
    assert "is no A/B job" in resp.json()["error"] and resp.json()["detail"]["field"] == "variant"
    ab = fleet.job("ab", ab=make_plan(["control", "treatment"], 3))
    hqe = ab.hqes.get()
    hqe.host = shard_hqe.host
    hqe.save(update_fields=["host"])
    for variant, repeat, words in (("evil", 1, "'evil' is not a variant of job"), ("control", 4, "at most 3 repeats")):
        resp = upload(shard, TF_SAMPLE, name=f"{variant}.json", hqe=hqe.id, variant=variant, repeat=repeat)
        assert_status(resp, 400)
        assert words in resp.json()["error"]
    assert not TestRun.objects.exists()
    assert RejectedResult.objects.count() == 3
    assert_status(upload(shard, TF_SAMPLE, name="t.json", hqe=hqe.id, variant="treatment", repeat=3), 201)


def test_names_and_extras_with_copys_special_characters_are_stored_as_sent(fleet, staff):
    """Tab, newline, carriage return and backslash delimit and escape COPY's text rows: in a test's or an
    entry's name, or an extra, they are stored as they were sent, never split into other columns."""
    odd = "a\tb\nc\rd\\e\\N\\t f"
    doc = {
        **TF_SAMPLE,
        "name": f"test {odd}",
        "entries": {
            "entry": [
                {"name": f"BM {odd}", "iters": "7", "wallTime": 1e-300, "cpuTime": 0.0, "throughput": 1.5e300},
                {"name": "\\N", "wallTime": 2.5, "extras": {"s": {"stringValue": f'{odd} "q" \u00e9'}}},
                {"name": "plain", "iters": 2**63 - 1},
            ]
        },
    }
    assert_status(upload(staff, doc), 201)
    rows = {
        e.entry: (e.test, e.wall_time_s, e.cpu_time_s, e.iterations, e.throughput, e.extras)
        for e in TestEntry.objects.all()
    }
    assert rows == {
        f"BM {odd}": (f"test {odd}", 1e-300, 0.0, 7, 1.5e300, {}),
        "\\N": (f"test {odd}", 2.5, None, None, None, {"s": f'{odd} "q" \u00e9'}),
        "plain": (f"test {odd}", None, None, 2**63 - 1, None, {}),
    }
    assert set(DirtySeries.objects.values_list("test", "entry")) == {(f"test {odd}", name) for name in rows}


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("uploads", [2, 3])
def test_a_shards_large_file_sent_again_while_the_first_is_in_flight_is_stored_once(fleet, shard_hqe, uploads):
    """A shard that lost the answer sends the file again, maybe while the first upload is still writing
    its entries: one upload stores the run and its 3,000 entries (COPY), the others answer 200 with that
    run, and a retry after all of them changes nothing either."""
    doc = many_entries(3000)
    barrier = threading.Barrier(uploads)
    answers = []

    def go():
        try:
            barrier.wait()
            resp = upload(client_for(fleet.token1), doc, hqe=shard_hqe.id)
            answers.append((resp.status_code, resp.json()["run"]["id"]))
        finally:
            connection.close()

    threads = [threading.Thread(target=go) for _ in range(uploads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(code for code, _ in answers) == [200] * (uploads - 1) + [201]
    assert len({run for _, run in answers}) == 1
    again = upload(client_for(fleet.token1), doc, hqe=shard_hqe.id)
    assert_status(again, 200)
    assert again.json()["run"]["id"] == answers[0][1]
    assert TestRun.objects.count() == 1
    names = list(TestEntry.objects.values_list("entry", flat=True))
    assert len(names) == len(set(names)) == 3000
    assert DirtySeries.objects.count() == 3000


HOSTILE_NAMES = [
    "\\.",  # COPY's end-of-data marker, were it a line of its own
    "x\n\\.\ny",
    "\r\n\t end \\",
    "\\\\N \\N",
    "\u2028\u2029\u0085 line separators that are not COPY's",
    "\x08\x0c controls",  # json writes \b and \f, no \u escape: the raw file stays plain
    "\U0001f600" * 255,  # at the bound, four bytes each
    "é" * 255,
]


@pytest.mark.parametrize("ascii_only", [True, False], ids=["escaped", "raw-utf8"])
def test_hostile_names_and_extras_are_stored_exactly_whichever_way_the_file_is_read(fleet, staff, ascii_only):
    """COPY's text rows on PostgreSQL, the INSERT on SQLite, the quick read (raw UTF-8, no \\u escape) and
    the full one: a name or an extra with COPY's markers, line separators, controls, non-BMP characters,
    at the length bound, is stored as sent, the same on both databases."""
    extra = "\\.\n\\N\r\u2028\U0001f600\t" + "é" * 1000
    doc = {
        **TF_SAMPLE,
        "name": "t \\. \u2028 \U0001f600\r\n",
        "entries": {
            "entry": [
                *({"name": name, "wallTime": 1.5, "iters": "3"} for name in HOSTILE_NAMES),
                {"name": "with extras", "wallTime": 2.5, "extras": {"k\\.\t\U0001f600": {"stringValue": extra}}},
            ]
        },
    }
    body = json.dumps(doc, ensure_ascii=ascii_only).encode()
    assert plain_bytes(body) is not ascii_only  # the raw file takes the quick read, the escaped one not
    assert_status(upload(staff, body), 201)
    stored = {e.entry: (e.test, e.wall_time_s, e.iterations, e.extras) for e in TestEntry.objects.all()}
    test = doc["name"]
    assert stored == {
        **{name: (test, 1.5, 3, {}) for name in HOSTILE_NAMES},
        "with extras": (test, 2.5, None, {"k\\.\t\U0001f600": extra}),
    }
    assert TestRun.objects.get().test == test


def test_a_negative_zero_time_is_stored_as_zero_on_both_databases(fleet, staff):
    """-0.0 is no negative time, so the parsers take it; stored, it is 0.0 as it always was (PostgreSQL's
    JSON unpacking had no negative zero, and SQLite keeps none), not a -0.0 that COPY would keep."""
    tf = {
        **TF_SAMPLE,
        "entries": {"entry": [{"name": "quick", "wallTime": -0.0, "cpuTime": -0.0, "throughput": -0.0}]},
    }
    gb = {**GB_SAMPLE, "benchmarks": [{"name": "full", "iterations": 1, "real_time": -0.0, "cpu_time": -0.0}]}
    assert_status(upload(staff, tf, name="tf.json"), 201)
    assert_status(upload(staff, gb, name="gb.json"), 201)
    stored = list(TestEntry.objects.values_list("entry", "wall_time_s", "cpu_time_s", "throughput"))
    assert sorted((e, *(None if v is None else math.copysign(1.0, v) for v in values)) for e, *values in stored) == [
        ("full", 1.0, 1.0, None),
        ("quick", 1.0, 1.0, 1.0),
    ]


def test_a_long_fraction_is_stored_as_the_float_it_spells(fleet, staff):
    """19 digits and more of a fraction: read by orjson now (no float of 2**63 or more beside them), they
    must give json's float to the last bit, and COPY must write it back exactly."""
    literals = ["0.000123456789012345678901234567", "1.00000000000000011102230246251565404236316680908203125"]
    body = json.dumps(
        {**TF_SAMPLE, "entries": {"entry": [{"name": f"e{i}", "wallTime": f"@{i}@"} for i in range(2)]}}
    ).encode()
    for i, literal in enumerate(literals):
        body = body.replace(f'"@{i}@"'.encode(), literal.encode())
    assert_status(upload(staff, body), 201)
    stored = dict(TestEntry.objects.values_list("entry", "wall_time_s"))
    assert {k: v.hex() for k, v in stored.items()} == {f"e{i}": float(lit).hex() for i, lit in enumerate(literals)}


def test_a_file_without_entries_costs_no_entries_statement(fleet, staff, django_assert_num_queries):
    """An empty run writes no entries: no COPY of nothing on PostgreSQL, as no INSERT on SQLite."""
    tokens_just_used()
    # token; BEGIN, savepoint, run, release; dirty series (of none); audit record and target; COMMIT
    with django_assert_num_queries(9):
        assert_status(upload(staff, {**TF_SAMPLE, "entries": {}}), 201)
    assert TestRun.objects.get().entry_count == 0 and not TestEntry.objects.exists()
