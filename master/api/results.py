"""REST endpoints of benchmark results under /api/v1/results/: the upload of one result file (a
person's token or a shard's) and the queries of docs/design.md ("Benchmark results"), whose field names
are the CLI's JSON."""

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.constants import MAX_RESULT_FILE_BYTES, MAX_RESULT_REASON_CHARS, HQEStatus
from common.errors import FleetshardError, NotFound
from common.models import Host, HostQueueEntry, Job, Shard
from common.result_formats import ResultFormatError
from common.syntax import parse_repeat_number, parse_variant_name
from master.access.authentication import ResultsUploadAuthentication, ShardPrincipal
from master.api.filters import parse_since
from master.api.parsers import BoundedJSONParser
from master.api.permissions import AdminPermissionsOrReadOnly
from master.api.schema import FleetshardAutoSchema
from master.api.serializers import INT64_MAX, ErrorSerializer, QuarantinedSerializer
from master.api.uploads import FILE_BODY, OctetStreamView, read_body
from master.api.uploads import error as _error
from master.api.views import _Base
from master.results import compare, queries
from master.results.ingest import record_rejection, record_shard_quarantine, store_result_file
from master.results.models import REGRESSION_FIELDS, Regression, RegressionStatus, TestRun
from master.results.regressions import parse_status, set_regression_status

# Output


class ResultTestSerializer(serializers.Serializer):
    test = serializers.CharField(read_only=True)
    runs = serializers.IntegerField(read_only=True, help_text="How many runs (result files) it has.")
    latest_start = serializers.DateTimeField(read_only=True)


class RunSerializer(serializers.ModelSerializer):
    host: serializers.SlugRelatedField[Host] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True, allow_null=True
    )
    shard: serializers.SlugRelatedField[Shard] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True, allow_null=True
    )
    job: serializers.PrimaryKeyRelatedField[Job] = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True)
    hqe: serializers.PrimaryKeyRelatedField[HostQueueEntry] = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True
    )
    entries = serializers.IntegerField(source="entry_count", read_only=True, help_text="How many entries it has.")
    label = serializers.CharField(  # type: ignore[assignment]  # a declared field (see JobSerializer)
        read_only=True, help_text="The host's board label at run time; '' for uploads."
    )

    class Meta:
        model = TestRun
        fields = [
            "id",
            "test",
            "start",
            "job",
            "hqe",
            "host",
            "shard",
            "entries",
            "label",
            "format",
            "created_on",
            "revision",
            "variant",
            "repeat",
        ]
        read_only_fields = fields


# A row of master.results.queries.timings. Its fields are declared for the schema; rows are written
# out directly, since DRF's per-field calls were the larger part of a page's time.
class TimingSerializer(serializers.Serializer):
    test = serializers.CharField(read_only=True)
    entry = serializers.CharField(read_only=True)
    start = serializers.DateTimeField(read_only=True)
    wall_time_s = serializers.FloatField(read_only=True, allow_null=True)
    cpu_time_s = serializers.FloatField(read_only=True, allow_null=True)
    iterations = serializers.IntegerField(read_only=True, allow_null=True)
    host = serializers.CharField(read_only=True, allow_null=True)
    job = serializers.IntegerField(read_only=True, allow_null=True)
    label = serializers.CharField(read_only=True)  # type: ignore[assignment]  # a declared field (see JobSerializer)
    run = serializers.IntegerField(read_only=True)

    def to_representation(self, row: dict[str, Any]) -> dict[str, Any]:
        return {
            "test": row["test"],
            "entry": row["entry"],
            "start": self.fields["start"].to_representation(row["start"]),
            "wall_time_s": row["wall_time_s"],
            "cpu_time_s": row["cpu_time_s"],
            "iterations": row["iterations"],
            "host": row["host"],
            "job": row["job"],
            "label": row["label"],
            "run": row["run_id"],
        }


