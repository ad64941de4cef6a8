"""REST views: parse the input, call one master service, render. The rules and their errors live in
master.services, so the API, the admin and the command line refuse the same things the same way."""

from collections.abc import Sequence
from typing import Any, TypeVar

from django.db.models import Model, Prefetch, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, views, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer

from common.errors import NotFound
from common.models import Host, HostQueueEntry, Job, Label, Shard
from master import services
from master.api import serializers as s
from master.api.filters import AuditFilter, HostFilter, JobFilter, LabelFilter
from master.api.pagination import BoundedLimitOffsetPagination
from master.api.parsers import BoundedJSONParser
from master.api.permissions import (
    AdminPermissions,
    AdminPermissionsOrReadOnly,
    IsOwnerOrStaffToAbort,
    has_perms,
    may_abort,
)
from master.api.schema import FleetshardAutoSchema
from master.models import AuditRecord, AuditTarget, TestRun, Token
from master.services import lookups

NO_CONTENT = OpenApiResponse(description="Done; nothing to return.")


def _valid(serializer_class: type[Serializer], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _path_name(value: str, kind: str) -> str:
    # A NUL cannot be stored, so it cannot name anything; PostgreSQL would fail on it with a 500.
    if "\x00" in value:
        raise NotFound(f"unknown {kind} {value!r}", field=kind)
    return value


_M = TypeVar("_M", bound=Model)


def _in_order(objects: QuerySet, key: str, order: Sequence[Any]) -> list[Any]:
    by_key = {getattr(obj, key): obj for obj in objects}
    return [by_key[k] for k in dict.fromkeys(order) if k in by_key]


class _Base(viewsets.GenericViewSet):
    schema = FleetshardAutoSchema()
    parser_classes = [BoundedJSONParser]
    pagination_class = BoundedLimitOffsetPagination
    lookup_value_regex = "[^/]+"

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # A NUL cannot be stored, so no filter value holds one; PostgreSQL would fail on it with a 500.
        bad = sorted(key for key, values in request.query_params.lists() if any("\x00" in v for v in values))
        if bad:
            raise ValidationError({key: ["Null characters are not allowed."] for key in bad})

    def _object(self, obj: _M) -> _M:
        self.check_object_permissions(self.request, obj)
        return obj


@extend_schema(tags=["labels"])
class LabelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, _Base):
    """Labels decide which shard owns which hosts and jobs."""

    queryset = Label.objects.select_related("shard")
    serializer_class = s.LabelSerializer
    permission_classes = [AdminPermissionsOrReadOnly]
    write_permissions = {
        "create": (("add_label",), "create labels"),
        "destroy": (("change_label",), "delete labels"),
        "delete_many": (("change_label",), "delete labels"),
        # The admin labels hosts with actions of its host page.
        "add_hosts": (("change_host",), "change the labels of hosts"),
        "remove_hosts": (("change_host",), "change the labels of hosts"),
    }
    filterset_class = LabelFilter
    ordering_fields = ["name", "id"]
    lookup_field = "name"

    def get_object(self) -> Label:
        (label,) = services.get_labels([_path_name(self.kwargs["name"], "label")])
        return self._object(label)

    @extend_schema(request=s.LabelNamesSerializer, responses={201: s.LabelSerializer(many=True)})
    def create(self, request: Request) -> Response:
        """Creates all the named labels or, when one exists or is invalid, none."""
        labels = services.create_labels(_valid(s.LabelNamesSerializer, request)["names"], acting_user=self.request.user)
        return Response(s.LabelSerializer(labels, many=True).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.LabelDeletionSerializer})
    def destroy(self, request: Request, name: str) -> Response:
        """Deletes the label; the response names the hosts that left a shard with it."""
        return self._delete([_path_name(name, "label")])

    @extend_schema(request=s.LabelNamesSerializer, responses={200: s.LabelDeletionSerializer})
    @action(detail=False, methods=["post"], url_path="delete")
    def delete_many(self, request: Request) -> Response:
        """Deletes all the named labels or, when one cannot be deleted, none; names the hosts that left a shard."""
        return self._delete(_valid(s.LabelNamesSerializer, request)["names"])

    def _delete(self, names: list[str]) -> Response:
        moves = services.delete_labels(names, acting_user=self.request.user)
        return Response(s.LabelDeletionSerializer({"deleted": list(dict.fromkeys(names)), "hosts_moved": moves}).data)

    @extend_schema(request=s.HostsOfLabelSerializer, responses={200: s.LabelHostsSerializer})
    @action(detail=True, methods=["post"])
    def add_hosts(self, request: Request, name: str) -> Response:
        """Adds the label to hosts; those without a shard join the label's shard (named in hosts_moved)."""
        hostnames = _valid(s.HostsOfLabelSerializer, request)["hosts"]
        change = services.add_label_to_hosts(_path_name(name, "label"), hostnames, acting_user=request.user)
        return self._hosts_change(name, hostnames, change)

    @extend_schema(request=s.HostsOfLabelSerializer, responses={200: s.LabelHostsSerializer})
    @action(detail=True, methods=["post"])
    def remove_hosts(self, request: Request, name: str) -> Response:
        """Removes the label from hosts; hosts whose shard came from it leave that shard (named in hosts_moved)."""
        hostnames = _valid(s.HostsOfLabelSerializer, request)["hosts"]
        change = services.remove_label_from_hosts(_path_name(name, "label"), hostnames, acting_user=request.user)
        return self._hosts_change(name, hostnames, change)

    def _hosts_change(self, name: str, hostnames: list[str], change: services.HostsChange) -> Response:
        data = {"label": name, "hosts": _hosts(hostnames), "hosts_moved": change.moves, "unchanged": change.unchanged}
        return Response(s.LabelHostsSerializer(data).data)


