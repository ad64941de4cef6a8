"""The master's admin: labels, hosts, shards, jobs and tokens, for the fleet's operators.

Every change goes through master.services, the same functions the API and the CLI call, so the
admin follows the same rules and shows the same error messages. That is why object pages are
read-only and the built-in add and delete are replaced: a plain model save would skip the version
bump that tells shards about a change, and the assignment rules that keep a host on one shard.
Changelists load everything a row shows in a fixed number of queries, whatever the page size.
"""

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.utils.safestring import SafeString

from common.admin_ui import HostColumns, HQEInlineBase, JobColumns, age, badge, pre
from common.errors import FleetshardError
from common.models import Host, HostQueueEntry, Job, Label, Shard
from master import services
from master.admin_forms import (
    ConfirmForm,
    HostCreateForm,
    LabelCreateForm,
    LabelForm,
    LabelsForm,
    LockForm,
    ShardCreateForm,
    TokenCreateForm,
)
from master.models import Token
from master.overview import annotate_labels, annotate_shards, host_badges, offline_after_s

admin.site.site_header = "fleetshard master"
admin.site.site_title = "fleetshard master"
admin.site.index_title = "Fleet administration"
admin.site.index_template = "master/admin/index.html"
admin.site.site_url = reverse_lazy("fleet-overview")  # the header's "View site" link

Apply = Callable[[dict[str, Any], list[Any]], str]


def _listed(kind: str, names: Sequence[str]) -> str:
    return f"{kind}{'s' if len(names) > 1 else ''} {', '.join(sorted(names))}"


def _names(objs: Sequence[Any], attr: str = "hostname") -> list[str]:
    return [getattr(o, attr) for o in objs]


def _with_moves(message: str, moves: Sequence[services.HostMove]) -> str:
    """A success message that also says which hosts left or joined which shard."""
    moved = services.describe_moves(moves)
    return f"{message}; {moved}" if moved else message


def audit(request: HttpRequest, objects: Sequence[Any], message: str, flag: int = CHANGE) -> None:
    """Records the change in the admin's history, so an object's page says who locked it and why."""
    if objects:
        LogEntry.objects.log_actions(
            user_id=request.user.pk, queryset=list(objects), action_flag=flag, change_message=message
        )


def form_action(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    title: str,
    apply: Apply,
    flag: int = CHANGE,
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
                audit(request, objects, message, flag)
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


def _one(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Any], what: str) -> Any:
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

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Changelist-level change permission enables the actions; object pages stay read-only.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.add_form is not None and super().has_add_permission(request)

    def add_initial(self, request: HttpRequest) -> dict[str, Any]:
        return {}

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


# Labels


@admin.register(Label)
class LabelAdmin(ServiceAdmin):
    list_display = ["name", "shard", "hosts_ready"]
    list_filter = ["shard"]
    search_fields = ["name"]
    list_select_related = ["shard"]
    fields = ["name", "shard", "hosts_ready"]
    readonly_fields = fields
    actions = ["delete_labels"]
    add_form = LabelCreateForm

    def get_queryset(self, request: HttpRequest) -> QuerySet[Label]:
        return annotate_labels(super().get_queryset(request))

    @admin.display(description="hosts Ready", ordering="hosts_ready")
    def hosts_ready(self, obj: Label) -> str:
        return f"{obj.hosts_ready} of {obj.hosts_total}"  # type: ignore[attr-defined]

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        labels = services.create_labels(form.cleaned_data["names"])
        audit(request, labels, "created", ADDITION)
        self.message_user(request, f"created {_listed('label', _names(labels, 'name'))}", messages.SUCCESS)
        return HttpResponseRedirect(self.changelist_url())

    @admin.action(description="Delete selected labels", permissions=["change"])
    def delete_labels(self, request: HttpRequest, queryset: QuerySet[Label]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], labels: list[Label]) -> str:
            moves = services.delete_labels(_names(labels, "name"))
            return _with_moves(f"deleted {_listed('label', _names(labels, 'name'))}", moves)

        return form_action(
            self,
            request,
            queryset,
            title="Delete labels",
            flag=DELETION,
            apply=apply,
            submit="Yes, delete them",
            intro="Hosts lose these labels, and a host whose shard came from one of them leaves that shard.",
        )


