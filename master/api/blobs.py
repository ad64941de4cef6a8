"""REST endpoints of blobs (docs/blobs.md): `HEAD`/`GET`/`PUT /api/v1/blobs/DIGEST`, what a shard
reports of a run's outputs (`POST /api/v1/artifacts?hqe=N`) and a job's outputs
(`GET /api/v1/jobs/{id}/artifacts`).

A blob's body is read and written as a stream: never a whole blob in memory, and Django's
DATA_UPLOAD_MAX_MEMORY_SIZE never applies (the body is never `request.body`).
"""

import re
from typing import Any

from django.db.models import Q
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.blobs import is_digest
from common.constants import JobStatus
from common.errors import FleetshardError, NotFound
from common.models import Job, Shard
from master.access.authentication import ResultsUploadAuthentication, ShardPrincipal
from master.api.logs import IsShard, _number
from master.api.parsers import BoundedJSONParser
from master.api.schema import FleetshardAutoSchema
from master.api.serializers import ErrorSerializer
from master.api.uploads import error as _error
from master.api.uploads import foreign_hqe
from master.blobs.artifacts import parse_outputs, record_artifacts
from master.blobs.models import Artifact, Blob
from master.blobs.store import BlobRejected, has_bytes, iter_blob, max_input_bytes, open_blob, receive_blob

ERROR = ErrorSerializer
_MISSING = "blob {digest} is recorded but its bytes are missing from the master's storage: upload it again"
RANGE_RE = re.compile(r"bytes=(\d{1,19})-(\d{0,19})")


class BlobSerializer(serializers.Serializer):
    digest = serializers.CharField()
    size = serializers.IntegerField()
    created = serializers.BooleanField(help_text="False: the master had this blob already; nothing was written.")


class ArtifactSerializer(serializers.Serializer):
    hqe = serializers.IntegerField(source="hqe_id")
    path = serializers.CharField(help_text="Relative to the run's $FLEETSHARD_OUTPUT_DIR.")
    size = serializers.IntegerField()
    digest = serializers.CharField(allow_blank=True, help_text="The blob's SHA-256; empty when skipped.")
    skipped = serializers.CharField(allow_blank=True, help_text="Why it was not stored; empty when stored.")


class ArtifactsReportedSerializer(serializers.Serializer):
    hqe = serializers.IntegerField()
    recorded = serializers.IntegerField()


def _digest(raw: str) -> str:
    if not is_digest(raw):
        raise FleetshardError(
            f"blob name {raw[:80]!r} is not a SHA-256 digest: use 64 lowercase hex digits", field="digest"
        )
    return raw


def shard_may_read(shard: Shard, digest: str) -> bool:
    """A shard reads the inputs of its own unfinished jobs and the outputs of its own runs, nothing else."""
    rows = (
        Job.objects.filter(shard=shard, status__in=JobStatus.ACTIVE)
        .exclude(inputs=[])
        .values_list("inputs", flat=True)
        .iterator(chunk_size=500)
    )
    for inputs in rows:
        if any(isinstance(i, dict) and i.get("digest") == digest for i in inputs or []):
            return True
    return Artifact.objects.filter(digest=digest, hqe__job__shard=shard).exists()


def _range(header: str, size: int) -> tuple[int, int] | None:
    """(start, end exclusive) of a `Range: bytes=A-[B]` header; None for the whole blob."""
    if not header:
        return None
    match = RANGE_RE.fullmatch(header.strip())
    if match is None:
        raise FleetshardError(f"Range {header[:60]!r}: only one 'bytes=START-[END]' range is served", field="Range")
    start = int(match.group(1))
    end = int(match.group(2)) + 1 if match.group(2) else size
    if start >= size or end <= start:
        raise _Unsatisfiable(size)
    return start, min(end, size)


class _Unsatisfiable(Exception):
    def __init__(self, size: int) -> None:
        self.size = size


