"""REST endpoints of timelines under /api/v1/timeline/ (DESIGN.md, "Timelines"): the trace export,
streamed as it is read, and the totals. Reads for anyone signed in, as the rest of the API."""

from datetime import datetime
from typing import Any

from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import FleetshardError
from master.api.filters import parse_since
from master.api.schema import FleetshardAutoSchema
from master.api.serializers import INT64_MAX
from master.timeline.export import gzipped, trace_chunks
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


class TimelineExportView(_TimelineView):
    @extend_schema(
        operation_id="timeline_export",
        tags=["timeline"],
        parameters=[
            *SCOPE,
            OpenApiParameter("job", int, many=True, description="Only these jobs' runs; repeatable."),
            OpenApiParameter("gzip", bool, description="Send the trace gzipped (application/gzip)."),
        ],
        responses={
            (200, "application/json"): OpenApiResponse(
                OpenApiTypes.OBJECT, description="Chrome Trace Event JSON: traceEvents and displayTimeUnit."
            ),
            (200, "application/gzip"): OpenApiResponse(OpenApiTypes.BINARY, description="The same, gzipped."),
        },
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        """The fleet's intervals as a Chrome trace (chrome://tracing, Perfetto), streamed as it is read."""
        s = _scope(request)
        chunks = trace_chunks(s)
        stamp = s.now.strftime("%Y%m%dT%H%M%SZ")
        if request.query_params.get("gzip") in ("1", "true", "True"):
            response = StreamingHttpResponse(gzipped(chunks), content_type="application/gzip")
            response["Content-Disposition"] = f'attachment; filename="timeline-{stamp}.json.gz"'
        else:
            response = StreamingHttpResponse((c.encode() for c in chunks), content_type="application/json")
            response["Content-Disposition"] = f'attachment; filename="timeline-{stamp}.json"'
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
