"""The REST resources: field names, lookups by name, filters, ordering, pagination, and clear errors."""

import pytest

from common.constants import HQEStatus
from common.jobstatus import refresh_job_statuses
from common.models import HostQueueEntry, Job, Label, Shard
from master import services
from tests.fleet_state import snapshot
from tests.master.rows import add_rows
from tests.support import assert_status, tokens_just_used

DESIGN_FIELDS = {
    "label": {"id", "name", "shard"},
    "host": {
        *("id", "hostname", "status", "shard", "labels", "locked", "lock_reason", "attributes"),
        *("origin", "discovered_by", "last_seen"),
    },
    "shard": {"id", "hostname", "labels", "status", "last_heartbeat", "hosts"},
    "job": {"id", "name", "owner", "priority", "status", "shard", "created_on", "hqes"},
    "hqe": {"id", "host", "meta_host", "status", "failure", "exit_code", "started_on", "finished_on"},
}


def results(resp) -> list:
    assert_status(resp, 200)
    return resp.json()["results"]


def test_objects_carry_the_design_field_names(fleet, staff):
    job = fleet.job(meta_hosts=[("board:a", 2)])
    assert DESIGN_FIELDS["label"] <= staff.get("/api/v1/labels/board:a/").json().keys()
    assert DESIGN_FIELDS["host"] <= staff.get("/api/v1/hosts/a1/").json().keys()
    shard = staff.get("/api/v1/shards/lab1/").json()
    assert DESIGN_FIELDS["shard"] <= shard.keys() and "token" not in shard
    body = staff.get(f"/api/v1/jobs/{job.id}/").json()
    assert DESIGN_FIELDS["job"] <= body.keys()
    assert all(DESIGN_FIELDS["hqe"] <= hqe.keys() for hqe in body["hqes"])


def test_objects_name_their_relations(fleet, staff):
    assert staff.get("/api/v1/labels/board:a/").json() == {
        "id": Label.objects.get(name="board:a").id,
        "name": "board:a",
        "shard": "lab1",
    }
    host = staff.get("/api/v1/hosts/a1/").json()
    assert (host["shard"], host["labels"], host["status"]) == ("lab1", ["board:a", "wifi"], "Ready")
    shard = staff.get("/api/v1/shards/lab1/").json()
    assert (shard["labels"], shard["hosts"], shard["status"]) == (["board:a"], ["a1", "a2", "a3"], "offline")
    job = staff.get(f"/api/v1/jobs/{fleet.job().id}/").json()
    assert (job["shard"], job["hqes"][0]["meta_host"], job["hqes"][0]["failure"]) == ("lab1", "board:a", None)


def test_a_shard_is_online_after_a_heartbeat(fleet, staff, heartbeat):
    heartbeat(fleet.lab1, fleet.token1)
    assert staff.get("/api/v1/shards/lab1/").json()["status"] == "online"
    assert staff.get("/api/v1/shards/lab2/").json()["status"] == "offline"


def test_shard_create_returns_its_token_once_and_it_heartbeats(fleet, staff, heartbeat):
    resp = staff.post("/api/v1/shards/", {"hostname": "lab3.example.com", "labels": ["board:c"]}, format="json")
    assert_status(resp, 201)
    body = resp.json()
    assert body["hosts"] == ["c1"] and body["labels"] == ["board:c"]
    assert "token" not in staff.get("/api/v1/shards/lab3.example.com/").json()
    shard = Shard.objects.get(hostname="lab3.example.com")
    assert heartbeat(shard, body["token"])["hosts"][0]["hostname"] == "c1"


def test_dotted_and_coloned_names_are_looked_up(fleet, staff):
    services.create_hosts(["dut.lab1.example.com"], labels=["board:a"], acting_user=None)
    assert staff.get("/api/v1/hosts/dut.lab1.example.com/").json()["shard"] == "lab1"
    assert staff.get("/api/v1/labels/board%3Aa/").json()["name"] == "board:a"


@pytest.mark.parametrize(
    "query, expected",
    [
        ("label=wifi", ["a1", "a2", "b1"]),
        ("shard=lab1", ["a1", "a2", "a3"]),
        ("shard=lab2&label=wifi", ["b1"]),
        ("locked=true", ["a2"]),
        ("locked=false&label=board:a", ["a1", "a3"]),
        ("status=Repairing", ["a3"]),
        ("hostname=c1", ["c1"]),
        ("ordering=-hostname", ["c1", "b1", "a3", "a2", "a1"]),
    ],
)
def test_host_filters_and_ordering(fleet, staff, query, expected):
    services.lock_hosts(["a2"], "broken", acting_user=None)
    from common.models import Host

    Host.objects.filter(hostname="a3").update(status="Repairing")
    assert [h["hostname"] for h in results(staff.get(f"/api/v1/hosts/?{query}"))] == expected


