"""The shards' admin pages."""

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.safestring import SafeString

from common.admin_ui import age, badge
from common.models import Label, Shard, offline_after_s
from master import services
from master.admin.base import DirectedChangeList, ServiceAdmin, form_action, listed, names_of, only_one, with_moves
from master.admin.forms import LabelForm, LabelsForm, ShardCreateForm
from master.observe.overview import annotate_shards, count_hosts_by_status, host_badges


class OnlineFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("online", "online"), ("offline", "offline")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Shard]) -> QuerySet[Shard]:
        cutoff = timezone.now() - timedelta(seconds=offline_after_s())
        if self.value() == "online":
            return queryset.filter(last_heartbeat__gte=cutoff)
        if self.value() == "offline":
            return queryset.filter(Q(last_heartbeat__lt=cutoff) | Q(last_heartbeat__isnull=True))
        return queryset


class ShardChangeList(DirectedChangeList):
    """Counts the hosts of the page's shards by status once the page is cut: one grouped query."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        count_hosts_by_status(self.result_list)


@admin.register(Shard)
class ShardAdmin(ServiceAdmin):
    list_display = [
        "hostname",
        "state",
        "heartbeat",
        "client_version",
        "label_list",
        "hosts_by_status",
        "jobs_queued",
        "jobs_running",
        "jobs_failed_24h",
    ]
    list_filter = [OnlineFilter]
    search_fields = ["hostname"]
    readonly_fields = [
        "hostname",
        "state",
        "heartbeat",
        "last_heartbeat",
        "client_version",
        "label_list",
        "hosts_by_status",
        "jobs_queued",
        "jobs_running",
        "jobs_failed_24h",
        "known_hosts_count",
        "known_jobs_count",
        "last_updates_count",
        "updates_applied",
        "instance",
        "instance_since",
        "created_on",
    ]
    fields = tuple(readonly_fields)
    actions = ["add_labels", "remove_label", "delete_shards"]
    add_form = ShardCreateForm

    def get_queryset(self, request: HttpRequest) -> QuerySet[Shard]:
        return annotate_shards(super().get_queryset(request)).prefetch_related("labels")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ShardChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Shard | None:
        shard = super().get_object(request, object_id, from_field)
        if shard is not None:
            count_hosts_by_status([shard])
        return shard

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Creating a shard shows its heartbeat token, and a shard token needs change_shard.
        return super().has_add_permission(request) and request.user.has_perm("common.change_shard")

    @admin.display(description="state", ordering="last_heartbeat")
    def state(self, obj: Shard) -> SafeString:
        return badge(obj.status)

    @admin.display(description="last heartbeat", ordering="last_heartbeat")
    def heartbeat(self, obj: Shard) -> str:
        return age(obj.last_heartbeat)

    @admin.display(description="labels")
    def label_list(self, obj: Shard) -> str:
        return ", ".join(label.name for label in obj.labels.all())

    @admin.display(description="hosts by status", ordering="hosts_total")
    def hosts_by_status(self, obj: Shard) -> SafeString:
        total = badge(f"{obj.hosts_total} total", "#455a64")  # type: ignore[attr-defined]
        return SafeString(" ".join([total, *host_badges(obj)]))

    @admin.display(description="jobs queued", ordering="jobs_queued")
    def jobs_queued(self, obj: Shard) -> int:
        return obj.jobs_queued  # type: ignore[attr-defined]

    @admin.display(description="jobs running", ordering="jobs_running")
    def jobs_running(self, obj: Shard) -> int:
        return obj.jobs_running  # type: ignore[attr-defined]

    @admin.display(description="jobs failed (24 h)", ordering="jobs_failed_24h")
    def jobs_failed_24h(self, obj: Shard) -> int:
        return obj.jobs_failed_24h  # type: ignore[attr-defined]

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        data = form.cleaned_data
        shard, raw = services.create_shard(
            data["hostname"].strip(), [label.name for label in data["labels"]], acting_user=request.user
        )
        return self.token_page(request, f"Shard {shard.hostname} created", raw, shard=shard)

    @admin.action(description="Add labels to the selected shard…", permissions=["change"])
    def add_labels(self, request: HttpRequest, queryset: QuerySet[Shard]) -> TemplateResponse | None:
        shard = only_one(self, request, queryset, "shard")
        if shard is None:
            return None

        def apply(data: dict[str, Any], shards: list[Shard]) -> str:
            names = [label.name for label in data["labels"]]
            change = services.add_labels_to_shard(shard.hostname, names, acting_user=request.user)
            return with_moves(f"shard {shard.hostname} now owns {listed('label', names)}", change.moves)

        return form_action(self, request, queryset, title=f"Add labels to {shard}", apply=apply, form_class=LabelsForm)

    @admin.action(description="Remove a label from the selected shard…", permissions=["change"])
    def remove_label(self, request: HttpRequest, queryset: QuerySet[Shard]) -> TemplateResponse | None:
        shard = only_one(self, request, queryset, "shard")
        if shard is None:
            return None

        def apply(data: dict[str, Any], shards: list[Shard]) -> str:
            change = services.remove_label_from_shard(shard.hostname, data["label"].name, acting_user=request.user)
            return with_moves(f"removed label {data['label'].name} from shard {shard.hostname}", change.moves)

        return form_action(
            self,
            request,
            queryset,
            title=f"Remove a label from {shard}",
            apply=apply,
            form_class=LabelForm,
            form_kwargs={"queryset": Label.objects.filter(shard=shard).select_related("shard").order_by("name")},
            intro="Its hosts leave the shard at its next heartbeat; jobs already there stay until they end.",
        )

    @admin.action(description="Delete selected shards", permissions=["change"])
    def delete_shards(self, request: HttpRequest, queryset: QuerySet[Shard]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], shards: list[Shard]) -> str:
            deletion = services.delete_shards(names_of(shards), acting_user=request.user)
            return with_moves(f"deleted {listed('shard', names_of(shards))}", deletion.moves)

        return form_action(
            self,
            request,
            queryset,
            title="Delete shards",
            apply=apply,
            submit="Yes, delete them",
            intro="Their labels and hosts are unassigned, their tokens revoked, and their active jobs end Aborted.",
        )
