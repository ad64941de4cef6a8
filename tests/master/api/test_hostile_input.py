"""Hostile input to the REST API (findings A, B, D, G): always a 400 (or the service's 409) that names
what is wrong, never a 5xx, and nothing changed."""

import json
from urllib.parse import quote

import pytest

from common.models import Job
from tests.fleet_state import snapshot
from tests.support import assert_status

JOB = {"name": "x", "command": "true", "meta_hosts": ["board:a"]}


def post_raw(client, url: str, raw: str | bytes):
    return client.post(url, data=raw, content_type="application/json")


@pytest.mark.parametrize(
    "url, body, status, message",
    [
        # B. Unicode digits and other non-integers as a priority.
        ("/api/v1/jobs/", {**JOB, "priority": "²"}, 400, "invalid priority '²': use an integer or one of"),
        ("/api/v1/jobs/", {**JOB, "priority": "٣"}, 400, "invalid priority '٣'"),
        ("/api/v1/jobs/", {**JOB, "priority": "1_0"}, 400, "invalid priority '1_0'"),
        ("/api/v1/jobs/", {**JOB, "priority": "9" * 5000}, 400, "priority: must be between"),
        ("/api/v1/jobs/", {**JOB, "priority": 2**70}, 400, "priority: must be between"),
        ("/api/v1/jobs/", {**JOB, "priority": 1.5}, 400, "priority: must be an integer or a priority name"),
        # B. Out-of-range integers.
        ("/api/v1/jobs/", {**JOB, "timeout_mins": -1}, 400, "timeout_mins: Ensure this value is greater than"),
        ("/api/v1/jobs/", {**JOB, "timeout_mins": 2**40}, 400, "timeout_mins: Ensure this value is less than"),
        ("/api/v1/jobs/", {**JOB, "max_runtime_mins": 10**30}, 400, "max_runtime_mins: Ensure this value is less"),
        ("/api/v1/jobs/", {**JOB, "parent": 2**70}, 400, "parent: Ensure this value is less than"),
        ("/api/v1/jobs/abort/", {"ids": [2**64]}, 400, "ids[0]: Ensure this value is less than"),
        # B. NUL in any stored string, naming the field.
        ("/api/v1/jobs/", {**JOB, "command": "true\x00"}, 400, "command: Null characters are not allowed."),
        ("/api/v1/jobs/", {**JOB, "name": "a\x00"}, 400, "name: Null characters are not allowed."),
        ("/api/v1/jobs/", {**JOB, "meta_hosts": ["board:a\x00"]}, 400, "meta_hosts[0]: Null characters"),
        ("/api/v1/jobs/", {**JOB, "dependency_labels": ["\x00"]}, 400, "dependency_labels[0]: Null characters"),
        ("/api/v1/jobs/", {**JOB, "keyvals": {"k": "\x00"}}, 400, "keyvals[k]: Null characters are not allowed."),
        ("/api/v1/hosts/", {"hostnames": ["n\x00"]}, 400, "hostnames[0]: Null characters are not allowed."),
        ("/api/v1/hosts/", {"hostnames": ["n1"], "attributes": {"k": "\x00"}}, 400, "attributes[k]: Null"),
        ("/api/v1/hosts/lock/", {"hostnames": ["a1"], "reason": "\x00"}, 400, "reason: Null characters"),
        ("/api/v1/shards/", {"hostname": "lab\x00"}, 400, "hostname: Null characters are not allowed."),
        ("/api/v1/shards/lab1/remove_label/", {"label": "\x00"}, 400, "label: Null characters are not allowed."),
        # B. Keyvals that are not a flat map of short strings.
        ("/api/v1/jobs/", {**JOB, "keyvals": {"k": {"nested": "x"}}}, 400, "keyvals[k]: Not a valid string."),
        ("/api/v1/jobs/", {**JOB, "keyvals": ["k"]}, 400, "keyvals: Expected a dictionary of items"),
        ("/api/v1/jobs/", {**JOB, "keyvals": {"k": "v" * 2000}}, 400, "keyvals[k]: Ensure this field has no more"),
        (
            "/api/v1/jobs/",
            {**JOB, "keyvals": {f"k{i}": "v" for i in range(300)}},
            400,
            "keyvals may have at most 256 entries; this one has 300",
        ),
        ("/api/v1/jobs/", {**JOB, "keyvals": {"a=b": "v"}}, 400, "invalid keyval name 'a=b'"),
        # D. Names.
        (
            "/api/v1/hosts/",
            {"hostnames": ["a/b"]},
            400,
            "invalid host name 'a/b': use letters, digits and . - _ : @ + = (no '..'",
        ),
        ("/api/v1/hosts/", {"hostnames": ["../../etc"]}, 400, "invalid host name '../../etc'"),
        ("/api/v1/labels/", {"names": ["board:\u202ex"]}, 400, "invalid label name 'board:\\u202ex'"),
        ("/api/v1/labels/", {"names": ["a\x1bb"]}, 400, "invalid label name 'a\\x1bb'"),
        ("/api/v1/shards/", {"hostname": ".."}, 400, "invalid shard name '..'"),
        ("/api/v1/jobs/", {**JOB, "meta_hosts": ["board:a*1_0"]}, 400, "invalid meta-host 'board:a*1_0'"),
        ("/api/v1/jobs/", {**JOB, "meta_hosts": ["board:a*٣"]}, 400, "invalid meta-host 'board:a*٣'"),
        ("/api/v1/jobs/", {**JOB, "meta_hosts": ["board:a*+3"]}, 400, "invalid meta-host 'board:a*+3'"),
        ("/api/v1/jobs/", {**JOB, "meta_hosts": ["board:a* 3"]}, 400, "invalid meta-host 'board:a* 3'"),
        # A. A job's size.
        (
            "/api/v1/jobs/",
            {**JOB, "meta_hosts": ["board:b*100000"]},
            400,
            "a job may have at most 500 host queue entries; this one asks for 100000",
        ),
        # G. More hosts than the shard has.
        (
            "/api/v1/jobs/",
            {**JOB, "meta_hosts": ["board:b*2"]},
            409,
            "job asks for 2 hosts with board:b but shard lab2 has 1",
        ),
    ],
)
def test_hostile_values_are_a_400_naming_the_field(fleet, staff, url, body, status, message):
    before = snapshot()
    resp = staff.post(url, body, format="json")
    assert_status(resp, status)
    assert resp.json()["error"].startswith(message), resp.json()
    assert snapshot() == before


