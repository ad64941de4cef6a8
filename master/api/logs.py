"""REST endpoints of live logs (docs/protocol.md, "Logs"): a shard pushes the bytes of its runs' logs
(POST /api/v1/logs/append, a shard's token, its own HQEs only) and anyone signed in reads a job's
log as text from a byte offset (GET /api/v1/jobs/{id}/log), so a follower fetches only what is new."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.constants import MAX_LOG_CHUNK_BYTES, MAX_LOG_READ_BYTES
from common.errors import FleetshardError, NotFound
from common.models import HostQueueEntry, Job
from master.access.authentication import PersonalTokenAuthentication, ShardPrincipal
from master.api.schema import FleetshardAutoSchema
from master.api.serializers import INT64_MAX, ErrorSerializer
from master.api.uploads import OctetStreamView, foreign_hqe, read_body
from master.api.uploads import error as _error
from master.logs.store import LogGap, append_log, read_log

ERROR = ErrorSerializer
# A UTF-8 character takes up to 4 bytes: a read of fewer could return nothing and never move on.
MIN_LOG_READ_BYTES = 4


class ShardLogAuthentication(PersonalTokenAuthentication):
    """Takes a shard's token (a person's is authenticated too, then refused by IsShard with a clear 403)."""

    shard_tokens = True


class ShardLogScheme(OpenApiAuthenticationExtension):
    target_class = "master.api.logs.ShardLogAuthentication"
    name = "shardLogToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer", "description": "A shard's token: for the logs of its own HQEs."}


class IsShard(BasePermission):
    message = "only a shard's token may push logs"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.user, ShardPrincipal)


class AppendedSerializer(serializers.Serializer):
    hqe = serializers.IntegerField()
    size = serializers.IntegerField(help_text="Bytes of the shard's log the master has accounted for: send from here.")
    kept = serializers.IntegerField(help_text="Bytes stored; past FLEETSHARD_MAX_LOG_BYTES they are only counted.")
    truncated = serializers.BooleanField(help_text="The log passed the master's cap: what follows is not stored.")
    complete = serializers.BooleanField(help_text="The shard said the log ended.")
    new = serializers.IntegerField(help_text="Bytes of this chunk the master did not have (0: a duplicate).")


class LogSliceSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    hqe = serializers.IntegerField()
    hqe_status = serializers.CharField()
    offset = serializers.IntegerField(help_text="The byte offset `text` starts at.")
    next_offset = serializers.IntegerField(help_text="The offset to ask for next: where `text` ends, in bytes.")
    size = serializers.IntegerField(help_text="Bytes of the log the master keeps.")
    text = serializers.CharField(
        allow_blank=True, help_text="The bytes as UTF-8, invalid bytes and NUL as U+FFFD; never half a character."
    )
    truncated = serializers.BooleanField(help_text="The log was cut at FLEETSHARD_MAX_LOG_BYTES: no more is kept.")
    complete = serializers.BooleanField(help_text="The shard said the log ended.")
    ended = serializers.BooleanField(
        help_text="Nothing more is coming: the log is complete, the entry never ran, or it ended over a minute ago."
    )


def _number(raw: str | None, name: str, *, default: int | None = None, low: int = 0, high: int = INT64_MAX) -> int:
    if raw is None or raw == "":
        if default is None:
            raise FleetshardError(f"the {name} query parameter is required", field=name)
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) < 20 and low <= int(raw) <= high):
        raise FleetshardError(f"{name}: invalid value {raw!r}: use an integer from {low} to {high}", field=name)
    return int(raw)


def _flag(raw: str | None, name: str) -> bool:
    value = (raw or "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise FleetshardError(f"{name}: invalid value {raw!r}: use true or false", field=name)
    return value in ("true", "1")


class LogAppendView(OctetStreamView):
    """POST /api/v1/logs/append?hqe=ID&offset=N[&final=true]: bytes of one run's log, from a shard."""

    authentication_classes = [ShardLogAuthentication]
    permission_classes = [IsShard]

    @extend_schema(
        operation_id="logs_append",
        tags=["logs"],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter("hqe", int, required=True, description="The HQE (of a job on this shard) that ran."),
            OpenApiParameter("offset", int, required=True, description="The byte offset of the body in the log."),
            OpenApiParameter("final", bool, description="The log ends with this chunk (the run ended)."),
        ],
        responses={
            200: OpenApiResponse(AppendedSerializer, description="Taken (`new` 0: the master had it already)."),
            400: OpenApiResponse(
                ERROR, description="Bad parameters, or bytes after the final chunk; `error` names the field."
            ),
            401: OpenApiResponse(ERROR, description="Missing or unknown token."),
            403: OpenApiResponse(ERROR, description="Not a shard's token, or another shard's HQE."),
            404: OpenApiResponse(ERROR, description="Unknown HQE."),
            409: OpenApiResponse(ERROR, description="A gap: `detail.expected_offset` is where to send from."),
            413: OpenApiResponse(ERROR, description="The chunk is larger than 256 KiB."),
        },
    )
    def post(self, request: Request) -> Response:
        """Adds a chunk of an HQE's log at its byte offset; idempotent (a chunk the master has is
        acknowledged, not appended again), and a chunk past the end is refused with the offset to send."""
        shard = request.user.shard if isinstance(request.user, ShardPrincipal) else None
        assert shard is not None  # IsShard
        params = request.query_params
        hqe_id = _number(params.get("hqe"), "hqe", low=1)
        offset = _number(params.get("offset"), "offset")
        final = _flag(params.get("final"), "final")
        if (refused := foreign_hqe(hqe_id, shard)) is not None:
            return refused
        data = read_body(request._request, MAX_LOG_CHUNK_BYTES)
        if data is None:
            return _error(413, f"body: a log chunk is at most {MAX_LOG_CHUNK_BYTES} bytes", "body")
        if offset + len(data) > INT64_MAX:
            return _error(400, f"offset: {offset} plus the chunk's length is past 2^63-1", "offset")
        try:
            appended = append_log(hqe_id, offset, data, final=final)
        except LogGap as gap:
            return _error(409, gap.message, "offset", expected_offset=gap.expected)
        return Response(
            AppendedSerializer(
                {
                    "hqe": hqe_id,
                    "size": appended.size,
                    "kept": appended.kept,
                    "truncated": appended.truncated,
                    "complete": appended.complete,
                    "new": appended.new,
                }
            ).data
        )