def _host_queryset() -> QuerySet:
    return Host.objects.select_related("shard", "discovered_by").prefetch_related("labels")


def _hosts(hostnames: Sequence[str]) -> list[Host]:
    return _in_order(_host_queryset().filter(hostname__in=hostnames), "hostname", hostnames)


@extend_schema(tags=["hosts"])
class HostViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, _Base):
    """Lab devices. Their status comes from their shard; everything else is set here."""

    serializer_class = s.HostSerializer
    permission_classes = [AdminPermissionsOrReadOnly]
    write_permissions = {
        "create": (("add_host",), "create hosts"),
        "destroy": (("change_host",), "delete hosts"),
        "delete_many": (("change_host",), "delete hosts"),
        "lock": (("change_host",), "lock hosts"),
        "unlock": (("change_host",), "unlock hosts"),
        "attributes": (("change_host",), "change the attributes of hosts"),
    }
    filterset_class = HostFilter
    ordering_fields = ["hostname", "id", "status", "locked"]
    lookup_field = "hostname"

    def get_queryset(self) -> QuerySet:
        return _host_queryset()

    def get_object(self) -> Host:
        hostname = _path_name(self.kwargs["hostname"], "host")
        services.get_hosts([hostname])  # raises the service's "unknown host" error
        return self._object(self.get_queryset().get(hostname=hostname))

    @extend_schema(responses={200: s.HostDetailSerializer})
    def retrieve(self, request: Request, hostname: str) -> Response:
        """The host, the entry it runs now and its last runs with their outcomes."""
        host = self.get_object()
        host.running = lookups.running(host)  # type: ignore[attr-defined]
        host.recent_runs = lookups.recent_runs(host)  # type: ignore[attr-defined]
        return Response(s.HostDetailSerializer(host).data)

    @extend_schema(request=s.HostCreateSerializer, responses={201: s.HostSerializer(many=True)})
    def create(self, request: Request) -> Response:
        """Creates hosts, each assigned at once to the shard owning one of its labels; all or none."""
        data = _valid(s.HostCreateSerializer, request)
        services.create_hosts(
            data["hostnames"],
            acting_user=request.user,
            labels=data["labels"],
            attributes=data["attributes"],
            locked=data["locked"],
            lock_reason=data["lock_reason"],
        )
        return Response(s.HostSerializer(_hosts(data["hostnames"]), many=True).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: NO_CONTENT})
    def destroy(self, request: Request, hostname: str) -> Response:
        services.delete_hosts([_path_name(hostname, "host")], acting_user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=s.HostnamesSerializer, responses={204: NO_CONTENT})
    @action(detail=False, methods=["post"], url_path="delete")
    def delete_many(self, request: Request) -> Response:
        """Deletes all the named hosts or, when one is busy or unknown, none."""
        services.delete_hosts(_valid(s.HostnamesSerializer, request)["hostnames"], acting_user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=s.HostLockSerializer, responses={200: s.HostSerializer(many=True)})
    @action(detail=False, methods=["post"])
    def lock(self, request: Request) -> Response:
        """Locked hosts are never given new work; a running job finishes."""
        data = _valid(s.HostLockSerializer, request)
        services.lock_hosts(data["hostnames"], data["reason"], acting_user=request.user)
        return Response(s.HostSerializer(_hosts(data["hostnames"]), many=True).data)

    @extend_schema(request=s.HostAttributesSerializer, responses={200: s.HostSerializer(many=True)})
    @action(detail=False, methods=["post"])
    def attributes(self, request: Request) -> Response:
        """Sets and removes attributes of hosts, all or none; their shard hands them to jobs."""
        data = _valid(s.HostAttributesSerializer, request)
        services.set_host_attributes(data["hostnames"], data["set"], data["remove"], acting_user=request.user)
        return Response(s.HostSerializer(_hosts(data["hostnames"]), many=True).data)

    @extend_schema(request=s.HostnamesSerializer, responses={200: s.HostSerializer(many=True)})
    @action(detail=False, methods=["post"])
    def unlock(self, request: Request) -> Response:
        hostnames = _valid(s.HostnamesSerializer, request)["hostnames"]
        services.unlock_hosts(hostnames, acting_user=request.user)
        return Response(s.HostSerializer(_hosts(hostnames), many=True).data)


