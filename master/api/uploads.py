"""What the octet-stream upload views share (result files, job traces, log chunks): a body read to a
bound, and the error body every refusal carries."""

from typing import Any

from django.http import HttpRequest
from drf_spectacular.types import OpenApiTypes
from rest_framework.response import Response
from rest_framework.views import APIView

from common.models import HostQueueEntry, Shard
from common.wire import clean_text
from master.api.schema import FleetshardAutoSchema

# What the result-file and trace uploads take, as the schema says it.
FILE_BODY = {"application/json": OpenApiTypes.OBJECT, "application/octet-stream": OpenApiTypes.BINARY}


def read_body(request: HttpRequest, limit: int) -> bytes | None:
    """The raw body, or None when it is over `limit` bytes (declared or sent; never read further). Read
    here rather than through request.body, whose 10 MiB bound a 16 MiB result file passes."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > limit:
        return None
    data = request.read(limit + 1)
    if len(data) > limit:
        return None
    request._body = data  # as request.body would keep it, for whatever reads it after the view
    return data


def error(status_code: int, message: str, field: str | None, **detail: Any) -> Response:
    # Messages quote what a job wrote: a lone surrogate would fail the JSON's own encoding (a 500).
    return Response({"error": clean_text(message), "detail": {"field": field, **detail}}, status=status_code)


class OctetStreamView(APIView):
    """A view whose body is raw bytes: no parser touches it; `read_body` reads it to its bound."""

    schema = FleetshardAutoSchema()
    parser_classes: list[Any] = []


def foreign_hqe(hqe_id: int, shard: Shard) -> Response | None:
    """The refusal of a shard's request about `hqe_id` when that HQE is unknown (404) or of another
    shard's job (403), both naming `hqe`, which the shard reads as a refusal of the whole run; None
    when it is the shard's own. One query."""
    owner = HostQueueEntry.objects.filter(id=hqe_id).values_list("id", "job__shard_id").first()
    if owner is None:
        return error(404, f"hqe: unknown HQE {hqe_id}", "hqe")
    if owner[1] != shard.id:
        return error(403, f"hqe: HQE {hqe_id} is not of a job on shard {shard.hostname}", "hqe")
    return None