def test_label_filter_by_shard(fleet, staff):
    assert [x["name"] for x in results(staff.get("/api/v1/labels/?shard=lab2"))] == ["board:b"]


def test_job_filters(fleet, staff, user):
    a = fleet.job("a")
    b = fleet.job("b", meta_hosts=[("board:b", 1)])
    user.post("/api/v1/jobs/", {"name": "c", "command": "true", "meta_hosts": ["board:b"]}, format="json")
    HostQueueEntry.objects.filter(job=a).update(status=HQEStatus.COMPLETED)
    refresh_job_statuses([a.id])
    names = lambda q: [j["name"] for j in results(staff.get(f"/api/v1/jobs/?{q}"))]  # noqa: E731
    assert names("") == ["c", "b", "a"]
    assert names("status=Completed") == ["a"]
    assert names("shard=lab2") == ["c", "b"]
    assert names("owner=ana&shard=lab2") == ["c", "b"]
    assert names(f"ids={a.id},{b.id}") == ["b", "a"]
    assert names("ordering=name") == ["a", "b", "c"]


@pytest.mark.parametrize(
    "url, message",
    [
        ("/api/v1/hosts/?label=nosuch", "unknown label nosuch"),
        ("/api/v1/hosts/?shard=nosuch", "unknown shard nosuch"),
        ("/api/v1/jobs/?shard=nosuch", "unknown shard nosuch"),
        ("/api/v1/labels/?shard=nosuch", "unknown shard nosuch"),
        ("/api/v1/hosts/nosuch/", "unknown host nosuch"),
        ("/api/v1/labels/nosuch/", "unknown label nosuch"),
        ("/api/v1/shards/nosuch/", "unknown shard nosuch"),
        ("/api/v1/jobs/999/", "unknown job 999"),
        ("/api/v1/jobs/abc/", "unknown job abc"),
        ("/api/v1/jobs/99999999999999999999999/", "unknown job 99999999999999999999999"),
        ("/api/v1/hosts/a%00b/", "unknown host 'a\\x00b'"),
    ],
)
def test_unknown_names_are_404_naming_them(fleet, staff, url, message):
    resp = staff.get(url)
    assert_status(resp, 404)
    assert resp.json()["error"] == message


@pytest.mark.parametrize(
    "url, message",
    [
        ("/api/v1/hosts/?status=Sleeping", "status: Select a valid choice. Sleeping is not one of the available"),
        ("/api/v1/jobs/?ids=1,x", "invalid job id 'x' in ids"),
    ],
)
def test_bad_filters_are_400_naming_them(fleet, staff, url, message):
    resp = staff.get(url)
    assert_status(resp, 400)
    assert resp.json()["error"].startswith(message)


def test_pagination(fleet, staff):
    page = staff.get("/api/v1/hosts/?limit=2&offset=1").json()
    assert page["count"] == 5
    assert [h["hostname"] for h in page["results"]] == ["a2", "a3"]
    assert "offset=3" in page["next"]
    assert staff.get("/api/v1/hosts/?offset=99999999999999999999999").json()["results"] == []


# Each list and its exact query count: the token with its user, the page's count, its rows and one
# query per prefetched relation (hosts: labels; shards: labels, hosts; jobs: dependency labels, HQEs).
LISTS = [
    ("/api/v1/labels/", 3),
    ("/api/v1/hosts/", 4),
    ("/api/v1/shards/", 5),
    ("/api/v1/jobs/", 5),
]


@pytest.mark.parametrize("url, expected", LISTS)
def test_list_query_count_is_pinned_and_equal_for_one_object_and_many(staff, django_assert_num_queries, url, expected):
    add_rows(0, 1)
    tokens_just_used()
    with django_assert_num_queries(expected):
        one = results(staff.get(url))
    add_rows(1, 119)
    tokens_just_used()
    with django_assert_num_queries(expected):
        many = results(staff.get(url))
    assert len(one) == 1
    assert len(many) == 100  # a full page


# Bad input: a clear error that names the problem, and nothing changed.