def _shard_queryset() -> QuerySet:
    return Shard.objects.prefetch_related(
        "labels", Prefetch("hosts", queryset=Host.objects.only("id", "hostname", "shard_id"))
    )


@extend_schema(tags=["shards"])
class ShardViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, _Base):
    """Labs. A shard owns its labels, and through them hosts and jobs."""

    serializer_class = s.ShardSerializer
    permission_classes = [AdminPermissionsOrReadOnly]
    write_permissions = {
        # The response carries the shard's heartbeat token, and a shard token needs change_shard.
        "create": (("add_shard", "change_shard"), "create shards"),
        "destroy": (("change_shard",), "delete shards"),
        "delete_many": (("change_shard",), "delete shards"),
        "add_labels": (("change_shard",), "change the labels of shards"),
        "remove_label": (("change_shard",), "change the labels of shards"),
    }
    ordering_fields = ["hostname", "id", "last_heartbeat"]
    lookup_field = "hostname"

    def get_queryset(self) -> QuerySet:
        return _shard_queryset()

    def get_object(self) -> Shard:
        shard = services.get_shard(_path_name(self.kwargs["hostname"], "shard"))
        return self._object(self.get_queryset().get(id=shard.id))

    @extend_schema(responses={200: s.ShardDetailSerializer})
    def retrieve(self, request: Request, hostname: str) -> Response:
        """The shard, its outbox depth as it last reported it, and its hosts and jobs counted by status."""
        shard = self.get_object()
        shard.hosts_by_status = lookups.hosts_by_status(shard)  # type: ignore[attr-defined]
        shard.jobs_by_status = lookups.jobs_by_status(shard)  # type: ignore[attr-defined]
        return Response(s.ShardDetailSerializer(shard).data)

    @extend_schema(
        request=s.ShardCreateSerializer,
        responses={201: s.CreatedShardSerializer},
        description="Creates a shard and its heartbeat token; the token is in this response only.",
    )
    def create(self, request: Request) -> Response:
        data = _valid(s.ShardCreateSerializer, request)
        shard, token = services.create_shard(data["hostname"], data["labels"], acting_user=request.user)
        created = self.get_queryset().get(id=shard.id)
        created.token = token
        return Response(s.CreatedShardSerializer(created).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.ShardDeletionSerializer})
    def destroy(self, request: Request, hostname: str) -> Response:
        """Deletes the shard; the response names the hosts that left it and the jobs aborted."""
        return self._delete([_path_name(hostname, "shard")])

    @extend_schema(request=s.ShardHostnamesSerializer, responses={200: s.ShardDeletionSerializer})
    @action(detail=False, methods=["post"], url_path="delete")
    def delete_many(self, request: Request) -> Response:
        """Deletes the shards: their labels and hosts are unassigned, their active jobs aborted."""
        return self._delete(_valid(s.ShardHostnamesSerializer, request)["hostnames"])

    def _delete(self, hostnames: list[str]) -> Response:
        deletion = services.delete_shards(hostnames, acting_user=self.request.user)
        data = {
            "deleted": list(dict.fromkeys(hostnames)),
            "hosts_moved": deletion.moves,
            "jobs_aborted": deletion.aborted_job_ids,
        }
        return Response(s.ShardDeletionSerializer(data).data)

    @extend_schema(request=s.ShardLabelsSerializer, responses={200: s.ShardChangeSerializer})
    @action(detail=True, methods=["post"])
    def add_labels(self, request: Request, hostname: str) -> Response:
        """Gives labels to the shard; hosts with them join it (named in hosts_moved)."""
        change = services.add_labels_to_shard(
            _path_name(hostname, "shard"),
            _valid(s.ShardLabelsSerializer, request)["labels"],
            acting_user=request.user,
        )
        return self._shard_change(change)

    @extend_schema(request=s.ShardLabelSerializer, responses={200: s.ShardChangeSerializer})
    @action(detail=True, methods=["post"])
    def remove_label(self, request: Request, hostname: str) -> Response:
        """Takes a label from the shard; hosts whose shard came from it leave (named in hosts_moved)."""
        change = services.remove_label_from_shard(
            _path_name(hostname, "shard"),
            _valid(s.ShardLabelSerializer, request)["label"],
            acting_user=request.user,
        )
        return self._shard_change(change)

    def _shard_change(self, change: services.ShardChange) -> Response:
        shard = self.get_queryset().get(id=change.shard.id)
        shard.hosts_moved = change.moves
        return Response(s.ShardChangeSerializer(shard).data)


