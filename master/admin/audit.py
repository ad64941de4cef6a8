"""The audit trail, read-only: records are written by the services in the change's transaction and
never edited afterwards, not even by a superuser."""

from typing import Any

from django.contrib import admin
from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest

from master.models import AuditRecord, AuditTarget


def describe_targets(record: AuditRecord) -> str:
    return ", ".join(f"{t.kind} {t.name or t.object_id}" for t in record.targets.all())


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    list_display = ["at", "actor", "action", "objects", "reason"]
    list_filter = ["action"]
    search_fields = ["actor", "reason", "targets__name"]
    date_hierarchy = "at"
    show_full_result_count = False  # the trail only grows: no second COUNT(*) of all of it per page
    readonly_fields = ["at", "actor", "user", "action", "objects", "reason", "details"]
    fields = tuple(readonly_fields)

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditRecord]:
        return super().get_queryset(request).prefetch_related(Prefetch("targets", AuditTarget.objects.order_by("id")))

    @admin.display(description="objects")
    def objects(self, obj: AuditRecord) -> str:
        return describe_targets(obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
