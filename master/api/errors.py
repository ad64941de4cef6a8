"""JSON errors for the REST API: {"error": "...", "detail": ...}, with service errors mapped to HTTP."""

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from common.errors import FleetshardError, NotFound, Refused
from common.wire import clean_text


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, FleetshardError):
        code = (
            status.HTTP_404_NOT_FOUND
            if isinstance(exc, NotFound)
            else (status.HTTP_409_CONFLICT if isinstance(exc, Refused) else status.HTTP_400_BAD_REQUEST)
        )
        # A message may quote input (a job's key): a lone surrogate in it would fail the JSON's encoding.
        return Response({"error": clean_text(exc.message), "detail": {"field": exc.field}}, status=code)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    if isinstance(detail, dict) and set(detail) == {"detail"}:
        message = str(detail["detail"])
    elif isinstance(detail, dict):
        message = "; ".join(f"{path}: {' '.join(msgs)}" for path, msgs in _field_messages(detail))
    else:
        message = str(detail)
    response.data = {"error": clean_text(message), "detail": detail}
    return response


def _field_messages(detail: Any, path: str = "") -> list[tuple[str, list[str]]]:
    """Flattens DRF's nested errors ({"names": {0: [...]}}) into ("names[0]", [...]) pairs."""
    if isinstance(detail, dict):
        found = []
        for key, value in detail.items():
            found += _field_messages(value, f"{path}[{key}]" if path else str(key))
        return found
    items = detail if isinstance(detail, list) else [detail]
    if any(isinstance(item, dict | list) for item in items):
        return [pair for item in items for pair in _field_messages(item, path)]
    return [(path, [str(item) for item in items])]


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's own 400s (a Host header it refuses, say) in the API's JSON shape under /api/, so
    clients and the documented schema see one error format there; elsewhere Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "Bad Request", "detail": None}, status=400)
    return defaults.bad_request(request, exception)  # type: ignore[arg-type]