# Hosts


@admin.register(Host)
class HostAdmin(HostColumns, ServiceAdmin):
    list_display = ["hostname", "status_badge", "locked_badge", "lock_reason", "shard", "label_list"]
    list_filter = ["status", "shard", "labels", "locked"]
    search_fields = ["hostname"]
    list_select_related = ["shard"]
    fields = ["hostname", "status_badge", "shard", "label_list", "locked", "lock_reason", "attributes", "version"]
    readonly_fields = fields
    actions = ["lock_hosts", "unlock_hosts", "add_label", "remove_label", "delete_hosts"]
    add_form = HostCreateForm

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        data = form.cleaned_data
        hosts = services.create_hosts(
            data["hostnames"],
            labels=form.labels_names(),  # type: ignore[attr-defined]
            attributes=data["attributes"],
            locked=data["locked"],
            lock_reason=data["lock_reason"],
        )
        audit(request, hosts, "created", ADDITION)
        self.message_user(request, f"created {_listed('host', _names(hosts))}", messages.SUCCESS)
        return HttpResponseRedirect(self.changelist_url())

    @admin.action(description="Lock selected hosts…", permissions=["change"])
    def lock_hosts(self, request: HttpRequest, queryset: QuerySet[Host]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], hosts: list[Host]) -> str:
            services.lock_hosts(_names(hosts), data["reason"])
            return f"locked {_listed('host', _names(hosts))}" + (f": {data['reason']}" if data["reason"] else "")

        return form_action(self, request, queryset, title="Lock hosts", apply=apply, form_class=LockForm, submit="Lock")

    @admin.action(description="Unlock selected hosts", permissions=["change"])
    def unlock_hosts(self, request: HttpRequest, queryset: QuerySet[Host]) -> None:
        hostnames = _names(list(queryset))
        try:
            services.unlock_hosts(hostnames)
        except FleetshardError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            audit(request, list(queryset), f"unlocked {_listed('host', hostnames)}")
            self.message_user(request, f"unlocked {_listed('host', hostnames)}", messages.SUCCESS)

    @admin.action(description="Add a label to selected hosts…", permissions=["change"])
    def add_label(self, request: HttpRequest, queryset: QuerySet[Host]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], hosts: list[Host]) -> str:
            change = services.add_label_to_hosts(data["label"].name, _names(hosts))
            return _with_moves(f"added label {data['label'].name} to {_listed('host', _names(hosts))}", change.moves)

        return form_action(self, request, queryset, title="Add a label", apply=apply, form_class=LabelForm)

    @admin.action(description="Remove a label from selected hosts…", permissions=["change"])
    def remove_label(self, request: HttpRequest, queryset: QuerySet[Host]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], hosts: list[Host]) -> str:
            change = services.remove_label_from_hosts(data["label"].name, _names(hosts))
            message = f"removed label {data['label'].name} from {_listed('host', _names(hosts))}"
            return _with_moves(message, change.moves)

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
            services.delete_hosts(_names(hosts))
            return f"deleted {_listed('host', _names(hosts))}"

        return form_action(
            self,
            request,
            queryset,
            title="Delete hosts",
            flag=DELETION,
            apply=apply,
            submit="Yes, delete them",
            intro="A host with an active job cannot be deleted: abort the job first.",
        )


# Shards


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


