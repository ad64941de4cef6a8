"""POST /api/v1/results/quarantined: a shard reports the result files it set aside without sending
them, and they show where the master's own refusals do (the job's stat, the admin)."""

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from common.constants import MAX_RESULT_FILES_PER_RUN, MAX_RESULT_REASON_CHARS
from common.result_formats import ResultFormatError
from master.models import RejectedResult
from master.results.ingest import UNSENT_DIGEST, record_rejection
from tests.master.api.conftest import client_for
from tests.support import assert_status

URL = "/api/v1/results/quarantined"
LINK = "not sent: a symbolic link"


def report(client, hqe, reason=LINK, name="link.json", raw_query: str | None = None):
    query = raw_query if raw_query is not None else f"name={name}&hqe={hqe}"
    body = reason if isinstance(reason, dict) else {"reason": reason}
    return client.post(f"{URL}?{query}", data=json.dumps(body), content_type="application/json")


def rows():
    return list(RejectedResult.objects.order_by("id").values_list("hqe_id", "name", "digest", "reason"))


def test_a_shards_report_is_recorded_once_and_a_retry_changes_nothing(fleet, shard_hqe):
    shard = client_for(fleet.token1)
    first = report(shard, shard_hqe.id)
    assert_status(first, 201)
    assert first.json() == {"created": True, "quarantined": {"name": "link.json", "reason": LINK}}
    again = report(shard, shard_hqe.id, reason="not sent: another reason on a retry")
    assert_status(again, 200)
    assert again.json() == {"created": False, "quarantined": {"name": "link.json", "reason": LINK}}
    assert rows() == [(shard_hqe.id, "link.json", UNSENT_DIGEST, LINK)]


def test_a_report_costs_a_pinned_number_of_queries(fleet, shard_hqe, django_assert_num_queries):
    shard = client_for(fleet.token1)
    report(shard, shard_hqe.id, name="warm.json")  # the token's last_used is written once in 5 minutes
    # The token, the HQE with its job, then in the service's transaction (a savepoint inside the
    # test's): the HQE held against a purge, the file reported before?, the HQE's count, and the insert
    # in a savepoint of its own.
    with django_assert_num_queries(10):
        assert_status(report(shard, shard_hqe.id), 201)
    with django_assert_num_queries(6):
        assert_status(report(shard, shard_hqe.id), 200)


def test_the_job_stat_lists_the_shards_and_the_masters_refusals_together(fleet, shard_hqe, staff):
    record_rejection(shard_hqe, "broken.json", b"{", ResultFormatError("broken.json", "", "not JSON"))
    report(client_for(fleet.token1), shard_hqe.id, reason="not sent: larger than 16777216 bytes", name="huge.json")
    (hqe,) = staff.get(f"/api/v1/jobs/{shard_hqe.job_id}/").json()["hqes"]
    assert sorted((q["name"], q["reason"]) for q in hqe["quarantined"]) == [
        ("broken.json", "broken.json: not JSON"),
        ("huge.json", "not sent: larger than 16777216 bytes"),
    ]


def test_the_admin_says_which_side_refused_each_file(fleet, shard_hqe):
    record_rejection(shard_hqe, "broken.json", b"{", ResultFormatError("broken.json", "", "not JSON"))
    report(client_for(fleet.token1), shard_hqe.id)
    operator = Client()
    operator.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    cl = operator.get("/admin/master/rejectedresult/").context["cl"]
    admin = cl.model_admin
    assert sorted((r.name, admin.refused_by(r)) for r in cl.result_list) == [
        ("broken.json", "master"),
        ("link.json", "shard"),
    ]
    shard_row = RejectedResult.objects.get(name="link.json")
    page = operator.get(f"/admin/master/rejectedresult/{shard_row.id}/change/").content.decode()
    assert LINK in page and "shard" in page


def test_only_a_shard_reports_and_only_for_its_own_hqes(fleet, shard_hqe, staff):
    other = report(client_for(fleet.token2), shard_hqe.id)
    assert_status(other, 403)
    assert other.json() == {
        "error": f"hqe: HQE {shard_hqe.id} is not of a job on shard lab2",
        "detail": {"field": "hqe"},
    }
    unknown = report(client_for(fleet.token1), 10**9)
    assert (unknown.status_code, unknown.json()["detail"]) == (404, {"field": "hqe"})
    person = report(staff, shard_hqe.id)
    assert_status(person, 403)
    assert "only a shard's token" in person.json()["error"]
    assert_status(report(client_for(None), shard_hqe.id), 401)
    assert_status(report(client_for("fs_nope"), shard_hqe.id), 401)
    assert rows() == []


@pytest.mark.parametrize(
    "query, body, field",
    [
        ("name=a.json", {"reason": LINK}, "hqe"),
        ("name=a.json&hqe=x", {"reason": LINK}, "hqe"),
        ("hqe={hqe}", {"reason": LINK}, "name"),
        ("name=" + "n" * 256 + "&hqe={hqe}", {"reason": LINK}, "name"),
        ("name=a%00.json&hqe={hqe}", {"reason": LINK}, "name"),
        ("name=a.json&hqe={hqe}", {}, "reason"),
        ("name=a.json&hqe={hqe}", {"reason": "  "}, "reason"),
        ("name=a.json&hqe={hqe}", {"reason": "x" * (MAX_RESULT_REASON_CHARS + 1)}, "reason"),
        ("name=a.json&hqe={hqe}", {"reason": "nul\x00"}, "reason"),
    ],
)
def test_bad_parameters_are_400_naming_them_and_record_nothing(fleet, shard_hqe, query, body, field):
    resp = report(client_for(fleet.token1), shard_hqe.id, reason=body, raw_query=query.format(hqe=shard_hqe.id))
    assert_status(resp, 400)
    error = resp.json()
    assert error["detail"] == {"field": field} or field in error["detail"], error
    assert rows() == []


def test_a_name_that_is_no_utf8_is_kept_readable(fleet, shard_hqe):
    resp = report(client_for(fleet.token1), shard_hqe.id, raw_query=f"name=caf%E9%0A.json&hqe={shard_hqe.id}")
    assert_status(resp, 201)
    assert rows() == [(shard_hqe.id, "caf\ufffd\n.json", UNSENT_DIGEST, LINK)]


def test_an_hqe_takes_a_bounded_number_of_reports(fleet, shard_hqe):
    RejectedResult.objects.bulk_create(
        RejectedResult(hqe=shard_hqe, name=f"r{i}.json", digest=UNSENT_DIGEST, reason=LINK)
        for i in range(MAX_RESULT_FILES_PER_RUN)
    )
    shard = client_for(fleet.token1)
    full = report(shard, shard_hqe.id, name="one-more.json")
    assert_status(full, 400)
    assert full.json()["error"] == (
        f"hqe: HQE {shard_hqe.id} has {MAX_RESULT_FILES_PER_RUN} quarantined files reported already"
    )
    # A retry of a file it has is still answered: the shard's retries stay idempotent at the bound.
    assert_status(report(shard, shard_hqe.id, name="r0.json"), 200)
    assert RejectedResult.objects.count() == MAX_RESULT_FILES_PER_RUN