class BlobView(APIView):
    """HEAD, GET and PUT of one blob, named by its SHA-256."""

    schema = FleetshardAutoSchema()
    authentication_classes = [ResultsUploadAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes: list[Any] = []

    @extend_schema(
        operation_id="blobs_retrieve",
        tags=["blobs"],
        parameters=[
            OpenApiParameter("digest", str, OpenApiParameter.PATH, description="The blob's SHA-256, 64 hex digits."),
            OpenApiParameter("Range", str, OpenApiParameter.HEADER, description="bytes=START-[END]: resume."),
        ],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="The blob."),
            (206, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="The range asked."),
            400: OpenApiResponse(ERROR, description="Not a digest, or a Range that is not one bytes range."),
            401: OpenApiResponse(ERROR, description="Missing or unknown token."),
            403: OpenApiResponse(ERROR, description="A shard asking for a blob none of its jobs or runs has."),
            404: OpenApiResponse(ERROR, description="No such blob, or its bytes are missing from storage."),
            416: OpenApiResponse(ERROR, description="The range starts past the blob's end."),
        },
    )
    def get(self, request: Request, digest: str) -> HttpResponse | StreamingHttpResponse | Response:
        """The blob's bytes, streamed; `Range` resumes a download that broke off."""
        digest = _digest(digest)
        user = request.user
        if isinstance(user, ShardPrincipal) and not shard_may_read(user.shard, digest):
            return _error(
                403, f"blob {digest} is neither an input nor an output of a job on shard {user.shard}", "digest"
            )
        blob = Blob.objects.filter(digest=digest).first()
        if blob is None:
            raise NotFound(f"no blob {digest}", field="digest")
        try:
            part = _range(request.headers.get("Range", ""), blob.size)
        except _Unsatisfiable as exc:
            refused = _error(416, f"Range: the blob has {exc.size} bytes", "Range")
            refused["Content-Range"] = f"bytes */{exc.size}"
            return refused
        start, end = part or (0, blob.size)
        try:
            handle = open_blob(digest)
        except OSError:
            raise NotFound(_MISSING.format(digest=digest), field="digest") from None
        response = StreamingHttpResponse(
            iter_blob(handle, start, end), status=206 if part else 200, content_type="application/octet-stream"
        )
        response["Content-Length"] = str(end - start)
        if part:
            response["Content-Range"] = f"bytes {start}-{end - 1}/{blob.size}"
        response["Accept-Ranges"] = "bytes"
        response["ETag"] = f'"{digest}"'
        name = request.query_params.get("name", "")
        if name and re.fullmatch(r"[A-Za-z0-9._+-]{1,200}", name):
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    def head(self, request: Request, digest: str) -> HttpResponse:
        """Whether the master has the blob (200 with its size as Content-Length) or not (404)."""
        digest = _digest(digest)
        blob = Blob.objects.filter(digest=digest).first()
        if blob is None or not has_bytes(digest):
            return HttpResponse(status=404)
        return self._head(blob)

    @staticmethod
    def _head(blob: Blob) -> HttpResponse:
        response = HttpResponse(status=200, content_type="application/octet-stream")
        response["Content-Length"] = str(blob.size)
        response["Accept-Ranges"] = "bytes"
        response["ETag"] = f'"{blob.digest}"'
        return response

    @extend_schema(
        operation_id="blobs_upload",
        tags=["blobs"],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter("digest", str, OpenApiParameter.PATH, description="The body's SHA-256, 64 hex digits."),
        ],
        responses={
            200: OpenApiResponse(BlobSerializer, description="The master had it already; nothing written."),
            201: OpenApiResponse(BlobSerializer, description="Stored."),
            400: OpenApiResponse(
                ERROR, description="Not a digest, a body whose SHA-256 is not it, or shorter than Content-Length."
            ),
            401: OpenApiResponse(ERROR, description="Missing or unknown token."),
            411: OpenApiResponse(ERROR, description="No Content-Length."),
            413: OpenApiResponse(ERROR, description="Larger than FLEETSHARD_MAX_INPUT_BYTES."),
            507: OpenApiResponse(ERROR, description="The master's storage cannot take it now (full); nothing kept."),
        },
    )
    def put(self, request: Request, digest: str) -> Response:
        """Stores the body as blob DIGEST once its SHA-256 and length are checked; nothing otherwise."""
        # Read as a stream below; anything after the view that asks for `request.body` (a log, a
        # validator) gets nothing rather than the whole upload in memory.
        request._request._body = b""
        digest = _digest(digest)
        raw = request.META.get("CONTENT_LENGTH") or ""
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
            return _error(411, "Content-Length: a blob's length must be given in bytes", "Content-Length")
        length, limit = int(raw), max_input_bytes()
        if length > limit:
            return _error(413, f"Content-Length: {length} bytes is over FLEETSHARD_MAX_INPUT_BYTES ({limit})", "size")
        try:
            created = receive_blob(digest, _Body(request), length)
        except BlobRejected as exc:
            return _error(exc.status, exc.message, "body")
        return Response({"digest": digest, "size": length, "created": created}, status=201 if created else 200)