@admin.register(Shard)
class ShardAdmin(ServiceAdmin):
    list_display = [
        "hostname",
        "state",
        "heartbeat",
        "client_version",
        "label_list",
        "hosts",
        "jobs_queued",
        "jobs_running",
        "jobs_failed_24h",
    ]
    list_filter = [OnlineFilter]
    search_fields = ["hostname"]
    fields = [
        "hostname",
        "state",
        "heartbeat",
        "last_heartbeat",
        "client_version",
        "label_list",
        "hosts",
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
    readonly_fields = fields
    actions = ["add_labels", "remove_label", "delete_shards"]
    add_form = ShardCreateForm

    def get_queryset(self, request: HttpRequest) -> QuerySet[Shard]:
        return annotate_shards(super().get_queryset(request)).prefetch_related("labels")

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
    def hosts(self, obj: Shard) -> SafeString:
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
        shard, raw = services.create_shard(data["hostname"].strip(), [label.name for label in data["labels"]])
        audit(request, [shard], "created with a heartbeat token", ADDITION)
        return self.token_page(request, f"Shard {shard.hostname} created", raw, shard=shard)

    @admin.action(description="Add labels to the selected shard…", permissions=["change"])
    def add_labels(self, request: HttpRequest, queryset: QuerySet[Shard]) -> TemplateResponse | None:
        shard = _one(self, request, queryset, "shard")
        if shard is None:
            return None

        def apply(data: dict[str, Any], shards: list[Shard]) -> str:
            names = [label.name for label in data["labels"]]
            change = services.add_labels_to_shard(shard.hostname, names)
            return _with_moves(f"shard {shard.hostname} now owns {_listed('label', names)}", change.moves)

        return form_action(self, request, queryset, title=f"Add labels to {shard}", apply=apply, form_class=LabelsForm)

    @admin.action(description="Remove a label from the selected shard…", permissions=["change"])
    def remove_label(self, request: HttpRequest, queryset: QuerySet[Shard]) -> TemplateResponse | None:
        shard = _one(self, request, queryset, "shard")
        if shard is None:
            return None

        def apply(data: dict[str, Any], shards: list[Shard]) -> str:
            change = services.remove_label_from_shard(shard.hostname, data["label"].name)
            return _with_moves(f"removed label {data['label'].name} from shard {shard.hostname}", change.moves)

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
            deletion = services.delete_shards(_names(shards))
            return _with_moves(f"deleted {_listed('shard', _names(shards))}", deletion.moves)

        return form_action(
            self,
            request,
            queryset,
            title="Delete shards",
            flag=DELETION,
            apply=apply,
            submit="Yes, delete them",
            intro="Their labels and hosts are unassigned, their tokens revoked, and their active jobs end Aborted.",
        )


# Jobs


class JobLabelFilter(admin.SimpleListFilter):
    """Jobs that name a label, as meta-host or as dependency."""

    title = "label"
    parameter_name = "label"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(n, n) for n in Label.objects.order_by("name").values_list("name", flat=True)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        name = self.value()
        if not name:
            return queryset
        return queryset.filter(
            Q(id__in=HostQueueEntry.objects.filter(meta_host__name=name).values("job_id"))
            | Q(id__in=Job.dependency_labels.through.objects.filter(label__name=name).values("job_id"))
        )


class HQEInline(HQEInlineBase):
    show_change_link = False

    @admin.display(description="log tail")
    def log(self, obj: HostQueueEntry) -> SafeString:
        return pre(obj.log_tail, lines=40)


@admin.register(Job)
class JobAdmin(JobColumns, ServiceAdmin):
    list_display = ["id", "name", "owner", "priority", "status_badge", "shard", "hqe_count", "aborted", "created_on"]
    list_display_links = ["id", "name"]
    list_filter = ["status", "shard", JobLabelFilter, "aborted"]
    search_fields = ["name", "owner"]
    list_select_related = ["shard"]
    date_hierarchy = None
    fields = [
        "id",
        "name",
        "owner",
        "status_badge",
        "shard",
        "priority",
        "command_shown",
        "dependency_label_list",
        "keyvals",
        "parent",
        "timeout_mins",
        "max_runtime_mins",
        "aborted",
        "version",
        "created_on",
    ]
    readonly_fields = fields
    inlines = [HQEInline]
    actions = ["abort_jobs"]

    @admin.display(description="command")
    def command_shown(self, obj: Job) -> SafeString:
        return pre(obj.command)

    @admin.display(description="dependency labels")
    def dependency_label_list(self, obj: Job) -> str:
        return ", ".join(label.name for label in obj.dependency_labels.all()) or "-"

    @admin.action(description="Abort selected jobs", permissions=["change"])
    def abort_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], jobs: list[Job]) -> str:
            ids = sorted(job.id for job in jobs)
            services.abort_jobs(ids)
            listed = ", ".join(map(str, ids))
            return f"aborting job{'s' if len(ids) > 1 else ''} {listed}: their shard stops them at its next heartbeat"

        return form_action(
            self,
            request,
            queryset,
            title="Abort jobs",
            apply=apply,
            submit="Yes, abort them",
            intro="Queued HQEs are cancelled and running ones killed by their shard, which reports them Aborted.",
        )


