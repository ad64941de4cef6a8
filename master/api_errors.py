"""JSON errors for the REST API: {"error": "...", "detail": ...}, with service errors mapped to HTTP."""

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from common.errors import FleetshardError, NotFound, Refused


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, FleetshardError):
        code = (
            status.HTTP_404_NOT_FOUND
            if isinstance(exc, NotFound)
            else (status.HTTP_409_CONFLICT if isinstance(exc, Refused) else status.HTTP_400_BAD_REQUEST)
        )
        return Response({"error": exc.message, "detail": {"field": exc.field}}, status=code)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    if isinstance(detail, dict) and set(detail) == {"detail"}:
        message = str(detail["detail"])
    elif isinstance(detail, dict):
        message = "; ".join(
            f"{field}: {' '.join(str(m) for m in (msgs if isinstance(msgs, list) else [msgs]))}"
            for field, msgs in detail.items()
        )
    else:
        message = str(detail)
    response.data = {"error": message, "detail": detail}
    return response
