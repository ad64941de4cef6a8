"""REST endpoints of timelines under /api/v1/timeline/ (docs/design.md, "Timelines"): the trace export,
streamed as it is read, and the totals. Reads for anyone signed in, as the rest of the API."""

import math
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import FleetshardError
from master.access.authentication import ResultsUploadAuthentication, ShardPrincipal
from master.api.filters import parse_since
from master.api.results import IsShard, _Refused, _shard_hqe
from master.api.schema import FleetshardAutoSchema
from master.api.serializers import INT64_MAX, ErrorSerializer
from master.api.uploads import FILE_BODY, OctetStreamView, read_body
from master.api.uploads import error as _error
from master.timeline.export import gzipped, trace_chunks, trace_pieces
from master.timeline.jobtrace import MAX_TRACE_BYTES, TraceRejected, store_run_trace
from master.timeline.limits import Deadline, Holding, Slot, end_quietly, take_export_slot
from master.timeline.pftrace import pftrace_chunks
from master.timeline.query import Scope, scope
from master.timeline.stats import BY, stats


class TimelineStatsSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="The hostname, label name or shard hostname.")
    running_s = serializers.FloatField()
    cleaning_s = serializers.FloatField()
    repairing_s = serializers.FloatField()
    idle_s = serializers.FloatField(help_text="The hosts' window less their intervals.")
    utilisation = serializers.FloatField(help_text="Running over the hosts' window, 0 to 1.")
    runs = serializers.IntegerField()
    wait_p50_s = serializers.FloatField(allow_null=True, help_text="Queue wait (job created to HQE started).")
    wait_p95_s = serializers.FloatField(allow_null=True)
    repair_failed_s = serializers.FloatField()
    hosts = serializers.IntegerField(help_text="The hosts counted in the window.")


def _when(request: Request, name: str, now: datetime) -> datetime | None:
    value = request.query_params.get(name)
    if not value:
        return None
    try:
        return parse_since(value, now)
    except FleetshardError as exc:
        raise FleetshardError(exc.message.replace("invalid since", f"invalid {name}"), field=name) from None


def _job_ids(values: list[str]) -> list[int]:
    ids = []
    for value in values:
        if not (value.isascii() and value.isdigit() and len(value) < 20 and 0 < int(value) <= INT64_MAX):
            raise FleetshardError(f"invalid job id {value!r}: use a positive integer", field="job")
        ids.append(int(value))
    return ids


def _scope(request: Request) -> Scope:
    params = request.query_params
    for name, values in params.lists():
        if any("\x00" in v for v in values):
            raise FleetshardError(f"{name}: null characters are not allowed", field=name)
    now = timezone.now()
    return scope(
        now,
        shards=params.getlist("shard"),
        label=params.get("label") or None,
        jobs=_job_ids(params.getlist("job")),
        since=_when(request, "since", now),
        until=_when(request, "until", now),
    )


WHEN = "an ISO time (a naive one is UTC) or an age before now (90m, 24h, 7d)"
SCOPE = [
    OpenApiParameter("shard", str, many=True, description="Only intervals on these shards (hostnames); repeatable."),
    OpenApiParameter("label", str, description="Only hosts with this label."),
    OpenApiParameter("since", str, description=f"Only what overlaps the window from {WHEN}; slices are clipped to it."),
    OpenApiParameter("until", str, description=f"Only what overlaps the window until {WHEN}."),
]


class _TimelineView(APIView):
    schema = FleetshardAutoSchema()
    permission_classes = [IsAuthenticated]


def _encoded(chunks: Iterator[str]) -> Iterator[bytes]:
    try:
        for chunk in chunks:
            yield chunk.encode()
    finally:
        end_quietly(chunks)


