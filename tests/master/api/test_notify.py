"""The notification subscriptions' REST endpoints, their answers checked against docs/openapi.yaml."""

import pytest

from master.notify.models import Delivery, Subscription
from tests.support import assert_status

pytestmark = pytest.mark.django_db


def test_create_shows_the_secret_once_and_lists_never(user):
    resp = user.post(
        "/api/v1/notifications/",
        {"url": "https://hooks.example.org/x", "events": ["job.ended", "regression.new"], "owner": "ana"},
        format="json",
    )
    assert_status(resp, 201)
    body = resp.json()
    assert body["secret"] == Subscription.objects.get().secret
    assert (body["events"], body["owner"], body["label"], body["format"]) == (
        ["job.ended", "regression.new"],
        "ana",
        "",
        "json",
    )
    listed = user.get("/api/v1/notifications/").json()["results"]
    assert [s["id"] for s in listed] == [body["id"]] and "secret" not in listed[0]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": "gopher://x.example.org/", "events": ["job.ended"]}, "url"),
        ({"url": "https://x.example.org/", "events": ["job.started"]}, "events"),
        ({"url": "https://x.example.org/", "events": []}, "events"),
        ({"url": "https://x.example.org/", "events": ["job.ended"], "format": "xml"}, "format"),
        ({"email": "a@b.org", "url": "https://x.example.org/", "events": ["job.ended"]}, "url"),
        ({"url": "https://x.example.org/\x00", "events": ["job.ended"]}, "url"),
    ],
)
def test_bad_subscriptions_are_a_400_naming_the_field(user, body, field):
    resp = user.post("/api/v1/notifications/", body, format="json")
    assert_status(resp, 400)
    assert field in resp.content.decode()
    assert not Subscription.objects.exists()


def test_test_queues_a_delivery_and_deliveries_lists_it(user, other_user, staff):
    sub_id = user.post(
        "/api/v1/notifications/", {"email": "ana@example.org", "events": ["job.ended"]}, format="json"
    ).json()["id"]
    resp = user.post(f"/api/v1/notifications/{sub_id}/test/")
    assert resp.status_code == 202 and resp.json()["status"] == "pending"
    (listed,) = user.get(f"/api/v1/notifications/{sub_id}/deliveries/").json()
    assert listed["delivery"] == str(Delivery.objects.get().uuid) and listed["event"] == "job.ended"
    assert_status(other_user.post(f"/api/v1/notifications/{sub_id}/test/"), 404)
    assert_status(other_user.delete(f"/api/v1/notifications/{sub_id}/"), 404)
    assert_status(staff.get(f"/api/v1/notifications/{sub_id}/deliveries/"), 200)
    assert_status(user.delete(f"/api/v1/notifications/{sub_id}/"), 204)
    assert not Subscription.objects.exists() and not Delivery.objects.exists()
    assert_status(user.delete("/api/v1/notifications/abc/"), 404)
