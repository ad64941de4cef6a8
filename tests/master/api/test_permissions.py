"""Who may do what through the REST API, and which token works where."""

import json

import pytest

from common.models import Job
from master import services
from tests.fleet_state import snapshot
from tests.master.api.conftest import client_for


def test_personal_token_is_refused_by_the_heartbeat(fleet, heartbeat):
    _, personal = services.create_personal_token("boss", admin=True)
    resp = heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1)), personal)
    assert resp.status_code == 403
    assert "personal token cannot heartbeat" in resp.json()["error"]
    fleet.lab1.refresh_from_db()
    assert fleet.lab1.last_heartbeat is None


def test_shard_token_is_refused_by_the_rest_api(fleet):
    resp = client_for(fleet.token1).get("/api/v1/hosts/")
    assert resp.status_code == 401
    assert resp.json()["error"] == "a shard token is only valid for the heartbeat"


@pytest.mark.parametrize("header", ["Bearer fs_not-a-real-token", "Bearer", "Basic dXNlcjpwYXNz"])
def test_unknown_or_malformed_token_is_refused(db, header):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    resp = client.get("/api/v1/labels/")
    assert resp.status_code == 401
    assert resp.json()["error"]


def test_anonymous_requests_are_refused(fleet, anonymous):
    for url in ("/api/v1/labels/", "/api/v1/hosts/a1/", "/api/v1/shards/", "/api/v1/jobs/"):
        resp = anonymous.get(url)
        assert resp.status_code == 401, url
        assert "credentials were not provided" in resp.json()["error"]


def test_any_user_reads_everything(fleet, user):
    for url in ("/api/v1/labels/", "/api/v1/hosts/", "/api/v1/hosts/a1/", "/api/v1/shards/lab1/", "/api/v1/jobs/"):
        assert user.get(url).status_code == 200, url


@pytest.mark.parametrize(
    "url, body",
    [
        ("/api/v1/labels/", {"names": ["new"]}),
        ("/api/v1/labels/delete/", {"names": ["wifi"]}),
        ("/api/v1/labels/wifi/add_hosts/", {"hosts": ["a3"]}),
        ("/api/v1/labels/wifi/remove_hosts/", {"hosts": ["a1"]}),
        ("/api/v1/hosts/", {"hostnames": ["new"]}),
        ("/api/v1/hosts/lock/", {"hostnames": ["a1"], "reason": "mine"}),
        ("/api/v1/hosts/unlock/", {"hostnames": ["a1"]}),
        ("/api/v1/hosts/delete/", {"hostnames": ["a1"]}),
        ("/api/v1/shards/", {"hostname": "lab3"}),
        ("/api/v1/shards/lab1/add_labels/", {"labels": ["board:c"]}),
        ("/api/v1/shards/lab1/remove_label/", {"label": "board:a"}),
        ("/api/v1/shards/delete/", {"hostnames": ["lab1"]}),
    ],
)
def test_only_staff_manage_labels_hosts_and_shards(fleet, user, staff, url, body):
    before = snapshot()
    resp = user.post(url, body, format="json")
    assert resp.status_code == 403
    assert resp.json()["error"] == "only staff may change labels, hosts and shards"
    assert snapshot() == before
    assert staff.post(url, body, format="json").status_code in (200, 201, 204)
    assert snapshot() != before


@pytest.mark.parametrize("url", ["/api/v1/labels/wifi/", "/api/v1/hosts/a1/", "/api/v1/shards/lab2/"])
def test_only_staff_delete_one_object(fleet, user, staff, url):
    before = snapshot()
    assert user.delete(url).status_code == 403
    assert snapshot() == before
    assert staff.delete(url).status_code == 204
    assert staff.get(url).status_code == 404


def test_any_user_creates_jobs_as_themselves(fleet, user):
    resp = user.post("/api/v1/jobs/", {"name": "mine", "command": "true", "meta_hosts": ["board:a"]}, format="json")
    assert resp.status_code == 201
    assert resp.json()["owner"] == "ana"
    assert Job.objects.get().owner == "ana"


def test_owner_can_abort_their_job(fleet, user):
    job = fleet.job()  # owned by ana
    resp = user.post(f"/api/v1/jobs/{job.id}/abort/")
    assert resp.status_code == 200
    assert resp.json()["aborted"] is True


def test_non_owner_non_staff_cannot_abort(fleet, other_user):
    job = fleet.job()
    version = job.version
    resp = other_user.post(f"/api/v1/jobs/{job.id}/abort/")
    assert resp.status_code == 403
    assert resp.json()["error"] == "only the job's owner or staff may abort it"
    resp = other_user.post("/api/v1/jobs/abort/", {"ids": [job.id]}, format="json")
    assert resp.status_code == 403
    assert f"not yours: job {job.id} (owner ana)" in resp.json()["error"]
    job.refresh_from_db()
    assert job.aborted is False and job.version == version


def test_bulk_abort_is_all_or_nothing_for_permissions(fleet, other_user):
    mine = services.create_job(services.JobRequest(name="b", owner="bob", command="true", meta_hosts=[("board:a", 1)]))
    theirs = fleet.job()
    resp = other_user.post("/api/v1/jobs/abort/", {"ids": [mine.id, theirs.id]}, format="json")
    assert resp.status_code == 403
    assert not Job.objects.filter(aborted=True).exists()


def test_staff_can_abort_any_job(fleet, staff):
    job = fleet.job()
    resp = staff.post("/api/v1/jobs/abort/", {"ids": [job.id]}, format="json")
    assert resp.status_code == 200
    assert [j["id"] for j in resp.json()] == [job.id]
    job.refresh_from_db()
    assert job.aborted


def test_session_login_works_for_the_browsable_api(fleet, client, django_user_model):
    django_user_model.objects.create_user("carla", password="secret-pass")
    assert client.get("/api/v1/auth/login/").status_code == 200
    assert client.login(username="carla", password="secret-pass")
    resp = client.get("/api/v1/hosts/", HTTP_ACCEPT="text/html")
    assert resp.status_code == 200
    assert b"a1" in resp.content
    assert client.get("/api/v1/hosts/a1/", HTTP_ACCEPT="application/json").json()["hostname"] == "a1"
