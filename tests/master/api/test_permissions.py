"""Who may do what through the REST API, and which token works where."""

import json

import pytest

from common.models import Job
from master import services
from tests.fleet_state import snapshot
from tests.master.api.conftest import client_for
from tests.support import assert_status


def test_personal_token_is_refused_by_the_heartbeat(fleet, heartbeat):
    _, personal = services.create_personal_token("boss", admin=True, acting_user=None)
    resp = heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1)), personal)
    assert_status(resp, 403)
    assert "personal token cannot heartbeat" in resp.json()["error"]
    fleet.lab1.refresh_from_db()
    assert fleet.lab1.last_heartbeat is None


def test_shard_token_is_refused_by_the_rest_api(fleet):
    resp = client_for(fleet.token1).get("/api/v1/hosts/")
    assert_status(resp, 401)
    assert resp.json()["error"] == "a shard token is only valid for the heartbeat"


@pytest.mark.parametrize("header", ["Bearer fs_not-a-real-token", "Bearer", "Basic dXNlcjpwYXNz"])
def test_unknown_or_malformed_token_is_refused(db, header):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    resp = client.get("/api/v1/labels/")
    assert_status(resp, 401)
    assert resp.json()["error"]


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "Token"])
def test_the_rest_api_takes_a_token_as_bearer_or_drf_token(fleet, scheme):
    from rest_framework.test import APIClient

    _, raw = services.create_personal_token("ana", acting_user=None)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {raw}  ")
    assert_status(client.get("/api/v1/labels/"), 200)


@pytest.mark.parametrize("header", ["Token {raw}", "Bearer ", "{raw}", "Basic {raw}"])
def test_the_heartbeat_takes_only_a_bearer_token(fleet, heartbeat, header):
    before = snapshot()
    body = json.dumps(heartbeat.body(fleet.lab1))
    resp = heartbeat.client.post(
        "/api/v1/heartbeat",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=header.format(raw=fleet.token1),
    )
    assert_status(resp, 401)
    assert resp.json()["error"] == "missing shard token: send 'Authorization: Bearer <shard token>'"
    assert resp.json()["detail"] == {"field": "Authorization"}
    assert snapshot() == before
    assert_status(heartbeat.post_raw(body, fleet.token1), 200)


def test_anonymous_requests_are_refused(fleet, anonymous):
    for url in ("/api/v1/labels/", "/api/v1/hosts/a1/", "/api/v1/shards/", "/api/v1/jobs/"):
        resp = anonymous.get(url)
        assert_status(resp, 401)
        assert "credentials were not provided" in resp.json()["error"]


def test_any_user_reads_everything(fleet, user):
    for url in ("/api/v1/labels/", "/api/v1/hosts/", "/api/v1/hosts/a1/", "/api/v1/shards/lab1/", "/api/v1/jobs/"):
        assert_status(user.get(url), 200)


# Each write, the permissions the admin asks for to do the same (master/admin/), and what it does.
WRITES = [
    ("/api/v1/labels/", {"names": ["new"]}, ["add_label"], "create labels"),
    ("/api/v1/labels/delete/", {"names": ["wifi"]}, ["change_label"], "delete labels"),
    ("/api/v1/labels/wifi/add_hosts/", {"hosts": ["a3"]}, ["change_host"], "change the labels of hosts"),
    ("/api/v1/labels/wifi/remove_hosts/", {"hosts": ["a1"]}, ["change_host"], "change the labels of hosts"),
    ("/api/v1/hosts/", {"hostnames": ["new"]}, ["add_host"], "create hosts"),
    ("/api/v1/hosts/lock/", {"hostnames": ["a1"], "reason": "mine"}, ["change_host"], "lock hosts"),
    ("/api/v1/hosts/unlock/", {"hostnames": ["a1"]}, ["change_host"], "unlock hosts"),
    ("/api/v1/hosts/delete/", {"hostnames": ["a1"]}, ["change_host"], "delete hosts"),
    ("/api/v1/shards/", {"hostname": "lab3"}, ["add_shard", "change_shard"], "create shards"),
    ("/api/v1/shards/lab1/add_labels/", {"labels": ["board:c"]}, ["change_shard"], "change the labels of shards"),
    ("/api/v1/shards/lab1/remove_label/", {"label": "board:a"}, ["change_shard"], "change the labels of shards"),
    ("/api/v1/shards/delete/", {"hostnames": ["lab1"]}, ["change_shard"], "delete shards"),
]


def staff_with(django_user_model, username: str, codenames: list[str]):
    """A staff account (not superuser) holding exactly these permissions, and its API client."""
    from django.contrib.auth.models import Permission

    django_user_model.objects.create_user(username, is_staff=True)
    django_user_model.objects.get(username=username).user_permissions.set(
        Permission.objects.filter(content_type__app_label="common", codename__in=codenames)
    )
    return client_for(services.create_personal_token(username, acting_user=None)[1])


def needs(perms: list[str]) -> str:
    return " and ".join(f"common.{p}" for p in perms) + (" permissions" if len(perms) > 1 else " permission")