class RegressionSerializer(serializers.ModelSerializer):
    start = serializers.DateTimeField(read_only=True, help_text="The start of the first slow run.")
    before_s = serializers.FloatField(read_only=True, help_text="Typical timing (median) before the step, seconds.")
    after_s = serializers.FloatField(read_only=True, help_text="Typical timing (median) after the step, seconds.")

    class Meta:
        model = Regression
        fields = ["id", *REGRESSION_FIELDS]
        read_only_fields = fields


class UploadSerializer(serializers.Serializer):
    created = serializers.BooleanField(help_text="False: the same file was stored before; nothing new.")
    run = RunSerializer()


class QuarantineReportSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=MAX_RESULT_REASON_CHARS, help_text="Why the shard set the file aside (as in its NAME.error)."
    )


class QuarantineRecordSerializer(serializers.Serializer):
    created = serializers.BooleanField(help_text="False: this file of this HQE was reported before; nothing new.")
    quarantined = QuarantinedSerializer(help_text="The file as the job's stat lists it.")


class RegressionStatusSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=RegressionStatus.choices)


# Query parameters


def _since(request: Request) -> Any:
    value = request.query_params.get("since")
    return parse_since(value, timezone.now()) if value else None


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name, "")
    if not value:
        raise FleetshardError(f"the {name} query parameter is required", field=name)
    return value


SINCE = OpenApiParameter(
    "since", str, description="Only runs that started at or after this ISO time, or within this age (90m, 24h, 7d)."
)
TEST = OpenApiParameter("test", str, required=True, description="The test's name.")


class _ResultsBase(mixins.ListModelMixin, _Base):
    permission_classes = [AdminPermissionsOrReadOnly]
    write_permissions: dict[str, tuple[tuple[str, ...], str]] = {}
    filter_backends: list[Any] = []


@extend_schema(tags=["results"], parameters=[SINCE])
class ResultTestViewSet(_ResultsBase):
    """Tests that have results: how many runs each, and the latest start."""

    serializer_class = ResultTestSerializer

    def get_queryset(self) -> Any:
        return queries.tests(_since(self.request))


REVISION = OpenApiParameter("revision", str, description="Only runs that measured this revision.")


@extend_schema(tags=["results"], parameters=[TEST, SINCE, REVISION])
class ResultRunViewSet(_ResultsBase):
    """A test's runs (one per result file), newest first."""

    serializer_class = RunSerializer

    def get_queryset(self) -> Any:
        params = self.request.query_params
        return queries.runs(_required(self.request, "test"), _since(self.request), revision=params.get("revision"))


@extend_schema(
    tags=["results"],
    parameters=[
        TEST,
        OpenApiParameter("entry", str, required=True, description="The entry's (benchmark's) name."),
        OpenApiParameter("label", str, description="Only runs on hosts with this board label ('' for uploads)."),
        SINCE,
    ],
)
class TimingViewSet(_ResultsBase):
    """One entry's timings, newest first: seconds per iteration, with the host and job of each run."""

    serializer_class = TimingSerializer

    def get_queryset(self) -> Any:
        return queries.timings(
            _required(self.request, "test"),
            _required(self.request, "entry"),
            label=self.request.query_params.get("label"),
            since=_since(self.request),
        )


