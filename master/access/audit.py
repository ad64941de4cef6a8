"""The one way a master service writes the audit trail (master.models.AuditRecord).

Services call `record` inside their own transaction, after the change succeeded: a refused change
raises before it, and rolls back with it, so it leaves no record.
"""

import re
from collections.abc import Iterable
from typing import Any, TypeAlias

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Model, Prefetch, QuerySet

from master.models import AuditRecord, AuditTarget

SYSTEM = "system"
# Who a service acts for: a view's `request.user` (anonymous when signed out) or None for the system.
ActingUser: TypeAlias = AbstractBaseUser | AnonymousUser | None
_ACTION_RE = re.compile(r"[a-z_]+\.[a-z_]+")

# What names each kind of object in the trail: kept as text, it outlives the object.
_NAME_FIELDS = {
    "host": "hostname",
    "label": "name",
    "shard": "hostname",
    "job": "name",
    "token": "prefix",
    "user": "username",
    "group": "name",
    "testrun": "test",
    "regression": "entry",
}


def target(obj: Model) -> AuditTarget:
    """An unsaved target naming `obj` by kind (host, label, shard, job, token, user, ...), id and name."""
    kind = obj._meta.model_name or ""
    if kind not in _NAME_FIELDS:
        raise ValueError(f"no audit target kind for {type(obj).__name__}")
    return AuditTarget(kind=kind, object_id=obj.pk, name=str(getattr(obj, _NAME_FIELDS[kind]))[:255])


def record(
    action: str,
    *,
    acting_user: ActingUser,
    targets: Iterable[Model] = (),
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> AuditRecord:
    """Writes one record of `action` (TOPIC.VERB) by `acting_user` (None: the system itself).

    Targets are taken as they are now, so pass deleted objects before deleting them."""
    if not _ACTION_RE.fullmatch(action):
        raise ValueError(f"audit action {action!r} is not TOPIC.VERB")
    rows = list(dict.fromkeys((t.kind, t.object_id, t.name) for t in map(target, targets)))
    user = acting_user if isinstance(acting_user, User) and acting_user.pk is not None else None
    entry = AuditRecord.objects.create(
        user=user,
        actor=user.get_username() if user is not None else SYSTEM,
        action=action,
        reason=reason,
        details=details or {},
    )
    if rows:
        AuditTarget.objects.bulk_create(
            [AuditTarget(record=entry, kind=kind, object_id=oid, name=name) for kind, oid, name in rows]
        )
    return entry


def moves_detail(moves: Iterable[Any]) -> list[dict[str, str | None]]:
    """Host moves (master.services.shared.HostMove) as JSON for `details`."""
    return [{"host": m.hostname, "from": m.from_shard, "to": m.to_shard} for m in moves]


def records_of(of: AuditTarget) -> QuerySet[AuditRecord]:
    """The records that touched one object (an unsaved target from `target`), newest first."""
    return AuditRecord.objects.filter(
        id__in=AuditTarget.objects.filter(kind=of.kind, object_id=of.object_id).values("record_id")
    ).prefetch_related(Prefetch("targets", AuditTarget.objects.order_by("id")))