# Tokens


class TokenKindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("personal", "personal"), ("shard", "shard")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Token]) -> QuerySet[Token]:
        if self.value() == "personal":
            return queryset.filter(user__isnull=False)
        if self.value() == "shard":
            return queryset.filter(shard__isnull=False)
        return queryset


@admin.register(Token)
class TokenAdmin(ServiceAdmin):
    list_display = ["prefix_shown", "owner", "description", "created_on", "last_used"]
    list_filter = [TokenKindFilter]
    search_fields = ["prefix", "description", "user__username", "shard__hostname"]
    list_select_related = ["user", "shard"]
    fields = ["prefix_shown", "owner", "description", "created_on", "last_used"]
    readonly_fields = fields
    actions = ["revoke_tokens"]
    add_form = TokenCreateForm
    add_submit = "Create token"

    def add_initial(self, request: HttpRequest) -> dict[str, Any]:
        return {"username": request.user.get_username()}

    @admin.display(description="token", ordering="prefix")
    def prefix_shown(self, obj: Token) -> str:
        return f"{obj.prefix}…"

    @admin.display(description="for")
    def owner(self, obj: Token) -> str:
        return f"shard {obj.shard.hostname}" if obj.shard_id else f"user {obj.user.username}"  # type: ignore[union-attr]

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        data = form.cleaned_data
        user = request.user
        if data["kind"] == TokenCreateForm.SHARD:
            # A shard token speaks for the shard: whoever holds it can report its results.
            if not user.has_perm("common.change_shard"):
                raise FleetshardError("creating a shard token needs the permission to change shards", field="shard")
            shard = data["shard"]
            token, raw = services.create_shard_token(shard.hostname, description=data["description"])
            audit(request, [token], "created", ADDITION)
            return self.token_page(request, f"New token for shard {shard}", raw, shard=shard, token_obj=token)
        # A token acts as its user: only a superuser may mint one for someone else or for an admin.
        if data["admin"] and not user.is_superuser:
            raise FleetshardError("only a superuser can create an admin token", field="admin")
        if data["username"] != user.get_username() and not user.is_superuser:
            raise FleetshardError("only a superuser can create a token for another user", field="username")
        token, raw = services.create_personal_token(
            data["username"], admin=data["admin"], description=data["description"]
        )
        audit(request, [token], "created" + (" (admin)" if data["admin"] else ""), ADDITION)
        return self.token_page(request, f"New token for {data['username']}", raw, token_obj=token)

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[Token]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], tokens: list[Token]) -> str:
            with transaction.atomic():
                for token in tokens:
                    services.revoke_token(token.id)
            return f"revoked {len(tokens)} token{'s' if len(tokens) > 1 else ''}"

        return form_action(
            self,
            request,
            queryset,
            title="Revoke tokens",
            flag=DELETION,
            apply=apply,
            submit="Yes, revoke them",
            intro="Clients using them are refused from now on; a shard needs a new token to heartbeat.",
        )
