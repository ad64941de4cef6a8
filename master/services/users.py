"""What a user may do (staff, superuser, groups, permissions), as the audit trail records its changes.

Django's user admin saves the user itself; what it cannot do is leave a fleetshard record, so the
admin takes the user's privileges before the save and hands them here after it (master/admin/users.py).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group, Permission, User
from django.db import transaction

from master.access.audit import ActingUser, record
from master.models import AuditRecord
from master.notify.services import remove_subscriptions_of


@dataclass(frozen=True)
class Privileges:
    # A user made active again gets back whatever staff, superuser or permissions it kept. True by
    # default, as a new user is: making one is no change of this.
    is_active: bool = True
    is_staff: bool = False
    is_superuser: bool = False
    groups: frozenset[str] = frozenset()
    permissions: frozenset[str] = frozenset()


def _names(perms: Any) -> frozenset[str]:
    return frozenset(f"{app}.{codename}" for app, codename in perms.values_list("content_type__app_label", "codename"))


def privileges_of(user_id: int | None) -> Privileges:
    """The user's privileges as stored now (none for a user not saved yet)."""
    user = User.objects.filter(pk=user_id).first() if user_id is not None else None
    if user is None:
        return Privileges()
    return Privileges(
        is_active=user.is_active,
        is_staff=user.is_staff,
        is_superuser=user.is_superuser,
        groups=frozenset(user.groups.values_list("name", flat=True)),
        permissions=_names(Permission.objects.filter(user=user)),
    )


@transaction.atomic
def record_privilege_change(user: User, before: Privileges, *, acting_user: ActingUser) -> AuditRecord | None:
    """One `user.change_privileges` record of what changed since `before`; none when nothing did. A user
    made inactive loses their notification subscriptions, each recorded."""
    after = privileges_of(user.pk)
    details: dict[str, Any] = {}
    for flag in ("is_active", "is_staff", "is_superuser"):
        if getattr(before, flag) != getattr(after, flag):
            details[flag] = {"from": getattr(before, flag), "to": getattr(after, flag)}
    for kind in ("groups", "permissions"):
        old, new = getattr(before, kind), getattr(after, kind)
        if old != new:
            details[kind] = {"added": sorted(new - old), "removed": sorted(old - new)}
    if not details:
        return None
    entry = record("user.change_privileges", acting_user=acting_user, targets=[user], details=details)
    if before.is_active and not after.is_active:
        remove_subscriptions_of(user, "user deactivated", acting_user=acting_user)
    return entry


def group_permissions(group_id: int | None) -> frozenset[str]:
    return _names(Permission.objects.filter(group=group_id)) if group_id is not None else frozenset()


@transaction.atomic
def record_group_change(group: Group, before: frozenset[str], *, acting_user: ActingUser) -> AuditRecord | None:
    """One `group.change_permissions` record naming the group's members, whose privileges it changed."""
    after = group_permissions(group.pk)
    if after == before:
        return None
    members = list(group.user_set.order_by("id"))
    return record(
        "group.change_permissions",
        acting_user=acting_user,
        targets=[group, *members],
        details={"added": sorted(after - before), "removed": sorted(before - after)},
    )


@transaction.atomic
def delete_users(users: Iterable[User], *, acting_user: ActingUser) -> int:
    """Deletes the users, each with one `user.delete` record of the privileges it had: a deletion takes
    them away as surely as unticking them does. Their notification subscriptions go first, each recorded
    (as they do when a user is made inactive)."""
    count = 0
    for user in users:
        had = privileges_of(user.pk)
        record(
            "user.delete",
            acting_user=acting_user,
            targets=[user],
            details={
                "is_active": had.is_active,
                "is_staff": had.is_staff,
                "is_superuser": had.is_superuser,
                "groups": sorted(had.groups),
                "permissions": sorted(had.permissions),
            },
        )
        remove_subscriptions_of(user, "user deleted", acting_user=acting_user)
        user.delete()
        count += 1
    return count


@transaction.atomic
def delete_groups(groups: Iterable[Group], *, acting_user: ActingUser) -> int:
    """Deletes the groups, each with one `group.delete` record naming its members, who lose its
    permissions with it."""
    count = 0
    for group in groups:
        members = list(group.user_set.order_by("id"))
        record(
            "group.delete",
            acting_user=acting_user,
            targets=[group, *members],
            details={"removed": sorted(group_permissions(group.pk)), "members": [m.username for m in members]},
        )
        group.delete()
        count += 1
    return count