class _Body:
    """The request body as a file: a client that hangs up ends it early instead of raising."""

    def __init__(self, request: Request) -> None:
        self.request = request._request

    def read(self, size: int) -> bytes:
        try:
            return self.request.read(size)
        except Exception:
            return b""


class ArtifactsReportView(APIView):
    """POST /api/v1/artifacts?hqe=N: a shard's report of one run's outputs."""

    schema = FleetshardAutoSchema()
    authentication_classes = [ResultsUploadAuthentication]
    permission_classes = [IsShard]
    parser_classes = [BoundedJSONParser]

    @extend_schema(
        operation_id="artifacts_report",
        tags=["blobs"],
        request={"application/json": OpenApiTypes.OBJECT},
        parameters=[OpenApiParameter("hqe", int, required=True, description="The HQE (of a job on this shard).")],
        responses={
            200: OpenApiResponse(ArtifactsReportedSerializer, description="Recorded (again, if sent before)."),
            400: OpenApiResponse(ERROR, description="A malformed list, or a file whose blob the master lacks."),
            401: OpenApiResponse(ERROR, description="Missing or unknown token."),
            403: OpenApiResponse(ERROR, description="Not a shard's token, or another shard's HQE."),
            404: OpenApiResponse(ERROR, description="Unknown HQE."),
        },
    )
    def post(self, request: Request) -> Response:
        """Records the files a run left in $FLEETSHARD_OUTPUT_DIR (uploaded first) and those it skipped."""
        shard = request.user.shard if isinstance(request.user, ShardPrincipal) else None
        assert shard is not None  # IsShard
        hqe_id = _number(request.query_params.get("hqe"), "hqe", low=1)
        if (refused := foreign_hqe(hqe_id, shard)) is not None:
            return refused
        recorded = record_artifacts(hqe_id, parse_outputs(request.data))
        return Response({"hqe": hqe_id, "recorded": recorded})


class JobArtifactsView(APIView):
    """GET /api/v1/jobs/{id}/artifacts[?hqe=N]: the outputs of a job's runs."""

    schema = FleetshardAutoSchema()
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="jobs_artifacts",
        tags=["jobs"],
        parameters=[
            OpenApiParameter("id", str, OpenApiParameter.PATH, description="The job's id."),
            OpenApiParameter("hqe", int, description="Only this entry's outputs."),
        ],
        responses={
            200: OpenApiResponse(ArtifactSerializer(many=True), description="By entry, then path."),
            400: OpenApiResponse(ERROR, description="Bad parameters."),
            404: OpenApiResponse(ERROR, description="Unknown job."),
        },
    )
    def get(self, request: Request, id: str) -> Response:
        """Each file a run of the job left in its output directory: stored (digest) or skipped (reason)."""
        if not (id.isascii() and id.isdigit() and len(id) < 19):
            raise NotFound(f"unknown job {id!r}", field="id")
        hqe_id = _number(request.query_params.get("hqe"), "hqe", default=0)
        if not Job.objects.filter(id=int(id)).exists():
            raise NotFound(f"unknown job {id}", field="id")
        rows = Artifact.objects.filter(Q(hqe__job_id=int(id)) & (Q(hqe_id=hqe_id) if hqe_id else Q()))
        return Response(ArtifactSerializer(rows.order_by("hqe_id", "path")[:100_000], many=True).data)
