"""Who may do what (DESIGN.md, issue 4): everyone signed in reads and submits jobs; staff run the fleet."""

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from common.models import Job


class IsStaffOrReadOnly(BasePermission):
    message = "only staff may change labels, hosts and shards"

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or bool(user.is_staff)


def may_abort(user: Any, job: Job) -> bool:
    """A job's owner or staff may abort it; shared by the object check and the bulk abort."""
    return bool(user.is_staff) or job.owner == user.username


class IsOwnerOrStaffToAbort(BasePermission):
    message = "only the job's owner or staff may abort it"

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        return request.method in SAFE_METHODS or may_abort(request.user, obj)