@extend_schema(tags=["results"])
class RegressionViewSet(mixins.RetrieveModelMixin, _ResultsBase):
    """Timings that stepped up and stayed there, per (test, entry, board label); people triage them."""

    serializer_class = RegressionSerializer
    write_permissions = {"partial_update": (("master.change_regression",), "change the status of regressions")}
    http_method_names = ["get", "patch", "head", "options"]

    def get_queryset(self) -> Any:
        params = self.request.query_params
        state = params.get("status")
        return queries.regressions(params.get("test"), parse_status(state) if state else None)

    def get_object(self) -> Regression:
        raw = self.kwargs["pk"]
        found = None
        if raw.isascii() and raw.isdigit() and len(raw) < 19:
            found = Regression.objects.filter(id=int(raw)).first()
        if found is None:
            raise NotFound(f"unknown regression {raw}", field="id")
        return self._object(found)

    @extend_schema(
        parameters=[
            OpenApiParameter("test", str, description="Only this test's regressions."),
            OpenApiParameter("status", str, enum=RegressionStatus.values, description="Only regressions in it."),
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=RegressionStatusSerializer, responses={200: RegressionSerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        """Sets the regression's status: acknowledged, invalid, fixed, or new again."""
        reg = self.get_object()
        serializer = RegressionStatusSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        reg = set_regression_status(reg.id, serializer.validated_data["status"], acting_user=request.user)
        return Response(RegressionSerializer(reg).data)


# The upload


class MayUploadResults(BasePermission):
    """A shard (for its own HQEs, checked by the view), or a person with master.add_testrun or staff."""

    message = "only staff or people with the master.add_testrun permission may upload results"

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if isinstance(user, ShardPrincipal):
            return True
        return bool(user and user.is_authenticated and user.is_active) and (
            user.is_staff or user.has_perm("master.add_testrun")
        )


ERROR = ErrorSerializer


class ResultUploadView(OctetStreamView):
    """POST /api/v1/results/upload?name=FILE[&hqe=ID]: the raw bytes of one result file."""

    authentication_classes = [ResultsUploadAuthentication]
    permission_classes = [MayUploadResults]

    @extend_schema(
        operation_id="results_upload",
        tags=["results"],
        request=FILE_BODY,
        parameters=[
            OpenApiParameter("name", str, required=True, description="The file's base name, for messages."),
            OpenApiParameter(
                "hqe", int, description="With a shard's token only: the HQE (of a job on that shard) it came from."
            ),
            OpenApiParameter("variant", str, description="The A/B variant the run measured."),
            OpenApiParameter("repeat", int, description="Which repeat of the A/B run it is (1 to 1000)."),
        ],
        responses={
            200: OpenApiResponse(UploadSerializer, description="The same file was stored before; nothing new."),
            201: OpenApiResponse(UploadSerializer, description="Stored."),
            400: OpenApiResponse(ERROR, description="Malformed file or parameters; `error` names the file and field."),
            401: OpenApiResponse(ERROR, description="Missing or unknown token."),
            403: OpenApiResponse(ERROR, description="Not allowed: a person without permission, another shard's HQE."),
            404: OpenApiResponse(ERROR, description="Unknown HQE."),
            409: OpenApiResponse(
                ERROR,
                description="The master has not heard which host ran the HQE yet (it has not ended there):"
                " send it again later.",
            ),
            413: OpenApiResponse(ERROR, description="The file is larger than 16 MiB."),
        },
    )
    def post(self, request: Request) -> Response:
        """Stores one result file (TensorFlow TestResults or Google Benchmark JSON), once."""
        caller = request.user
        shard = caller.shard if isinstance(caller, ShardPrincipal) else None
        try:
            name = _file_name(request)
            hqe = _shard_hqe(request.query_params.get("hqe"), shard)
            variant, repeat = _ab_tags(request)
        except _Refused as refused:
            return refused.response
        if hqe is not None and hqe.host_id is None and hqe.status not in HQEStatus.TERMINAL:
            # The shard's heartbeat naming the run's host has not arrived yet: the shard keeps the file
            # and sends it again on its next pass, so the run is filed under its host. An HQE the master
            # knows ended without a host had it deleted (a host with an active HQE cannot be): its
            # results are stored with no host, under their shard, rather than refused forever.
            return _error(
                409, f"hqe: HQE {hqe.id} has no host on the master yet: send it after the next heartbeat", None
            )
        data = read_body(request._request, MAX_RESULT_FILE_BYTES)
        if data is None:
            return _error(413, f"{name}: larger than {MAX_RESULT_FILE_BYTES} bytes", "body")
        try:
            stored = store_result_file(
                data,
                name,
                hqe=hqe,
                shard=shard,
                acting_user=None if shard else caller,
                variant=variant,
                repeat=repeat,
            )
        except ResultFormatError as exc:
            if hqe is not None:
                record_rejection(hqe, name, data, exc)
            return _error(400, str(exc), exc.field or "body")
        return Response(
            UploadSerializer({"created": stored.created, "run": stored.run}).data,
            status=status.HTTP_201_CREATED if stored.created else status.HTTP_200_OK,
        )


def _file_name(request: Request) -> str:
    name = request.query_params.get("name", "")
    if not name or len(name) > 255 or "\x00" in name:
        raise _Refused(400, "the name query parameter (the file's name, 1-255 characters) is required", "name")
    return name


def _ab_tags(request: Request) -> tuple[str, int | None]:
    """The `variant` and `repeat` of an A/B run's result file; both or neither."""
    variant, repeat = request.query_params.get("variant"), request.query_params.get("repeat")
    if variant is None and repeat is None:
        return "", None
    if variant is None or repeat is None:
        raise _Refused(400, "variant and repeat: give both for an A/B run's file, or neither", "variant")
    try:
        return parse_variant_name(variant), parse_repeat_number(repeat)
    except FleetshardError as exc:
        raise _Refused(400, str(exc), exc.field or "variant") from exc


def _shard_hqe(raw: str | None, shard: Shard | None) -> HostQueueEntry | None:
    """The HQE `raw` names, checked to be of a job on `shard`; the shard reads a refusal naming `hqe` as
    one of the whole run (docs/protocol.md, "Results")."""
    if raw is None:
        return None
    if shard is None:
        raise _Refused(400, "hqe: only a shard's token may attach results to an HQE", "hqe")
    if not (raw.isascii() and raw.isdigit() and 0 < int(raw) <= INT64_MAX):
        raise _Refused(400, f"hqe: invalid HQE id {raw!r}: use a positive integer", "hqe")
    hqe = HostQueueEntry.objects.select_related("job", "host").filter(id=int(raw)).first()
    if hqe is None:
        raise _Refused(404, f"hqe: unknown HQE {raw}", "hqe")
    if hqe.job.shard_id != shard.id:
        raise _Refused(403, f"hqe: HQE {raw} is not of a job on shard {shard.hostname}", "hqe")
    return hqe


class _Refused(Exception):
    def __init__(self, status_code: int, message: str, field: str) -> None:
        super().__init__(message)
        self.response = _error(status_code, message, field)


class IsShard(BasePermission):
    message = "only a shard's token may report its quarantined result files"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.user, ShardPrincipal)


class ResultQuarantinedView(APIView):
    """POST /api/v1/results/quarantined?name=FILE&hqe=ID: a result file the shard set aside unsent."""

    schema = FleetshardAutoSchema()
    authentication_classes = [ResultsUploadAuthentication]
    permission_classes = [IsShard]
    parser_classes = [BoundedJSONParser]

    @extend_schema(
        operation_id="results_quarantined",
        tags=["results"],
        request=QuarantineReportSerializer,
        parameters=[
            OpenApiParameter("name", str, required=True, description="The file's base name in the run's results/."),
            OpenApiParameter("hqe", int, required=True, description="The HQE (of a job on this shard) it came from."),
        ],
        responses={
            200: OpenApiResponse(QuarantineRecordSerializer, description="Reported before; nothing new."),
            201: OpenApiResponse(QuarantineRecordSerializer, description="Recorded."),
            400: OpenApiResponse(ERROR, description="Bad parameters or reason, or the HQE's reports are full."),
            401: OpenApiResponse(ERROR, description="Missing or unknown token."),
            403: OpenApiResponse(ERROR, description="Not a shard's token, or another shard's HQE."),
            404: OpenApiResponse(ERROR, description="Unknown HQE."),
        },
    )
    def post(self, request: Request) -> Response:
        """Records why the shard quarantined one of an HQE's result files without sending it (a link, a
        file over the size limit, one file too many): the job's stat and the admin list it beside the
        files the master refused. Idempotent: the same file of the same HQE is recorded once."""
        shard = request.user.shard if isinstance(request.user, ShardPrincipal) else None
        try:
            name = _file_name(request)
            hqe = _shard_hqe(request.query_params.get("hqe"), shard)
            if hqe is None:
                raise _Refused(400, "the hqe query parameter (the HQE's id) is required", "hqe")
        except _Refused as refused:
            return refused.response
        body = QuarantineReportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        recorded = record_shard_quarantine(hqe, name, body.validated_data["reason"])
        return Response(
            QuarantineRecordSerializer({"created": recorded.created, "quarantined": recorded.rejection}).data,
            status=status.HTTP_201_CREATED if recorded.created else status.HTTP_200_OK,
        )


# Comparisons


class CompareRowSerializer(serializers.Serializer):
    test = serializers.CharField(read_only=True)
    entry = serializers.CharField(read_only=True)
    base_median_s = serializers.FloatField(read_only=True, allow_null=True, help_text="The base side's median, s.")
    new_median_s = serializers.FloatField(read_only=True, allow_null=True, help_text="The new side's median, s.")
    change_pct = serializers.FloatField(read_only=True, allow_null=True, help_text="new median over base median, %.")
    ci_low_pct = serializers.FloatField(read_only=True, allow_null=True, help_text="95% interval of the change, low.")
    ci_high_pct = serializers.FloatField(read_only=True, allow_null=True, help_text="95% interval of the change, high.")
    p_value = serializers.FloatField(
        read_only=True, allow_null=True, help_text="Mann-Whitney's p, corrected across entries (Benjamini-Hochberg)."
    )
    base_runs = serializers.IntegerField(read_only=True, help_text="Timings on the base side.")
    new_runs = serializers.IntegerField(read_only=True, help_text="Timings on the new side.")
    verdict = serializers.ChoiceField(
        read_only=True, choices=["slower", "faster", "no change", "too few runs"], help_text="What the numbers say."
    )


SIDE_HELP = "JOB_ID (a job's results), JOB_ID:VARIANT (one variant of an A/B job) or rev:REVISION."


class CompareView(APIView):
    """GET /api/v1/results/compare?base=SIDE&new=SIDE: two sides' timings, entry by entry."""

    schema = FleetshardAutoSchema()
    permission_classes = [AdminPermissionsOrReadOnly]

    @extend_schema(
        operation_id="results_compare",
        tags=["results"],
        parameters=[
            OpenApiParameter("base", str, required=True, description=f"The baseline: {SIDE_HELP}"),
            OpenApiParameter("new", str, required=True, description=f"What is compared with it: {SIDE_HELP}"),
            OpenApiParameter("test", str, description="Only this test's entries."),
            OpenApiParameter("label", str, description="Only runs on hosts with this board label."),
            OpenApiParameter(
                "min_change", float, description="The least change in percent that counts as one (default 2)."
            ),
        ],
        responses={
            200: OpenApiResponse(
                CompareRowSerializer(many=True), description="One row per entry, largest slowdown first."
            ),
            400: OpenApiResponse(ERROR, description="A malformed side, a side without results, or too many timings."),
            401: OpenApiResponse(ERROR, description="Missing or unknown token."),
        },
    )
    def get(self, request: Request) -> Response:
        """Compares each entry's timings on two sides: medians, change, its 95% interval, p-value, verdict."""
        params = request.query_params
        bad = sorted(key for key, values in params.lists() if any("\x00" in v for v in values))
        if bad:
            raise FleetshardError(f"{bad[0]}: null characters are not allowed", field=bad[0])
        rows = compare.compare_sides(
            compare.parse_side(_required(request, "base"), "base"),
            compare.parse_side(_required(request, "new"), "new"),
            test=params.get("test"),
            label=params.get("label"),
            min_change_pct=compare.parse_min_change(params.get("min_change")),
        )
        return Response(rows)