@pytest.mark.parametrize(
    "url, raw, message",
    [
        ("/api/v1/labels/", '{"names": ["\\ud800"]}', "names[0]: Surrogate characters are not allowed"),
        ("/api/v1/hosts/", '{"hostnames": ["n1"], "attributes": {"\\udfff": "v"}}', "attributes: NUL and surrogate"),
        ("/api/v1/hosts/", '{"hostnames": ["n1"], "lock_reason": "\\ud83d", "locked": true}', "lock_reason: Surrogate"),
    ],
)
def test_lone_surrogates_are_a_400(fleet, staff, url, raw, message):
    before = snapshot()
    resp = post_raw(staff, url, raw)
    assert_status(resp, 400)
    assert resp.json()["error"].startswith(message)
    assert snapshot() == before


def test_surrogates_in_a_job_are_a_400(fleet, staff):
    resp = post_raw(staff, "/api/v1/jobs/", '{"name": "\\ud800", "command": "true", "meta_hosts": ["board:a"]}')
    assert_status(resp, 400)
    assert resp.json()["error"].startswith("name: Surrogate characters are not allowed")
    assert not Job.objects.exists()


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_json_nested_deeper_than_32_levels_is_a_400(fleet, staff, depth):
    before = snapshot()
    for raw in ("[" * depth + "]" * depth, '{"names": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"):
        resp = post_raw(staff, "/api/v1/labels/", raw)
        assert_status(resp, 400)
        assert resp.json()["error"] == "JSON parse error - JSON nested deeper than 32 levels"
    unclosed = post_raw(staff, "/api/v1/labels/", "[" * depth)
    assert_status(unclosed, 400)
    assert unclosed.json()["error"].startswith("JSON parse error")
    assert snapshot() == before


def test_json_nested_32_levels_is_parsed(fleet, staff):
    raw = '{"names": ' + "[" * 31 + "]" * 31 + "}"  # 32 levels: parsed, then refused as not names
    resp = post_raw(staff, "/api/v1/labels/", raw)
    assert_status(resp, 400)
    assert "nested" not in resp.json()["error"]
    quoted = json.dumps({"names": ["[" * 100 + "{" * 100]})  # brackets inside strings are text
    assert post_raw(staff, "/api/v1/labels/", quoted).json()["error"].startswith("invalid label name '[[[")


def test_a_body_that_is_not_utf8_is_a_400(fleet, staff):
    resp = post_raw(staff, "/api/v1/labels/", b'{"names": ["\xff"]}')
    assert_status(resp, 400)
    assert resp.json()["error"].startswith("JSON parse error")


@pytest.mark.parametrize(
    "url, param",
    [
        ("/api/v1/hosts/?label=a%00", "label"),
        ("/api/v1/hosts/?hostname=a%00", "hostname"),
        ("/api/v1/jobs/?owner=%00", "owner"),
        ("/api/v1/jobs/?name=x%00", "name"),
        ("/api/v1/labels/?shard=%00", "shard"),
    ],
)
def test_a_nul_in_a_filter_is_a_400_naming_it(fleet, staff, url, param):
    resp = staff.get(url)
    assert_status(resp, 400)
    assert resp.json()["error"] == f"{param}: Null characters are not allowed."


def test_a_label_named_twice_is_merged_not_a_500(fleet, staff):
    body = {**JOB, "meta_hosts": ["board:a*1", "board:a*1", "wifi*1"]}
    resp = staff.post("/api/v1/jobs/", body, format="json")
    assert_status(resp, 201)
    assert sorted(h["meta_host"] for h in resp.json()["hqes"]) == ["board:a", "board:a", "wifi"]
    resp = staff.post("/api/v1/jobs/", {**JOB, "meta_hosts": ["board:a*2,board:a*2"]}, format="json")
    assert_status(resp, 409)
    assert resp.json()["error"] == "job asks for 4 hosts with board:a but shard lab1 has 3"


def test_django_own_400s_are_json_under_the_api(fleet):
    from django.test import Client

    resp = Client(raise_request_exception=False).get("/api/v1/labels/", HTTP_HOST="&D'+")
    assert_status(resp, 400)
    assert resp["Content-Type"] == "application/json" and resp.json() == {"error": "Bad Request", "detail": None}


@pytest.mark.parametrize(
    "url, body, message",
    [
        ("/api/v1/labels/", {"names": [f"l{i}" for i in range(40_000)]}, "names: Ensure this field has no more than"),
        ("/api/v1/hosts/", {"hostnames": ["n1"], "labels": ["x"] * 40_000}, "labels: Ensure this field has no more"),
        ("/api/v1/jobs/", {**JOB, "dependency_labels": ["x"] * 40_000}, "dependency_labels: Ensure this field"),
        ("/api/v1/jobs/abort/", {"ids": list(range(1, 40_001))}, "ids: Ensure this field has no more than"),
    ],
)
def test_lists_longer_than_a_query_can_bind_are_a_400(fleet, staff, url, body, message):
    before = snapshot()
    resp = staff.post(url, body, format="json")
    assert_status(resp, 400)
    assert resp.json()["error"].startswith(message)
    assert snapshot() == before


@pytest.mark.timeout(60)
def test_a_name_pattern_of_many_stars_answers_at_once_and_right(fleet, staff):
    """`*a*a*...*b` read as plain `.*` by Python's re (SQLite's REGEXP) tried every split of a name:
    one request held a worker for hours. Each star now takes the first place its text fits."""
    fleet.job("a" * 200)
    fleet.job("a.b-c")

    def names(pattern: str) -> list[str]:
        resp = staff.get(f"/api/v1/jobs/?name_like={quote(pattern)}")
        assert_status(resp, 200)
        return sorted(j["name"] for j in resp.json()["results"])

    assert names("*" * 254 + "b") == []
    assert names("*a" * 100 + "*b") == []
    assert names("*a" * 100 + "*") == ["a" * 200]
    assert names("a*.?-*") == ["a.b-c"]
    assert names("*.*") == ["a.b-c"]
    assert names("a?c*") == []
    resp = staff.get("/api/v1/jobs/?name_like=" + "*" * 256)
    assert_status(resp, 400)
    assert "use 1 to 255 printable characters" in resp.json()["error"]
