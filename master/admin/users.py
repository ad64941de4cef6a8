"""Django's user admin, with every change of a user's privileges in fleetshard's audit trail."""

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from master.services.users import (
    Privileges,
    delete_groups,
    delete_users,
    group_permissions,
    privileges_of,
    record_group_change,
    record_privilege_change,
)

admin.site.unregister(User)


@admin.register(User)
class AuditedUserAdmin(UserAdmin):
    """Groups and permissions are saved after the user (save_related), so the record is written there,
    from the privileges the user had before the form was saved, in the admin's one transaction."""

    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm, change: bool) -> None:
        request._privileges_before = privileges_of(obj.pk if change else None)  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: ModelForm, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        before = getattr(request, "_privileges_before", Privileges())
        record_privilege_change(form.instance, before, acting_user=request.user)

    # The delete page and the "delete selected" action: each deletion is recorded with what it took away.
    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        delete_users([obj], acting_user=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        delete_users(list(queryset.order_by("id")), acting_user=request.user)


admin.site.unregister(Group)


@admin.register(Group)
class AuditedGroupAdmin(GroupAdmin):
    """A group's permissions are its members' too: a change of them is recorded as theirs would be."""

    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm, change: bool) -> None:
        request._group_permissions_before = group_permissions(obj.pk if change else None)  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: ModelForm, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        before: frozenset[str] = getattr(request, "_group_permissions_before", frozenset())
        record_group_change(form.instance, before, acting_user=request.user)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        delete_groups([obj], acting_user=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        delete_groups(list(queryset.order_by("id")), acting_user=request.user)