class JobLogView(APIView):
    """GET /api/v1/jobs/{id}/log?hqe=N&offset=O&limit=L: the job's log from byte O, as text."""

    schema = FleetshardAutoSchema()
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="jobs_log",
        tags=["jobs"],
        parameters=[
            OpenApiParameter("id", str, OpenApiParameter.PATH, description="The job's id."),
            OpenApiParameter("hqe", int, description="The entry (HQE id); needed when the job has several."),
            OpenApiParameter("offset", int, description="The byte to start at (default 0): a follower's next_offset."),
            OpenApiParameter(
                "limit",
                int,
                description=f"At most this many bytes (default and maximum {MAX_LOG_READ_BYTES}; 0, or at least 4).",
            ),
        ],
        responses={
            200: OpenApiResponse(LogSliceSerializer, description="The slice; `ended` says whether to ask again."),
            400: OpenApiResponse(ERROR, description="Bad parameters, or no `hqe` for a job with several entries."),
            404: OpenApiResponse(ERROR, description="Unknown job, or no such entry of it."),
        },
    )
    def get(self, request: Request, id: str) -> Response:
        """The log of one of the job's entries, as the shard has pushed it so far."""
        params = request.query_params
        if not (id.isascii() and id.isdigit() and len(id) < 19):
            raise NotFound(f"unknown job {id!r}", field="id")
        hqe_id = _number(params.get("hqe"), "hqe", default=0)
        offset = _number(params.get("offset"), "offset", default=0)
        limit = _number(params.get("limit"), "limit", default=MAX_LOG_READ_BYTES, high=MAX_LOG_READ_BYTES)
        if 0 < limit < MIN_LOG_READ_BYTES:
            # Less than a character would leave next_offset where it was: a follower would never move on.
            raise FleetshardError(
                f"limit: {limit} is less than a character can take: use 0 (only where the log stands) or "
                f"{MIN_LOG_READ_BYTES} to {MAX_LOG_READ_BYTES}",
                field="limit",
            )
        job_id = int(id)
        hqes = HostQueueEntry.objects.filter(job_id=job_id).only("id", "job_id", "status", "started_on", "finished_on")
        found = list(hqes.filter(id=hqe_id) if hqe_id else hqes[:2])
        if not found:
            if not Job.objects.filter(id=job_id).exists():
                raise NotFound(f"unknown job {job_id}", field="id")
            if hqe_id:
                raise NotFound(f"hqe: job {job_id} has no entry {hqe_id}", field="hqe")
            raise NotFound(f"job {job_id} has no entries", field="id")
        if len(found) > 1:
            raise FleetshardError(
                f"hqe: job {job_id} has {hqes.count()} entries: name one with --hqe N (hqe=N in the API; "
                f"`fleetshard job stat {job_id}` lists them)",
                field="hqe",
            )
        hqe = found[0]
        piece = read_log(hqe, offset, limit)
        return Response(
            LogSliceSerializer(
                {
                    "job": job_id,
                    "hqe": hqe.id,
                    "hqe_status": hqe.status,
                    "offset": piece.offset,
                    "next_offset": piece.next_offset,
                    "size": piece.size,
                    "text": piece.text,
                    "truncated": piece.truncated,
                    "complete": piece.complete,
                    "ended": piece.ended,
                }
            ).data
        )
