"""Privilege changes through Django's user and group admin leave fleetshard audit records (issue 23)."""

from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from master.models import AuditRecord, AuditTarget, Token
from tests.support import assert_status


@pytest.fixture
def root(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def change_form(user: User, **changes: Any) -> dict[str, Any]:
    """The user admin's change form as the page would post it, with `changes` applied."""
    data: dict[str, Any] = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "groups": [str(g.id) for g in user.groups.all()],
        "user_permissions": [str(p.id) for p in user.user_permissions.all()],
    }
    if user.is_staff:
        data["is_staff"] = "on"
    if user.is_superuser:
        data["is_superuser"] = "on"
    for key, value in changes.items():
        if value is False:
            data.pop(key, None)
        else:
            data[key] = "on" if value is True else value
    return data


def privilege_records() -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action="user.change_privileges").order_by("id"))


def test_making_a_user_staff_and_superuser_is_audited(root):
    bob = User.objects.create_user("bob", password="pw")
    resp = root.post(f"/admin/auth/user/{bob.id}/change/", change_form(bob, is_staff=True, is_superuser=True))
    assert_status(resp, 302)
    bob.refresh_from_db()
    assert bob.is_staff and bob.is_superuser
    [entry] = privilege_records()
    assert entry.actor == "root"
    assert entry.details == {"is_staff": {"from": False, "to": True}, "is_superuser": {"from": False, "to": True}}
    assert list(AuditTarget.objects.filter(record=entry).values_list("kind", "name")) == [("user", "bob")]


def test_groups_and_permissions_added_and_removed_are_audited(root):
    ops = Group.objects.create(name="ops")
    lock = Permission.objects.get(codename="change_host")
    bob = User.objects.create_user("bob", password="pw", is_staff=True)
    resp = root.post(
        f"/admin/auth/user/{bob.id}/change/",
        change_form(bob, groups=[str(ops.id)], user_permissions=[str(lock.id)]),
    )
    assert_status(resp, 302)
    resp = root.post(f"/admin/auth/user/{bob.id}/change/", change_form(bob, is_staff=False, groups=[]))
    assert_status(resp, 302)
    first, second = privilege_records()
    assert first.details == {
        "groups": {"added": ["ops"], "removed": []},
        "permissions": {"added": ["common.change_host"], "removed": []},
    }
    assert second.details == {"is_staff": {"from": True, "to": False}, "groups": {"added": [], "removed": ["ops"]}}


def test_a_save_that_changes_no_privilege_writes_no_record(root):
    bob = User.objects.create_user("bob", password="pw")
    resp = root.post(f"/admin/auth/user/{bob.id}/change/", change_form(bob, first_name="Bob"))
    assert_status(resp, 302)
    assert privilege_records() == []


def test_a_group_given_permissions_is_audited_with_its_members(root):
    ops = Group.objects.create(name="ops")
    bob = User.objects.create_user("bob", password="pw")
    bob.groups.add(ops)
    perm = Permission.objects.get(codename="delete_host")
    resp = root.post(f"/admin/auth/group/{ops.id}/change/", {"name": "ops", "permissions": [str(perm.id)]})
    assert_status(resp, 302)
    [entry] = AuditRecord.objects.filter(action="group.change_permissions")
    assert entry.details == {"added": ["common.delete_host"], "removed": []}
    assert sorted(AuditTarget.objects.filter(record=entry).values_list("kind", "name")) == [
        ("group", "ops"),
        ("user", "bob"),
    ]


def test_a_token_made_in_the_admin_is_audited(root):
    resp = root.post(
        "/admin/master/token/add/", {"kind": "personal", "username": "carol", "admin": "on", "description": "ci"}
    )
    assert_status(resp, 200)
    token = Token.objects.get(user__username="carol")
    [entry] = AuditRecord.objects.filter(action="token.create")
    assert entry.actor == "root" and entry.details["made_admin"] is True
    assert sorted(AuditTarget.objects.filter(record=entry).values_list("kind", "object_id")) == [
        ("token", token.id),
        ("user", token.user_id),
    ]


def test_a_user_made_active_again_is_audited(root):
    """A disabled superuser made active gets its privileges back: as much a change as ticking them."""
    old = User.objects.create_superuser("old", "old@example.com", "pw")
    old.is_active = False
    old.save()
    resp = root.post(f"/admin/auth/user/{old.id}/change/", change_form(old))  # the form ticks is_active
    assert_status(resp, 302)
    old.refresh_from_db()
    assert old.is_active
    [entry] = privilege_records()
    assert entry.details == {"is_active": {"from": False, "to": True}}


def test_a_user_made_in_the_admin_writes_no_privilege_record(root):
    resp = root.post(
        "/admin/auth/user/add/",
        {"username": "dave", "password1": "x-Long-pass-42", "password2": "x-Long-pass-42", "usable_password": "true"},
    )
    assert_status(resp, 302)
    assert User.objects.filter(username="dave").exists()
    assert privilege_records() == []


def test_deleting_users_and_groups_in_the_admin_is_audited(root):
    """The delete page and the "delete selected" action take privileges away with the user or group."""
    ops = Group.objects.create(name="ops")
    ops.permissions.add(Permission.objects.get(codename="delete_host"))
    bob = User.objects.create_user("bob", password="pw", is_staff=True)
    bob.groups.add(ops)
    carol = User.objects.create_superuser("carol", "c@example.com", "pw")
    eve = User.objects.create_user("eve", password="pw")
    resp = root.post(f"/admin/auth/group/{ops.id}/delete/", {"post": "yes"})
    assert_status(resp, 302)
    [gone] = AuditRecord.objects.filter(action="group.delete")
    assert gone.actor == "root"
    assert gone.details == {"removed": ["common.delete_host"], "members": ["bob"]}
    assert sorted(AuditTarget.objects.filter(record=gone).values_list("kind", "name")) == [
        ("group", "ops"),
        ("user", "bob"),
    ]
    resp = root.post(f"/admin/auth/user/{carol.id}/delete/", {"post": "yes"})
    assert_status(resp, 302)
    resp = root.post(
        "/admin/auth/user/",
        {"action": "delete_selected", "_selected_action": [str(bob.id), str(eve.id)], "post": "yes"},
    )
    assert_status(resp, 302)
    assert not User.objects.filter(username__in=["bob", "carol", "eve"]).exists()
    deleted = {
        t.name: t.record.details
        for t in AuditTarget.objects.filter(record__action="user.delete").select_related("record")
    }
    assert deleted == {
        "carol": {"is_active": True, "is_staff": True, "is_superuser": True, "groups": [], "permissions": []},
        "bob": {"is_active": True, "is_staff": True, "is_superuser": False, "groups": [], "permissions": []},
        "eve": {"is_active": True, "is_staff": False, "is_superuser": False, "groups": [], "permissions": []},
    }