@extend_schema_view(
    list=extend_schema(description="Jobs, newest first."),
)
@extend_schema(tags=["jobs"])
class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, _Base):
    """Jobs and their host queue entries. Anyone signed in submits; the owner or staff abort."""

    serializer_class = s.JobSerializer
    permission_classes = [IsAuthenticated, IsOwnerOrStaffToAbort]
    filterset_class = JobFilter
    ordering_fields = ["id", "priority", "created_on", "name", "owner", "status"]
    lookup_field = "id"

    def get_queryset(self) -> QuerySet:
        hqes = HostQueueEntry.objects.select_related("host", "meta_host")
        if self.action != "retrieve":
            hqes = hqes.defer("log_tail")
        else:  # the detail's results and quarantined files (HQEDetailSerializer)
            runs = TestRun.objects.only("id", "test", "entry_count", "hqe_id").order_by()
            hqes = hqes.prefetch_related("rejected_results", Prefetch("test_runs", runs))
        return Job.objects.select_related("shard").prefetch_related("dependency_labels", Prefetch("hqes", hqes))

    def get_serializer_class(self) -> type[Serializer]:
        return s.JobDetailSerializer if self.action == "retrieve" else s.JobSerializer

    def get_object(self) -> Job:
        raw = _path_name(self.kwargs["id"], "job")
        # ASCII digits only: '³'.isdigit() is true but int('³') raises (a 500, found by fuzzing).
        digits = raw.isascii() and raw.isdigit() and len(raw) < 19
        job = self.get_queryset().filter(id=int(raw)).first() if digits else None
        if job is None:
            raise NotFound(f"unknown job {raw}", field="id")
        return self._object(job)

    @extend_schema(request=s.JobCreateSerializer, responses={201: s.JobSerializer})
    def create(self, request: Request) -> Response:
        """Creates a job owned by the caller, routed at once to the one shard that can run all of it."""
        data = _valid(s.JobCreateSerializer, request)
        job = services.create_job(
            services.JobRequest(
                name=data["name"],
                owner=request.user.username,
                command=data["command"],
                meta_hosts=data["meta_hosts"],
                hosts=data["hosts"],
                dependency_labels=data["dependency_labels"],
                priority=data["priority"],
                timeout_mins=data["timeout_mins"],
                max_runtime_mins=data["max_runtime_mins"],
                keyvals=data["keyvals"],
                parent_id=data["parent"],
                ab=data["ab"],
                inputs=[dict(i) for i in data["inputs"]],
            ),
            acting_user=request.user,
        )
        return Response(s.JobSerializer(self.get_queryset().get(id=job.id)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={201: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def rerun(self, request: Request, id: str) -> Response:
        """A new job with this one's spec, owned by the caller; `rerun_of` names this one. Anyone who may
        submit a job may rerun any: the new job is theirs."""
        raw = _path_name(id, "job")
        if not (raw.isascii() and raw.isdigit() and len(raw) < 19):
            raise NotFound(f"unknown job {raw!r}", field="id")
        job = services.rerun_job(int(raw), owner=request.user.username, acting_user=request.user)
        return Response(s.JobSerializer(self.get_queryset().get(id=job.id)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def abort(self, request: Request, id: str) -> Response:
        """Asks the job's shard to stop it; its entries end Aborted."""
        job = self.get_object()
        services.abort_jobs([job.id], acting_user=request.user)
        return Response(s.JobSerializer(self.get_queryset().get(id=job.id)).data)

    @extend_schema(
        operation_id="jobs_abort_many", request=s.JobIdsSerializer, responses={200: s.JobSerializer(many=True)}
    )
    @action(detail=False, methods=["post"], url_path="abort")
    def abort_many(self, request: Request) -> Response:
        """Aborts all the given jobs or, when one is unknown, finished or not yours, none."""
        ids = _valid(s.JobIdsSerializer, request)["ids"]
        others = [j for j in Job.objects.filter(id__in=ids).only("id", "owner") if not may_abort(request.user, j)]
        if others:
            listed = ", ".join(f"{j.id} (owner {j.owner})" for j in sorted(others, key=lambda j: j.id))
            raise PermissionDenied(
                f"only a job's owner or staff with the common.change_job permission may abort it: "
                f"not yours: job {listed}"
            )
        jobs = services.abort_jobs(ids, acting_user=request.user)
        return Response(
            s.JobSerializer(
                _in_order(self.get_queryset().filter(id__in=ids), "id", [j.id for j in jobs]), many=True
            ).data
        )


@extend_schema_view(
    list=extend_schema(
        description="Changes made on the master, newest first: who, when, what, to which objects, and why."
    ),
)
@extend_schema(tags=["audit"])
class AuditViewSet(mixins.ListModelMixin, _Base):
    """The audit trail, read-only: each record is written by the change it describes, in its transaction."""

    serializer_class = s.AuditRecordSerializer
    permission_classes = [AdminPermissionsOrReadOnly]
    write_permissions: dict[str, tuple[tuple[str, ...], str]] = {}
    filterset_class = AuditFilter
    ordering_fields = ["at", "id"]

    def get_queryset(self) -> QuerySet:
        return AuditRecord.objects.prefetch_related(Prefetch("targets", AuditTarget.objects.order_by("id")))


def _id(raw: str, kind: str) -> int:
    """An id from the URL: ASCII digits only ('³'.isdigit() is true but int('³') raises)."""
    raw = _path_name(raw, kind)
    if not (raw.isascii() and raw.isdigit() and len(raw) < 19):
        raise NotFound(f"unknown {kind} {raw}", field="id")
    return int(raw)


@extend_schema(tags=["tokens"])
class TokenViewSet(mixins.ListModelMixin, _Base):
    """API tokens, for those the admin lets manage them: the raw token is in the create response only."""

    serializer_class = s.TokenSerializer
    permission_classes = [AdminPermissions]
    read_permission = (("master.view_token",), "list tokens")
    write_permissions = {
        "create": (("master.add_token",), "create tokens"),
        "destroy": (("master.change_token",), "revoke tokens"),
    }
    ordering_fields = ["id", "created_on", "last_used"]

    def get_queryset(self) -> QuerySet:
        return Token.objects.select_related("user", "shard").order_by("-created_on", "-id")

    @extend_schema(request=s.TokenCreateSerializer, responses={201: s.CreatedTokenSerializer})
    def create(self, request: Request) -> Response:
        """A personal token for the caller or, with `shard`, another heartbeat token for that shard."""
        data = _valid(s.TokenCreateSerializer, request)
        if data["shard"] is not None:
            # A shard token speaks for the shard, as in the admin (master/admin/tokens.py).
            if not has_perms(request.user, ("change_shard",)):
                raise PermissionDenied("only staff with the common.change_shard permission may create a shard token")
            token, raw = services.create_shard_token(
                _path_name(data["shard"], "shard"), description=data["description"], acting_user=request.user
            )
        else:
            token, raw = services.create_personal_token(
                request.user.username, description=data["description"], acting_user=request.user
            )
        token.token = raw  # type: ignore[attr-defined]  # shown in this response only
        return Response(s.CreatedTokenSerializer(token).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: NO_CONTENT})
    def destroy(self, request: Request, pk: str) -> Response:
        """Revokes the token: requests with it are refused from now on."""
        services.revoke_token(_id(pk, "token"), acting_user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(tags=["tokens"])
class WhoAmIView(views.APIView):
    """Who the caller's token speaks for."""

    schema = FleetshardAutoSchema()
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: s.WhoAmISerializer})
    def get(self, request: Request) -> Response:
        user = request.user
        data = {
            "username": user.username,
            "is_staff": user.is_staff,
            "is_superuser": user.is_superuser,
            "tokens": [request.auth] if isinstance(request.auth, Token) else [],
        }
        return Response(s.WhoAmISerializer(data).data)