@pytest.mark.parametrize(
    "url, body, status, message",
    [
        ("/api/v1/labels/", {"names": ["board:a", "new"]}, 409, "label board:a already exists"),
        ("/api/v1/labels/", {"names": ["bad name"]}, 400, "invalid label name 'bad name'"),
        ("/api/v1/labels/", {"names": []}, 400, "names: Ensure this field has at least 1 elements."),
        ("/api/v1/labels/", {"names": ["a\x00b"]}, 400, "names[0]: Null characters are not allowed."),
        ("/api/v1/labels/delete/", {"names": ["wifi", "nosuch"]}, 404, "unknown label nosuch"),
        ("/api/v1/labels/board:b/add_hosts/", {"hosts": ["c1", "a1"]}, 409, "host a1 would have labels of two shards"),
        ("/api/v1/labels/nosuch/add_hosts/", {"hosts": ["a1"]}, 404, "unknown label nosuch"),
        ("/api/v1/labels/wifi/add_hosts/", {"hosts": ["a3", "zz"]}, 404, "unknown host zz"),
        ("/api/v1/labels/wifi/remove_hosts/", {"hosts": ["a1", "a3"]}, 400, "label wifi is not on host a3"),
        ("/api/v1/hosts/", {"hostnames": ["n1", "a1"]}, 409, "host a1 already exists"),
        (
            "/api/v1/hosts/",
            {"hostnames": ["n1"], "labels": ["board:a", "board:b"]},
            409,
            "host n1 would have labels of two shards: board:a (shard lab1) and board:b (shard lab2)",
        ),
        ("/api/v1/hosts/", {"hostnames": ["n1"], "labels": ["nosuch"]}, 404, "unknown label nosuch"),
        ("/api/v1/hosts/", {"hostnames": ["n1"], "attributes": {"a b": "1"}}, 400, "invalid attribute name 'a b'"),
        (
            "/api/v1/hosts/",
            {"hostnames": ["n1"], "attributes": {"k": ["x"]}},
            400,
            "attributes[k]: Not a valid string.",
        ),
        ("/api/v1/hosts/", {"hostnames": ["n1"], "lock_reason": "why"}, 400, "a lock reason needs --lock"),
        ("/api/v1/hosts/lock/", {"hostnames": ["a1", "zz"]}, 404, "unknown host zz"),
        (
            "/api/v1/shards/",
            {"hostname": "lab3", "labels": ["board:a"]},
            409,
            "label board:a already belongs to shard lab1",
        ),
        ("/api/v1/shards/", {"hostname": "lab1"}, 409, "shard lab1 already exists"),
        (
            "/api/v1/shards/lab1/add_labels/",
            {"labels": ["board:b"]},
            409,
            "label board:b already belongs to shard lab2",
        ),
        ("/api/v1/shards/lab1/remove_label/", {"label": "board:b"}, 400, "label board:b does not belong to shard lab1"),
        ("/api/v1/shards/delete/", {"hostnames": ["lab1", "nosuch"]}, 404, "unknown shard nosuch"),
        (
            "/api/v1/jobs/",
            {"name": "x", "command": "true", "meta_hosts": ["board:a", "board:b"]},
            409,
            "job spans shards: meta-host board:a is served by lab1; meta-host board:b is served by lab2",
        ),
        (
            "/api/v1/jobs/",
            {"name": "x", "command": "true", "meta_hosts": ["board:a"], "priority": "urgent"},
            400,
            "invalid priority 'urgent': use an integer or one of low=10, default=40, high=70, super=80",
        ),
        (
            "/api/v1/jobs/",
            {"name": "x", "command": "true", "meta_hosts": ["board:a"], "priority": True},
            400,
            "priority: must be an integer or a priority name",
        ),
        ("/api/v1/jobs/", {"name": "x", "command": "true", "meta_hosts": ["board:a*x"]}, 400, "invalid meta-host"),
        ("/api/v1/jobs/", {"name": "x", "command": "true", "meta_hosts": ["nosuch"]}, 404, "unknown label nosuch"),
        ("/api/v1/jobs/", {"name": "x", "command": "true"}, 400, "give either meta-hosts (-m) or hosts (--hosts)"),
        (
            "/api/v1/jobs/",
            {"name": "x", "command": "true", "hosts": ["a1"], "timeout_mins": 0},
            400,
            "timeout_mins: Ensure this value is greater than or equal to 1.",
        ),
        (
            "/api/v1/jobs/",
            {"name": "x", "command": "true", "hosts": ["a1"], "parent": 12345},
            404,
            "unknown parent job 12345",
        ),
        (
            "/api/v1/jobs/",
            {"name": "x", "command": "true", "hosts": ["a1"], "keyvals": {"": "v"}},
            400,
            "keyvals: invalid key ''",
        ),
        ("/api/v1/jobs/", {"command": "true", "hosts": ["a1"]}, 400, "name: This field is required."),
        ("/api/v1/jobs/abort/", {"ids": [424242]}, 404, "unknown job 424242"),
        (
            "/api/v1/jobs/",
            {"name": "x", "command": "true", "hosts": ["a1"], "priority": "99999999999"},
            400,
            "priority: must be between",
        ),
        (
            "/api/v1/jobs/",
            {"name": "x", "command": "true", "hosts": ["a1"], "keyvals": {"a\x00": "v"}},
            400,
            "keyvals: NUL and surrogate characters are not allowed",
        ),
        ("/api/v1/hosts/", {"hostnames": ["n" * 300]}, 400, "hostnames[0]: Ensure this field has no more than 255"),
    ],
)
def test_bad_input_is_refused_naming_the_problem_and_changes_nothing(fleet, staff, url, body, status, message):
    before = snapshot()
    resp = staff.post(url, body, format="json")
    assert_status(resp, status)
    assert resp.json()["error"].startswith(message), resp.json()
    assert snapshot() == before


