"""The hosts' admin pages."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from common.admin_ui import HostColumns
from common.errors import FleetshardError
from common.models import Host, HostQueueEntry, Label
from master import services
from master.admin.base import (
    RelatedSelectFilter,
    ServiceAdmin,
    ShardSelectFilter,
    form_action,
    listed,
    names_of,
    with_moves,
)
from master.admin.forms import HostCreateForm, LabelForm, LockForm
from master.services import lookups


def _run(entry: HostQueueEntry) -> SafeString:
    """`job 12 (smoke), entry 40: Failed (test, exit 3), ended 2026-11-23 06:25` linking the job's page."""
    url = reverse("admin:common_job_change", args=[entry.job_id])
    outcome = entry.status + (f" ({entry.failure}" if entry.failure else "")
    if entry.exit_code is not None:
        outcome += f", exit {entry.exit_code}" if entry.failure else f" (exit {entry.exit_code}"
    outcome += ")" if entry.failure or entry.exit_code is not None else ""
    ended = f", ended {entry.finished_on:%Y-%m-%d %H:%M:%S}" if entry.finished_on else ""
    return format_html(
        '<a href="{}">job {} ({})</a>, entry {}: {}{}', url, entry.job_id, entry.job.name, entry.id, outcome, ended
    )


@admin.register(Host)
class HostAdmin(HostColumns, ServiceAdmin):
    list_display = ["hostname", "status_badge", "locked_badge", "lock_reason", "shard", "label_list"]
    list_filter = ["status", ("shard", ShardSelectFilter), ("labels", RelatedSelectFilter), "locked"]
    search_fields = ["hostname"]
    list_select_related = ["shard"]
    readonly_fields = [
        "hostname",
        "status_badge",
        "shard",
        "label_list",
        "locked",
        "lock_reason",
        "attributes",
        "version",
        "running_now",
        "last_runs",
    ]
    fields = tuple(readonly_fields)
    actions = ["lock_hosts", "unlock_hosts", "add_label", "remove_label", "delete_hosts"]
    add_form = HostCreateForm

    @admin.display(description="running now")
    def running_now(self, obj: Host) -> SafeString:
        entries = lookups.running(obj)
        if not entries:
            return format_html("{}", "nothing")
        return format_html_join(", ", "{}", ((_run(e),) for e in entries))

    @admin.display(description=f"last {lookups.RECENT_RUNS} runs")
    def last_runs(self, obj: Host) -> SafeString:
        runs = lookups.recent_runs(obj)
        if not runs:
            return format_html("{}", "none yet")
        return format_html("<ul>{}</ul>", format_html_join("", "<li>{}</li>", ((_run(e),) for e in runs)))

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        data = form.cleaned_data
        hosts = services.create_hosts(
            data["hostnames"],
            labels=form.labels_names(),  # type: ignore[attr-defined]
            attributes=data["attributes"],
            locked=data["locked"],
            lock_reason=data["lock_reason"],
            acting_user=request.user,
        )
        self.message_user(request, f"created {listed('host', names_of(hosts))}", messages.SUCCESS)
        return HttpResponseRedirect(self.changelist_url())

    @admin.action(description="Lock selected hosts…", permissions=["change"])
    def lock_hosts(self, request: HttpRequest, queryset: QuerySet[Host]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], hosts: list[Host]) -> str:
            services.lock_hosts(names_of(hosts), data["reason"], acting_user=request.user)
            return f"locked {listed('host', names_of(hosts))}" + (f": {data['reason']}" if data["reason"] else "")

        return form_action(self, request, queryset, title="Lock hosts", apply=apply, form_class=LockForm, submit="Lock")

    @admin.action(description="Unlock selected hosts", permissions=["change"])
    def unlock_hosts(self, request: HttpRequest, queryset: QuerySet[Host]) -> None:
        hostnames = names_of(list(queryset))
        try:
            services.unlock_hosts(hostnames, acting_user=request.user)
        except FleetshardError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            self.message_user(request, f"unlocked {listed('host', hostnames)}", messages.SUCCESS)

    @admin.action(description="Add a label to selected hosts…", permissions=["change"])
    def add_label(self, request: HttpRequest, queryset: QuerySet[Host]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], hosts: list[Host]) -> str:
            change = services.add_label_to_hosts(data["label"].name, names_of(hosts), acting_user=request.user)
            return with_moves(f"added label {data['label'].name} to {listed('host', names_of(hosts))}", change.moves)

        return form_action(self, request, queryset, title="Add a label", apply=apply, form_class=LabelForm)

    @admin.action(description="Remove a label from selected hosts…", permissions=["change"])
    def remove_label(self, request: HttpRequest, queryset: QuerySet[Host]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], hosts: list[Host]) -> str:
            change = services.remove_label_from_hosts(data["label"].name, names_of(hosts), acting_user=request.user)
            message = f"removed label {data['label'].name} from {listed('host', names_of(hosts))}"
            return with_moves(message, change.moves)

        on_hosts = Label.objects.filter(hosts__in=queryset).distinct().select_related("shard").order_by("name")
        return form_action(
            self,
            request,
            queryset,
            title="Remove a label",
            apply=apply,
            form_class=LabelForm,
            form_kwargs={"queryset": on_hosts},
        )

    @admin.action(description="Delete selected hosts", permissions=["change"])
    def delete_hosts(self, request: HttpRequest, queryset: QuerySet[Host]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], hosts: list[Host]) -> str:
            services.delete_hosts(names_of(hosts), acting_user=request.user)
            return f"deleted {listed('host', names_of(hosts))}"

        return form_action(
            self,
            request,
            queryset,
            title="Delete hosts",
            apply=apply,
            submit="Yes, delete them",
            intro="A host with an active job cannot be deleted: abort the job first.",
        )