@pytest.mark.parametrize("url, body, perms, what", WRITES)
def test_writes_need_the_admins_permissions(fleet, user, django_user_model, url, body, perms, what):
    before = snapshot()
    message = f"only staff with the {needs(perms)} may {what}"
    # A plain user, and staff without permissions: the admin refuses them both, and so does the API.
    for client in (user, staff_with(django_user_model, "idle-staff", [])):
        resp = client.post(url, body, format="json")
        assert_status(resp, 403)
        assert resp.json()["error"] == message
        assert snapshot() == before
    # Staff holding every permission but one of those needed are refused too.
    for missing in perms:
        partial = staff_with(django_user_model, f"without-{missing}", [p for p in perms if p != missing])
        assert_status(partial.post(url, body, format="json"), 403)
        assert snapshot() == before
    # Exactly the admin's permissions are enough.
    able = staff_with(django_user_model, "able-staff", perms)
    assert able.post(url, body, format="json").status_code in (200, 201, 204), url
    assert snapshot() != before


def test_permissions_without_staff_status_are_not_enough(fleet, django_user_model):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("not-staff")
    user.user_permissions.set(Permission.objects.filter(codename="change_host"))
    client = client_for(services.create_personal_token("not-staff", acting_user=None)[1])
    before = snapshot()
    assert_status(client.post("/api/v1/hosts/lock/", {"hostnames": ["a1"]}, format="json"), 403)
    assert snapshot() == before


def test_staff_without_permissions_get_no_shard_token(fleet, django_user_model):
    from master.models import Token

    idle = staff_with(django_user_model, "idle-staff", [])
    adder = staff_with(django_user_model, "adder", ["add_shard"])
    for client in (idle, adder):
        resp = client.post("/api/v1/shards/", {"hostname": "lab9", "labels": ["board:c"]}, format="json")
        assert_status(resp, 403)
        assert "token" not in resp.json()
    assert not Token.objects.filter(shard__hostname="lab9").exists()


@pytest.mark.parametrize(
    "url, perm",
    [
        ("/api/v1/labels/wifi/", "change_label"),
        ("/api/v1/hosts/a1/", "change_host"),
        ("/api/v1/shards/lab2/", "change_shard"),
    ],
)
def test_deleting_one_object_needs_the_admins_permission(fleet, user, staff, django_user_model, url, perm):
    before = snapshot()
    assert_status(user.delete(url), 403)
    assert_status(staff_with(django_user_model, "idle-staff", []).delete(url), 403)
    assert snapshot() == before
    assert staff_with(django_user_model, "able-staff", [perm]).delete(url).status_code in (200, 204)
    assert_status(staff.get(url), 404)


def test_any_user_creates_jobs_as_themselves(fleet, user):
    resp = user.post("/api/v1/jobs/", {"name": "mine", "command": "true", "meta_hosts": ["board:a"]}, format="json")
    assert_status(resp, 201)
    assert resp.json()["owner"] == "ana"
    assert Job.objects.get().owner == "ana"


def test_owner_can_abort_their_job(fleet, user):
    job = fleet.job()  # owned by ana
    resp = user.post(f"/api/v1/jobs/{job.id}/abort/")
    assert_status(resp, 200)
    assert resp.json()["aborted"] is True


def test_non_owner_non_staff_cannot_abort(fleet, other_user):
    job = fleet.job()
    version = job.version
    resp = other_user.post(f"/api/v1/jobs/{job.id}/abort/")
    assert_status(resp, 403)
    assert resp.json()["error"] == "only the job's owner or staff with the common.change_job permission may abort it"
    resp = other_user.post("/api/v1/jobs/abort/", {"ids": [job.id]}, format="json")
    assert_status(resp, 403)
    assert f"not yours: job {job.id} (owner ana)" in resp.json()["error"]
    job.refresh_from_db()
    assert job.aborted is False and job.version == version


def test_bulk_abort_is_all_or_nothing_for_permissions(fleet, other_user):
    mine = services.create_job(
        services.JobRequest(name="b", owner="bob", command="true", meta_hosts=[("board:a", 1)]), acting_user=None
    )
    theirs = fleet.job()
    resp = other_user.post("/api/v1/jobs/abort/", {"ids": [mine.id, theirs.id]}, format="json")
    assert_status(resp, 403)
    assert not Job.objects.filter(aborted=True).exists()


def test_staff_can_abort_any_job(fleet, staff):
    job = fleet.job()
    resp = staff.post("/api/v1/jobs/abort/", {"ids": [job.id]}, format="json")
    assert_status(resp, 200)
    assert [j["id"] for j in resp.json()] == [job.id]
    job.refresh_from_db()
    assert job.aborted


def test_session_login_works_for_the_browsable_api(fleet, client, django_user_model):
    django_user_model.objects.create_user("carla", password="secret-pass")
    assert_status(client.get("/api/v1/auth/login/"), 200)
    assert client.login(username="carla", password="secret-pass")
    resp = client.get("/api/v1/hosts/", HTTP_ACCEPT="text/html")
    assert_status(resp, 200)
    assert b"a1" in resp.content
    assert client.get("/api/v1/hosts/a1/", HTTP_ACCEPT="application/json").json()["hostname"] == "a1"


def test_staff_need_change_job_to_abort_others_jobs(fleet, django_user_model):
    job = fleet.job()  # owned by ana
    idle = staff_with(django_user_model, "idle-staff", [])
    assert_status(idle.post(f"/api/v1/jobs/{job.id}/abort/"), 403)
    assert_status(idle.post("/api/v1/jobs/abort/", {"ids": [job.id]}, format="json"), 403)
    job.refresh_from_db()
    assert not job.aborted
    able = staff_with(django_user_model, "able-staff", ["change_job"])
    assert_status(able.post("/api/v1/jobs/abort/", {"ids": [job.id]}, format="json"), 200)
    job.refresh_from_db()
    assert job.aborted
