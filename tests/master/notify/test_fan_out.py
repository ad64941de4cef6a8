"""Fan-out is one INSERT ... SELECT that matches subscriptions in SQL (docs/notifications.md, "Delivery"):
which subscriptions get which events, in what order, with what delivery ids, and its query count."""

import uuid
from datetime import timedelta

from django.contrib.auth.models import User
from django.utils import timezone

from master.notify import events, sender
from master.notify.models import Delivery, NotificationEvent, Subscription
from tests.master.notify.test_sender import subscribe


def test_fan_out_is_one_insert_whatever_the_number_of_subscriptions(db, django_assert_num_queries):
    for _ in range(10):
        subscribe("http://example.org/hook", events=["host.missing"])
    events.emit([events.Event("host.missing", {"n": i}) for i in range(30)])
    # SAVEPOINT, counting the subscriptions, claiming the events, the INSERT ... SELECT, marking the
    # events, RELEASE.
    with django_assert_num_queries(6):
        assert sender.fan_out() == 30
    assert Delivery.objects.count() == 300 and not NotificationEvent.objects.filter(fanned_out=False).exists()
    with django_assert_num_queries(4):  # nothing left: SAVEPOINT, the count, the claim, RELEASE
        assert sender.fan_out() == 0


def test_each_subscriptions_deliveries_follow_the_events_order_with_a_fresh_uuid_each(db):
    subs = [subscribe("http://example.org/hook", events=["host.missing", "job.ended"]) for _ in range(3)]
    for i in range(40):
        events.emit([events.Event("host.missing" if i % 2 else "job.ended", {"n": i})])
    while sender.fan_out(limit=7):
        pass
    for sub in subs:
        rows = list(Delivery.objects.filter(subscription=sub).order_by("id").values_list("event__data", "uuid"))
        assert [data["n"] for data, _ in rows] == list(range(40))
    ids = [d.uuid for d in Delivery.objects.all()]
    assert len(set(ids)) == len(ids) == 120
    assert all(isinstance(u, uuid.UUID) and u.version == 4 and u.variant == uuid.RFC_4122 for u in ids)
    d = Delivery.objects.select_related("event").first()
    assert d is not None and d.status == "pending" and d.attempts == 0 and d.created_on == d.event.created_on
    assert d.response_status is None and d.finished_on is None and d.response_body == d.error == ""


def test_fan_out_matches_event_label_owner_and_creator_in_sql(db):
    ana = User.objects.create_user("ana")
    bob = User.objects.create_user("bob", is_active=False)
    wanted = {
        "any": subscribe("http://example.org/1", events=["job.ended"]),
        "label": subscribe("http://example.org/2", events=["job.ended"], label="board:a"),
        "owner": subscribe("http://example.org/3", events=["job.ended"], owner="ana"),
        "both": subscribe("http://example.org/4", events=["job.ended"], label="pool:x", owner="ana"),
        "other event": subscribe("http://example.org/5", events=["host.missing"]),
        "other label": subscribe("http://example.org/6", events=["job.ended"], label="board:b"),
        "other owner": subscribe("http://example.org/7", events=["job.ended"], owner="bob"),
        # A label that is a prefix, or a JSON-looking part, of the event's must not match.
        "prefix": subscribe("http://example.org/8", events=["job.ended"], label="board"),
        "active creator": subscribe("http://example.org/9", events=["job.ended"]),
        "inactive creator": subscribe("http://example.org/10", events=["job.ended"]),
        "later": subscribe("http://example.org/11", events=["job.ended"]),
    }
    Subscription.objects.filter(id=wanted["active creator"].id).update(created_by=ana)
    Subscription.objects.filter(id=wanted["inactive creator"].id).update(created_by=bob)
    Subscription.objects.filter(id=wanted["later"].id).update(created_on=timezone.now() + timedelta(hours=1))
    events.emit([events.Event("job.ended", {"job": 1}, ["board:a", "pool:x"], "ana")])
    assert sender.fan_out() == 1
    got = set(Delivery.objects.values_list("subscription_id", flat=True))
    names = {name for name, sub in wanted.items() if sub.id in got}
    assert names == {"any", "label", "owner", "both", "active creator"}, names
