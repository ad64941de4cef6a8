"""Who may do what through the REST API: the same as through the admin, never more.

Everyone signed in reads and submits jobs. Changing labels, hosts and shards needs what the admin
asks for: staff status and the Django model permission of the admin's page or action (master/admin/:
its add pages need add_<model>, its actions, deletions included, change_<model>; a shard token
needs change_shard). A staff account without permissions can use neither the admin nor the API
to change the fleet. Superusers hold every permission.
"""

from typing import Any

from django.conf import settings
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from common.models import Job

APP = "common"


def perm(codename: str) -> str:
    """`add_host` -> `common.add_host`; a codename of another app is given whole (`master.add_testrun`)."""
    return codename if "." in codename else f"{APP}.{codename}"


def has_perms(user: Any, codenames: tuple[str, ...]) -> bool:
    """Staff with every permission in `codenames`, as the admin requires (it admits only staff)."""
    return bool(user and user.is_authenticated and user.is_active and user.is_staff) and user.has_perms(
        [perm(c) for c in codenames]
    )


class AdminPermissionsOrReadOnly(BasePermission):
    """Reads for anyone signed in; each write action needs the permissions its view maps it to.

    A view lists them in `write_permissions`: action name -> (permission codenames, what it does).
    An action missing from the map is refused: a new endpoint is closed until someone decides.
    """

    message = "permission denied"

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if request.method in SAFE_METHODS:
            return True
        codenames, what = getattr(view, "write_permissions", {}).get(getattr(view, "action", None), ((), ""))
        if not codenames:
            self.message = "this change is not allowed through the API"
            return False
        if has_perms(user, codenames):
            return True
        needed = " and ".join(perm(c) for c in codenames)
        self.message = f"only staff with the {needed} permission{'s' if len(codenames) > 1 else ''} may {what}"
        return False


def may_abort(user: Any, job: Job) -> bool:
    """A job's owner, or staff with the admin's abort permission (change_job), may abort it."""
    return job.owner == user.username or has_perms(user, ("change_job",))


class IsOwnerOrStaffToAbort(BasePermission):
    message = f"only the job's owner or staff with the {perm('change_job')} permission may abort it"

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        return request.method in SAFE_METHODS or may_abort(request.user, obj)


class ApiDocsPermission(BasePermission):
    """The schema and docs pages: signed-in callers, like the API, unless FLEETSHARD_PUBLIC_API_DOCS=1."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if settings.FLEETSHARD_PUBLIC_API_DOCS:
            return True
        return bool(request.user and request.user.is_authenticated)


class AdminPermissions(AdminPermissionsOrReadOnly):
    """As AdminPermissionsOrReadOnly, but reading needs a permission too: a view lists it in
    `read_permission` (codenames, what it reads). The tokens: who holds which is the admins' business."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if request.method not in SAFE_METHODS:
            return super().has_permission(request, view)
        codenames, what = getattr(view, "read_permission", ((), ""))
        if codenames and has_perms(request.user, codenames):
            return True
        needed = " and ".join(perm(c) for c in codenames) or "a"
        self.message = f"only staff with the {needed} permission may {what or 'read this'}"
        return False
