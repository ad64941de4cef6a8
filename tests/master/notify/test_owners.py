"""A subscription is its creator's: a user made inactive or deleted hears nothing more, and each of
their subscriptions removed is in the audit trail (docs/notifications.md, "Subscribing")."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from master.models import AuditRecord
from master.notify import events, sender
from master.notify import services as notify
from master.notify.models import Delivery, Subscription
from master.services.users import delete_users
from tests.master.test_admin_users import change_form
from tests.support import assert_status


def subscribe_as(user: User, url: str) -> Subscription:
    new = notify.NewSubscription(url=url, events=["host.missing"])
    return notify.add_subscription(new, acting_user=user)


@pytest.fixture
def people(db):
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    ana, bob = User.objects.create_user("ana", password="pw"), User.objects.create_user("bob", password="pw")
    subs = {
        "ana1": subscribe_as(ana, "https://hooks.example.org/services/T0/B0/anasecret"),
        "ana2": subscribe_as(ana, "https://chat.example.org/ana"),
        "bob": subscribe_as(bob, "https://hooks.example.org/bob"),
        "system": notify.add_subscription(
            notify.NewSubscription(url="https://hooks.example.org/ops", events=["host.missing"]), acting_user=None
        ),
    }
    events.emit([events.Event("host.missing", {"n": 1})])
    sender.fan_out()  # each has a pending delivery
    return root, ana, bob, subs


def removals() -> list[tuple[str, str, str]]:
    rows = AuditRecord.objects.filter(action="notification.remove").order_by("id")
    return [(r.actor, r.details["target"], r.reason) for r in rows]


def test_a_user_made_inactive_in_the_admin_loses_their_subscriptions_each_recorded(people):
    root, ana, _, subs = people
    client = Client()
    client.force_login(root)
    resp = client.post(f"/admin/auth/user/{ana.id}/change/", change_form(ana, is_active=False))
    assert_status(resp, 302)
    assert set(Subscription.objects.values_list("id", flat=True)) == {subs["bob"].id, subs["system"].id}
    assert set(Delivery.objects.values_list("subscription_id", flat=True)) == {subs["bob"].id, subs["system"].id}
    # The webhook's path (its secret) is not in the trail, as for any removal.
    assert removals() == [
        ("root", "https://hooks.example.org/...", "user deactivated"),
        ("root", "https://chat.example.org/...", "user deactivated"),
    ]


def test_a_user_made_active_again_or_changed_otherwise_keeps_their_subscriptions(people):
    root, ana, _, _ = people
    client = Client()
    client.force_login(root)
    resp = client.post(f"/admin/auth/user/{ana.id}/change/", change_form(ana, is_staff=True))
    assert_status(resp, 302)
    assert Subscription.objects.filter(created_by=ana).count() == 2 and removals() == []


def test_a_deleted_user_loses_their_subscriptions_each_recorded(people):
    root, ana, bob, subs = people
    assert delete_users([bob], acting_user=root) == 1
    assert removals() == [("root", "https://hooks.example.org/...", "user deleted")]
    assert not Subscription.objects.filter(id=subs["bob"].id).exists()
    assert Subscription.objects.filter(created_by=ana).count() == 2


def test_a_user_deleted_or_made_inactive_another_way_is_sent_nothing(people):
    """Not through the admin (a shell, a directory sync): the sender itself skips an inactive creator's
    subscriptions, and deleting a user takes theirs with it."""
    _, ana, bob, subs = people
    User.objects.filter(id=ana.id).update(is_active=False)
    assert sender.due_subscriptions() == sorted([subs["bob"].id, subs["system"].id])
    events.emit([events.Event("host.missing", {"n": 2})])
    sender.fan_out()
    assert Delivery.objects.filter(subscription__created_by=ana).count() == 2  # the first event's only
    User.objects.filter(id=bob.id).delete()
    assert not Subscription.objects.filter(id=subs["bob"].id).exists()
    assert sender.due_subscriptions() == [subs["system"].id]


def test_removing_a_users_subscriptions_costs_a_read_a_record_each_and_two_deletes(people, django_assert_num_queries):
    root, ana, _, _ = people
    # SAVEPOINT, the subscriptions, one audit record each, the subscriptions again (Django's delete
    # collects them), their deliveries, the subscriptions, RELEASE.
    with django_assert_num_queries(8):
        assert notify.remove_subscriptions_of(ana, "user deleted", acting_user=root) == 2
    with django_assert_num_queries(3):  # none left: SAVEPOINT, the read, RELEASE
        assert notify.remove_subscriptions_of(ana, "user deleted", acting_user=root) == 0
