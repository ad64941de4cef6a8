"""What every admin page of the master shares: read-only object pages, service-backed add pages,
actions with an intermediate form, and history pages showing the audit trail."""

from collections.abc import Callable, Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import PAGE_VAR
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from common.errors import FleetshardError
from master import services
from master.access.audit import records_of, target
from master.admin.forms import ConfirmForm

Apply = Callable[[dict[str, Any], list[Any]], str]


def listed(kind: str, names: Sequence[str]) -> str:
    return f"{kind}{'s' if len(names) > 1 else ''} {', '.join(sorted(names))}"


def names_of(objs: Sequence[Any], attr: str = "hostname") -> list[str]:
    return [getattr(o, attr) for o in objs]


def with_moves(message: str, moves: Sequence[services.HostMove]) -> str:
    """A success message that also says which hosts left or joined which shard."""
    moved = services.describe_moves(moves)
    return f"{message}; {moved}" if moved else message


def form_action(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    title: str,
    apply: Apply,
    form_class: type[forms.Form] = ConfirmForm,
    form_kwargs: dict[str, Any] | None = None,
    submit: str = "Apply",
    intro: str = "",
) -> TemplateResponse | None:
    """An action with an intermediate page: a form (or a confirmation) about the selected rows.

    `apply` calls a service and returns the success message; a FleetshardError becomes an error
    message on the changelist and, the service being one transaction, leaves everything unchanged.
    """
    objects = list(queryset)
    kwargs = {"prefix": "fs", **(form_kwargs or {})}
    if "fs_apply" in request.POST:
        form = form_class(request.POST, **kwargs)
        if form.is_valid():
            try:
                message = apply(form.cleaned_data, objects)
            except FleetshardError as exc:
                model_admin.message_user(request, exc.message, messages.ERROR)
            else:
                model_admin.message_user(request, message, messages.SUCCESS)
            return None
    else:
        form = form_class(**kwargs)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "intro": intro,
        "form": form,
        "objects": objects,
        "opts": model_admin.model._meta,
        "action": request.POST.get("action", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "submit": submit,
    }
    return TemplateResponse(request, "master/admin/action_form.html", context)


def only_one(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Any], what: str) -> Any:
    """The single selected row, or None after telling the user to select exactly one."""
    rows = list(queryset[:2])
    if len(rows) != 1:
        model_admin.message_user(request, f"select exactly one {what} for this action", messages.ERROR)
        return None
    return rows[0]


class ServiceAdmin(admin.ModelAdmin):
    """Read-only object pages; changes through actions and an add page that calls a service."""

    add_form: type[forms.Form] | None = None
    add_submit = "Create"
    # A filtered list says "N results" and links "Show all" without a second COUNT(*) of the whole
    # table on every page (100,000 hosts: one more scan of them for a number in parentheses).
    show_full_result_count = False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Changelist-level change permission enables the actions; object pages stay read-only.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.add_form is not None and super().has_add_permission(request)

    def add_initial(self, request: HttpRequest) -> dict[str, Any]:
        return {}

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> Any:
        """The object's audit trail: every change made through a service, from any entry point (the
        API, the command line, the admin), where Django's own history would show only the admin's."""
        obj = self.get_object(request, object_id)
        if obj is None:
            # A private ModelAdmin helper (the same redirect as Django's own views), absent from the stubs.
            return self._get_obj_does_not_exist_redirect(request, self.model._meta, object_id)  # type: ignore[attr-defined]
        if not self.has_view_or_change_permission(request, obj):
            raise PermissionDenied
        opts = self.model._meta
        # A page at a time, as Django's own history: a shard's trail holds every job created on it.
        paginator = self.get_paginator(request, records_of(target(obj)), 100)
        records = paginator.get_page(request.GET.get(PAGE_VAR, 1))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Change history: {obj}",
            "subtitle": None,
            "records": records,
            "page_range": paginator.get_elided_page_range(records.number),
            "page_var": PAGE_VAR,
            "module_name": str(opts.verbose_name_plural).capitalize(),
            "object": obj,
            "opts": opts,
            "preserved_filters": self.get_preserved_filters(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "master/admin/audit_history.html", context)

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        raise NotImplementedError

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None) -> Any:
        if not self.has_add_permission(request) or self.add_form is None:
            raise PermissionDenied
        form = self.add_form(request.POST if request.method == "POST" else None, initial=self.add_initial(request))
        if request.method == "POST" and form.is_valid():
            try:
                return self.create(request, form)
            except FleetshardError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": f"Add {opts.verbose_name}",
            "form": form,
            "opts": opts,
            "submit": self.add_submit,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "master/admin/service_form.html", context)

    def changelist_url(self) -> str:
        opts = self.model._meta
        return reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")

    def token_page(self, request: HttpRequest, title: str, raw: str, **context: Any) -> TemplateResponse:
        """The one page that ever shows a raw token; never cached, never stored."""
        response = TemplateResponse(
            request,
            "master/admin/token_once.html",
            {
                **self.admin_site.each_context(request),
                "title": title,
                "token": raw,
                "opts": self.model._meta,
                "master_url": request.build_absolute_uri("/").rstrip("/"),
                **context,
            },
        )
        response["Cache-Control"] = "no-store"
        return response