class TimelineExportView(_TimelineView):
    @extend_schema(
        operation_id="timeline_export",
        tags=["timeline"],
        parameters=[
            *SCOPE,
            OpenApiParameter("job", int, many=True, description="Only these jobs' runs; repeatable."),
            OpenApiParameter("gzip", bool, description="Send the trace gzipped (application/gzip)."),
            OpenApiParameter(
                "pftrace", bool, description="Send Perfetto's protobuf trace (.pftrace) instead of Chrome JSON."
            ),
        ],
        responses={
            (200, "application/json"): OpenApiResponse(
                OpenApiTypes.OBJECT, description="Chrome Trace Event JSON: traceEvents and displayTimeUnit."
            ),
            (200, "application/gzip"): OpenApiResponse(OpenApiTypes.BINARY, description="The same, gzipped."),
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description="With pftrace=true: a Perfetto trace (.pftrace)."
            ),
            429: OpenApiResponse(
                ErrorSerializer, description="Too many exports streaming at once; Retry-After says when to retry."
            ),
        },
    )
    def get(self, request: Request) -> StreamingHttpResponse | Response:
        """The fleet's intervals as a Chrome trace (chrome://tracing, Perfetto), streamed as it is read.

        A few at once per user and per serving process (429 and Retry-After beyond), each ended at a
        deadline, cut short with a note saying so (FLEETSHARD_EXPORTS_PER_USER, FLEETSHARD_EXPORTS_PER_PROCESS,
        FLEETSHARD_EXPORT_DEADLINE_S)."""
        s = _scope(request)
        slot = take_export_slot(request.user.pk or 0)
        if not isinstance(slot, Slot):
            refused = _error(
                429,
                "too many timeline exports streaming at once (at most "
                f"{settings.FLEETSHARD_EXPORTS_PER_USER} per user, {settings.FLEETSHARD_EXPORTS_PER_PROCESS} per "
                f"server process): retry in {math.ceil(slot)} s, or narrow the window to finish sooner",
                None,
            )
            refused["Retry-After"] = str(math.ceil(slot))
            return refused
        # Inside a test's own transaction PostgreSQL must not end it: only an export's own is bounded so.
        deadline = Deadline.starting_now(
            settings.FLEETSHARD_EXPORT_DEADLINE_S, enforce_idle=not connection.in_atomic_block
        )
        stamp = s.now.strftime("%Y%m%dT%H%M%SZ")
        chunks: Iterator[bytes]
        if request.query_params.get("pftrace") in ("1", "true", "True"):
            chunks, kind, name = pftrace_chunks(s, deadline), "application/octet-stream", f"timeline-{stamp}.pftrace"
        elif request.query_params.get("gzip") in ("1", "true", "True"):
            chunks, kind, name = gzipped(trace_pieces(s, deadline)), "application/gzip", f"timeline-{stamp}.json.gz"
        else:
            chunks, kind, name = _encoded(trace_chunks(s, deadline)), "application/json", f"timeline-{stamp}.json"
        # The slot is freed when the response closes, read to its end or not.
        response = StreamingHttpResponse(Holding(chunks, slot), content_type=kind)
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        response["X-Fleetshard-Export-Deadline"] = f"{deadline.seconds:g}"
        return response


class TimelineStatsView(_TimelineView):
    @extend_schema(
        operation_id="timeline_stats",
        tags=["timeline"],
        parameters=[
            OpenApiParameter("by", str, enum=list(BY), description="Group by host (the default), label or shard."),
            *SCOPE,
        ],
        responses={200: TimelineStatsSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        """Seconds running, cleaning, repairing and idle, utilisation, runs and queue waits over a
        window (the last 24 hours unless `since` says), computed in the database."""
        rows: list[dict[str, Any]] = stats(_scope(request), request.query_params.get("by") or "host")
        return Response(TimelineStatsSerializer(rows, many=True).data)


class TraceStoredSerializer(serializers.Serializer):
    created = serializers.BooleanField(help_text="False when the HQE's trace was stored before.")
    events = serializers.IntegerField(help_text="The complete events kept.")
    dropped = serializers.IntegerField(help_text="The file's events not kept (other phases, bad times, too deep).")


class TimelineTraceView(OctetStreamView):
    """POST /api/v1/timeline/trace?hqe=ID: the `trace.json` an HQE's job wrote, from its shard."""

    authentication_classes = [ResultsUploadAuthentication]
    permission_classes = [IsShard]

    @extend_schema(
        operation_id="timeline_trace",
        tags=["timeline"],
        request=FILE_BODY,
        parameters=[
            OpenApiParameter("hqe", int, required=True, description="The HQE (of a job on this shard) that wrote it.")
        ],
        responses={
            200: OpenApiResponse(TraceStoredSerializer, description="Stored before; nothing new."),
            201: OpenApiResponse(TraceStoredSerializer, description="Stored."),
            400: OpenApiResponse(ErrorSerializer, description="Not a Chrome trace the export can use, or a bad hqe."),
            401: OpenApiResponse(ErrorSerializer, description="Missing or unknown token."),
            403: OpenApiResponse(ErrorSerializer, description="Not a shard's token, or another shard's HQE."),
            404: OpenApiResponse(ErrorSerializer, description="Unknown HQE."),
            413: OpenApiResponse(ErrorSerializer, description="Larger than 4 MiB."),
        },
    )
    def post(self, request: Request) -> Response:
        """Stores a job's own Chrome trace once; the export nests its events in the run's slice."""
        shard = request.user.shard if isinstance(request.user, ShardPrincipal) else None
        try:
            hqe = _shard_hqe(request.query_params.get("hqe"), shard)
            if hqe is None:
                raise _Refused(400, "the hqe query parameter (the HQE's id) is required", "hqe")
        except _Refused as refused:
            return refused.response
        data = read_body(request._request, MAX_TRACE_BYTES)
        if data is None:
            return _error(413, f"trace.json: larger than {MAX_TRACE_BYTES} bytes", "body")
        try:
            stored = store_run_trace(hqe, data)
        except TraceRejected as exc:
            return _error(400, f"trace.json: {exc}", "body")
        body = {"created": stored.created, "events": len(stored.trace.events), "dropped": stored.trace.dropped}
        return Response(
            TraceStoredSerializer(body).data, status=status.HTTP_201_CREATED if stored.created else status.HTTP_200_OK
        )
