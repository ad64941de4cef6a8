"""The labels' admin pages."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from common.models import Label
from master import services
from master.admin.base import (
    DirectedChangeList,
    ServiceAdmin,
    ShardSelectFilter,
    form_action,
    listed,
    names_of,
    with_moves,
)
from master.admin.forms import LabelCreateForm
from master.observe.overview import count_label_hosts


class LabelChangeList(DirectedChangeList):
    """Counts the hosts of the page's labels once the page is cut: one grouped query."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        count_label_hosts(self.result_list)


@admin.register(Label)
class LabelAdmin(ServiceAdmin):
    list_display = ["name", "shard", "hosts_ready"]
    list_filter = [("shard", ShardSelectFilter)]
    search_fields = ["name"]
    list_select_related = ["shard"]
    readonly_fields = ["name", "shard", "hosts_ready"]
    fields = tuple(readonly_fields)
    actions = ["delete_labels"]
    add_form = LabelCreateForm

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LabelChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Label | None:
        label = super().get_object(request, object_id, from_field)
        if label is not None:
            count_label_hosts([label])
        return label

    # Not sortable: the page's labels are counted after the page is cut (LabelChangeList); sorting
    # would count every label's hosts (0.7 s at 500 labels of 200). The filter and search find one.
    @admin.display(description="hosts Ready")
    def hosts_ready(self, obj: Label) -> str:
        return f"{obj.hosts_ready} of {obj.hosts_total}"  # type: ignore[attr-defined]

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        labels = services.create_labels(form.cleaned_data["names"], acting_user=request.user)
        self.message_user(request, f"created {listed('label', names_of(labels, 'name'))}", messages.SUCCESS)
        return HttpResponseRedirect(self.changelist_url())

    @admin.action(description="Delete selected labels", permissions=["change"])
    def delete_labels(self, request: HttpRequest, queryset: QuerySet[Label]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], labels: list[Label]) -> str:
            moves = services.delete_labels(names_of(labels, "name"), acting_user=request.user)
            return with_moves(f"deleted {listed('label', names_of(labels, 'name'))}", moves)

        return form_action(
            self,
            request,
            queryset,
            title="Delete labels",
            apply=apply,
            submit="Yes, delete them",
            intro="Hosts lose these labels, and a host whose shard came from one of them leaves that shard.",
        )
