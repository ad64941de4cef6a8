"""The tokens' admin pages: the only place besides the API that shows a raw token, once."""

from typing import Any

from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from common.errors import FleetshardError
from master import services
from master.admin.base import ServiceAdmin, form_action
from master.admin.forms import TokenCreateForm
from master.models import Token


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
    readonly_fields = ["prefix_shown", "owner", "description", "created_on", "last_used"]
    fields = tuple(readonly_fields)
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
            token, raw = services.create_shard_token(
                shard.hostname, description=data["description"], acting_user=request.user
            )
            return self.token_page(request, f"New token for shard {shard}", raw, shard=shard, token_obj=token)
        # A token acts as its user: only a superuser may mint one for someone else or for an admin.
        if data["admin"] and not user.is_superuser:
            raise FleetshardError("only a superuser can create an admin token", field="admin")
        if data["username"] != user.get_username() and not user.is_superuser:
            raise FleetshardError("only a superuser can create a token for another user", field="username")
        token, raw = services.create_personal_token(
            data["username"], admin=data["admin"], description=data["description"], acting_user=request.user
        )
        return self.token_page(request, f"New token for {data['username']}", raw, token_obj=token)

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[Token]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], tokens: list[Token]) -> str:
            with transaction.atomic():
                for token in tokens:
                    services.revoke_token(token.id, acting_user=request.user)
            return f"revoked {len(tokens)} token{'s' if len(tokens) > 1 else ''}"

        return form_action(
            self,
            request,
            queryset,
            title="Revoke tokens",
            apply=apply,
            submit="Yes, revoke them",
            intro="Clients using them are refused from now on; a shard needs a new token to heartbeat.",
        )