def test_malformed_json_is_a_400(fleet, staff):
    resp = staff.post("/api/v1/labels/", data="{nope", content_type="application/json")
    assert_status(resp, 400)
    assert resp.json()["error"].startswith("JSON parse error")


def test_aborting_a_finished_job_is_refused(fleet, staff):
    job = fleet.job()
    HostQueueEntry.objects.filter(job=job).update(status=HQEStatus.COMPLETED)
    refresh_job_statuses([job.id])
    resp = staff.post(f"/api/v1/jobs/{job.id}/abort/")
    assert_status(resp, 409)
    assert resp.json()["error"] == f"job {job.id} (Completed) already finished"
    assert not Job.objects.get(id=job.id).aborted


def test_job_create_returns_the_routed_job(fleet, staff):
    body = {
        "name": "perf",
        "command": "./run.sh",
        "meta_hosts": ["wifi*2"],
        "dependency_labels": ["board:a"],
        "priority": "high",
        "keyvals": {"build": "R120"},
        "timeout_mins": 30,
        "max_runtime_mins": 5,
    }
    resp = staff.post("/api/v1/jobs/", body, format="json")
    assert_status(resp, 201)
    job = resp.json()
    assert (job["shard"], job["priority"], job["owner"], job["status"]) == ("lab1", 70, "boss", "Queued")
    assert [h["meta_host"] for h in job["hqes"]] == ["wifi", "wifi"]
    assert (job["keyvals"], job["dependency_labels"], job["timeout_mins"]) == ({"build": "R120"}, ["board:a"], 30)


def test_delete_one_label_and_host(fleet, staff):
    resp = staff.delete("/api/v1/labels/pool:x/")
    assert_status(resp, 200)
    assert resp.json() == {"deleted": ["pool:x"], "hosts_moved": []}
    assert_status(staff.delete("/api/v1/hosts/c1/"), 204)
    assert not Label.objects.filter(name="pool:x").exists()
    assert_status(staff.get("/api/v1/hosts/c1/"), 404)


def test_a_shard_with_the_longest_hostname_gets_its_token(fleet, staff):
    resp = staff.post("/api/v1/shards/", {"hostname": "s" * 255}, format="json")
    assert_status(resp, 201)
    assert resp.json()["token"]


# Changes that move hosts between shards say which (finding F).


def test_moves_are_reported_by_every_change_that_moves_hosts(fleet, staff):
    moved = lambda resp: [(m["hostname"], m["from_shard"], m["to_shard"]) for m in resp.json()["hosts_moved"]]  # noqa: E731
    resp = staff.post("/api/v1/labels/board:a/remove_hosts/", {"hosts": ["a3"]}, format="json")
    assert_status(resp, 200)
    assert moved(resp) == [("a3", "lab1", None)]
    assert [h["hostname"] for h in resp.json()["hosts"]] == ["a3"] and resp.json()["label"] == "board:a"
    resp = staff.post("/api/v1/labels/board:a/add_hosts/", {"hosts": ["a3"]}, format="json")
    assert moved(resp) == [("a3", None, "lab1")]
    resp = staff.post("/api/v1/shards/lab1/remove_label/", {"label": "board:a"}, format="json")
    assert moved(resp) == [("a1", "lab1", None), ("a2", "lab1", None), ("a3", "lab1", None)]
    assert resp.json()["hostname"] == "lab1" and resp.json()["hosts"] == []
    resp = staff.post("/api/v1/shards/lab1/add_labels/", {"labels": ["board:a"]}, format="json")
    assert moved(resp) == [("a1", None, "lab1"), ("a2", None, "lab1"), ("a3", None, "lab1")]
    job = fleet.job(meta_hosts=[("board:b", 1)])
    resp = staff.post("/api/v1/shards/delete/", {"hostnames": ["lab2"]}, format="json")
    assert resp.json() == {
        "deleted": ["lab2"],
        "hosts_moved": [{"hostname": "b1", "from_shard": "lab2", "to_shard": None}],
        "jobs_aborted": [job.id],
    }
    resp = staff.post("/api/v1/labels/delete/", {"names": ["wifi", "board:a"]}, format="json")
    assert_status(resp, 200)
    assert moved(resp) == [("a1", "lab1", None), ("a2", "lab1", None), ("a3", "lab1", None)]
