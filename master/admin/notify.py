"""Notification subscriptions' admin pages: add (the secret shown once), remove, send a test."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from master.admin.base import ServiceAdmin, form_action
from master.notify import services
from master.notify.models import EVENTS, FORMATS, Delivery, Subscription


class SubscriptionCreateForm(forms.Form):
    url = forms.CharField(max_length=2000, required=False, help_text="A webhook (http or https).")
    email = forms.CharField(max_length=254, required=False, help_text="Or an email address.")
    events = forms.MultipleChoiceField(choices=[(e, e) for e in EVENTS], widget=forms.CheckboxSelectMultiple)
    label = forms.CharField(max_length=255, required=False, help_text="Only events about this label.")
    owner = forms.CharField(max_length=150, required=False, help_text="Only events about this owner's jobs.")
    format = forms.ChoiceField(choices=[(f, f) for f in FORMATS], initial="json")


class DeliveryInline(admin.TabularInline):
    model = Delivery
    fields = ("uuid", "event", "status", "attempts", "next_attempt_on", "response_status", "error")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ["-id"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Delivery]:
        return super().get_queryset(request).select_related("event")


@admin.register(Subscription)
class SubscriptionAdmin(ServiceAdmin):
    list_display = ["id", "target", "events", "label", "owner", "format", "created_by", "created_on"]
    list_select_related = ["created_by"]
    readonly_fields = ["url", "email", "events", "label", "owner", "format", "created_by", "created_on"]
    fields = tuple(readonly_fields)
    inlines = [DeliveryInline]
    actions = ["remove_subscriptions", "send_test"]
    add_form = SubscriptionCreateForm
    add_submit = "Subscribe"

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        new = services.NewSubscription(**form.cleaned_data)
        sub = services.add_subscription(new, acting_user=request.user)
        messages.success(
            request, f"Added subscription {sub.id}. Its signing secret, shown only this once: {sub.secret}"
        )
        return HttpResponseRedirect(self.changelist_url())

    @admin.action(description="Remove selected subscriptions", permissions=["change"])
    def remove_subscriptions(self, request: HttpRequest, queryset: QuerySet[Subscription]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], subs: list[Subscription]) -> str:
            with transaction.atomic():
                for sub in subs:
                    services.remove_subscription(sub.id, acting_user=request.user)
            return f"removed {len(subs)} subscription{'s' if len(subs) > 1 else ''}"

        return form_action(
            self,
            request,
            queryset,
            title="Remove subscriptions",
            apply=apply,
            submit="Yes, remove them",
            intro="What they have not yet been sent is dropped.",
        )

    @admin.action(description="Send a test notification", permissions=["change"])
    def send_test(self, request: HttpRequest, queryset: QuerySet[Subscription]) -> None:
        with transaction.atomic():
            for sub in queryset:
                services.test_subscription(sub.id, acting_user=request.user)
        messages.success(request, "Test notifications queued; see each subscription's deliveries.")
