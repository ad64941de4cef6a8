"""Wire shapes of the REST API. Output field names are a contract the CLI's JSON and scripts rely on: add, never rename.

Input serializers check types and sizes, so that nothing malformed reaches the database
(PostgreSQL refuses NUL characters and out-of-range integers with a 500), and turn people's syntax
(`board:x*3`, priority `high`) into the typed values the services take; the rules live in
master.services.
"""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.ab import make_plan, parse_repeat
from common.blobs import INPUT_KINDS
from common.constants import (
    DEFAULT_MAX_RUNTIME_MINS,
    DEFAULT_TIMEOUT_MINS,
    PRIORITY_NAMES,
    REVISION_KEYVAL,
    FailureClass,
    HostOrigin,
    HostStatus,
)
from common.errors import FleetshardError
from common.models import Host, HostQueueEntry, Job, Label, Shard
from common.syntax import ASCII_DIGITS, parse_meta_hosts, parse_priority
from master.models import AuditRecord, AuditTarget, Token
from master.results.queries import result_tests

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _storable(value: str) -> str:
    """Refuses what DRF's CharField refuses but DictField keys and free-form fields do not check."""
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise serializers.ValidationError("NUL and surrogate characters are not allowed")
    return value


# Output


class LabelSerializer(serializers.ModelSerializer):
    shard: serializers.SlugRelatedField[Shard] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True, allow_null=True
    )

    class Meta:
        model = Label
        fields = ["id", "name", "shard"]


class HostSerializer(serializers.ModelSerializer):
    shard: serializers.SlugRelatedField[Shard] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True, allow_null=True
    )
    labels: serializers.SlugRelatedField[Label] = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )
    status = serializers.ChoiceField(choices=HostStatus.ALL, read_only=True)
    attributes = serializers.DictField(child=serializers.CharField(), read_only=True)
    origin = serializers.ChoiceField(
        choices=HostOrigin.ALL, read_only=True, help_text="declared by a person, or discovered by its shard."
    )
    discovered_by: serializers.SlugRelatedField[Shard] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True, allow_null=True, help_text="The shard whose discovery saw it."
    )

    class Meta:
        model = Host
        fields = [
            "id",
            "hostname",
            "status",
            "shard",
            "labels",
            "locked",
            "lock_reason",
            "attributes",
            "origin",
            "discovered_by",
            "last_seen",
        ]
        read_only_fields = fields


class ShardSerializer(serializers.ModelSerializer):
    labels: serializers.SlugRelatedField[Label] = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )
    hosts: serializers.SlugRelatedField[Host] = serializers.SlugRelatedField(
        slug_field="hostname", many=True, read_only=True
    )
    status = serializers.ChoiceField(choices=["online", "offline"], read_only=True)

    class Meta:
        model = Shard
        fields = ["id", "hostname", "labels", "status", "last_heartbeat", "hosts", "client_version"]
        read_only_fields = fields


class ShardDetailSerializer(ShardSerializer):
    """One shard with what a person looks up about it (`fleetshard shard stat`)."""

    outbox_depth = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="Updates waiting in its outbox at its last heartbeat; null: unknown."
    )
    hosts_by_status = serializers.DictField(
        child=serializers.IntegerField(), read_only=True, help_text="Its hosts counted by status."
    )
    jobs_by_status = serializers.DictField(
        child=serializers.IntegerField(), read_only=True, help_text="Its jobs counted by status."
    )

    discovered_rejected = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()),
        read_only=True,
        help_text="The discovered hosts the master refused in the shard's last set: hostname and reason.",
    )
    pools = serializers.ListField(
        child=serializers.DictField(),
        read_only=True,
        help_text="The elastic pools the shard announced: labels and max_hosts.",
    )

    class Meta(ShardSerializer.Meta):
        fields = [
            *ShardSerializer.Meta.fields,
            "outbox_depth",
            "hosts_by_status",
            "jobs_by_status",
            "discovered_generation",
            "discovered_count",
            "discovered_rejected",
            "pools",
        ]
        read_only_fields = fields


class CreatedShardSerializer(ShardSerializer):
    token = serializers.CharField(read_only=True, help_text="The shard's heartbeat token, shown this once only.")

    class Meta(ShardSerializer.Meta):
        fields = [*ShardSerializer.Meta.fields, "token"]
        read_only_fields = fields


class _FailureField(serializers.ChoiceField):
    """The failure class, or null while there is none (the model stores "")."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=FailureClass.ALL, allow_null=True, read_only=True, **kwargs)

    def to_representation(self, value: str) -> str | None:  # type: ignore[override]  # the stubs leave out null
        return value or None


class HQESerializer(serializers.ModelSerializer):
    failure = _FailureField(help_text="Why a Failed entry failed: test (non-zero exit), timeout or infra.")
    host: serializers.SlugRelatedField[Host] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True, allow_null=True
    )
    meta_host: serializers.SlugRelatedField[Label] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )

    class Meta:
        model = HostQueueEntry
        fields = ["id", "host", "meta_host", "status", "failure", "exit_code", "started_on", "finished_on"]
        read_only_fields = fields


class InputSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="Runs read it at $FLEETSHARD_INPUT_DIR/NAME.")
    digest = serializers.CharField(help_text="The blob's SHA-256 (64 hex digits), uploaded before.")
    size = serializers.IntegerField(min_value=0)
    kind = serializers.ChoiceField(choices=INPUT_KINDS, help_text="tar: a directory, unpacked for the run.")


class JobSerializer(serializers.ModelSerializer):
    shard: serializers.SlugRelatedField[Shard] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True, allow_null=True
    )
    dependency_labels: serializers.SlugRelatedField[Label] = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )
    keyvals = serializers.DictField(child=serializers.CharField(), read_only=True)
    # Declared fields named like a Field attribute (parent, label): the stubs see a clash, but DRF's
    # serializer metaclass takes them out of the class, so they never shadow Field.parent or Field.label.
    parent: serializers.PrimaryKeyRelatedField[Job] = serializers.PrimaryKeyRelatedField(  # type: ignore[assignment]
        read_only=True, allow_null=True
    )
    rerun_of = serializers.IntegerField(
        source="rerun_of_id", read_only=True, allow_null=True, help_text="The job this one runs again, if any."
    )
    hqes = HQESerializer(many=True, read_only=True)
    ab = serializers.JSONField(
        read_only=True,
        help_text="An A/B job's plan: `variants` (baseline first), `repeat`, `auto`, `min_change`; {} if plain.",
    )
    inputs = InputSerializer(many=True, read_only=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            "priority",
            "status",
            "shard",
            "created_on",
            "command",
            "timeout_mins",
            "max_runtime_mins",
            "dependency_labels",
            "keyvals",
            "parent",
            "rerun_of",
            "aborted",
            "inputs",
            "hqes",
            "ab",
        ]
        read_only_fields = fields


class QuarantinedSerializer(serializers.Serializer):
    name = serializers.CharField(read_only=True, help_text="The result file's name.")
    reason = serializers.CharField(read_only=True, help_text="Why it could not be stored.")


class EntryResultsSerializer(serializers.Serializer):
    test = serializers.CharField(read_only=True, help_text="The test the files named.")
    runs = serializers.IntegerField(read_only=True, help_text="Result files of this test stored from the entry.")
    entries = serializers.IntegerField(read_only=True, help_text="Timed entries (benchmarks) in them.")
    chart = serializers.CharField(read_only=True, help_text="The admin's page charting this test's entries (a path).")


class HQEDetailSerializer(HQESerializer):
    quarantined = QuarantinedSerializer(
        source="rejected_results",
        many=True,
        read_only=True,
        help_text="Result files set aside: refused by the master, or unsent by the shard.",
    )
    results = serializers.SerializerMethodField(help_text="Test runs stored from it.")
    result_tests = serializers.SerializerMethodField(help_text="Its stored results by test, each linked to its chart.")

    class Meta(HQESerializer.Meta):
        fields = [*HQESerializer.Meta.fields, "log_tail", "quarantined", "results", "result_tests"]
        read_only_fields = fields

    def get_results(self, hqe: HostQueueEntry) -> int:
        return len(hqe.test_runs.all())

    @extend_schema_field(EntryResultsSerializer(many=True))
    def get_result_tests(self, hqe: HostQueueEntry) -> list[dict[str, Any]]:
        return result_tests(hqe.test_runs.all())


class JobDetailSerializer(JobSerializer):
    """One job with its entries' log tails, which lists leave out: each may be 16 KiB."""

    hqes = HQEDetailSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        pass


class HostRunSerializer(serializers.ModelSerializer):
    """A host queue entry as a run of one host: its job and how it ended."""

    failure = _FailureField(help_text="Why a Failed entry failed: test (non-zero exit), timeout or infra.")
    job_name = serializers.CharField(source="job.name", read_only=True)

    class Meta:
        model = HostQueueEntry
        fields = ["id", "job", "job_name", "status", "failure", "exit_code", "started_on", "finished_on"]
        read_only_fields = fields


class HostDetailSerializer(HostSerializer):
    """One host with what it is doing and what it did (`fleetshard host stat`)."""

    # A list, not a nullable object: one entry at most in practice, and OpenAPI 3.0 cannot say "this
    # component or null" in a way every validator reads.
    running = HostRunSerializer(
        many=True, read_only=True, help_text="The entry it runs now (Starting or Running): none or one."
    )
    recent_runs = HostRunSerializer(many=True, read_only=True, help_text="Its last runs that ended, newest first.")

    class Meta(HostSerializer.Meta):
        fields = [*HostSerializer.Meta.fields, "running", "recent_runs"]
        read_only_fields = fields


class TokenSerializer(serializers.ModelSerializer):
    kind = serializers.ChoiceField(choices=["personal", "shard"], read_only=True)
    user: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    shard: serializers.SlugRelatedField[Shard] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True, allow_null=True
    )

    class Meta:
        model = Token
        fields = ["id", "prefix", "kind", "user", "shard", "description", "created_on", "last_used"]
        read_only_fields = fields


class CreatedTokenSerializer(TokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The token itself, shown this once only.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class WhoAmISerializer(serializers.Serializer):
    username = serializers.CharField(read_only=True)
    is_staff = serializers.BooleanField(read_only=True)
    is_superuser = serializers.BooleanField(read_only=True)
    tokens = TokenSerializer(
        many=True, read_only=True, help_text="The token this request came with (none for a login session)."
    )


class HostMoveSerializer(serializers.Serializer):
    """A host whose shard changed with the request; a job queued on the old shard for it cannot run there."""

    hostname = serializers.CharField(read_only=True)
    from_shard = serializers.CharField(read_only=True, allow_null=True, help_text="The shard it left, if any.")
    to_shard = serializers.CharField(read_only=True, allow_null=True, help_text="The shard it joined, if any.")


def _moves() -> HostMoveSerializer:
    return HostMoveSerializer(many=True, read_only=True, help_text="Hosts whose shard changed, by hostname.")


class LabelDeletionSerializer(serializers.Serializer):
    deleted = serializers.ListField(child=serializers.CharField(), read_only=True, help_text="The labels deleted.")
    hosts_moved = _moves()


class LabelHostsSerializer(serializers.Serializer):
    label = serializers.CharField(read_only=True)  # type: ignore[assignment]  # a declared field (see JobSerializer)
    hosts = HostSerializer(many=True, read_only=True, help_text="The hosts named, as they are now.")
    hosts_moved = _moves()
    unchanged = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Hosts named that already had the label (add): nothing was done to them, nor recorded.",
    )


class ShardChangeSerializer(ShardSerializer):
    hosts_moved = _moves()

    class Meta(ShardSerializer.Meta):
        fields = [*ShardSerializer.Meta.fields, "hosts_moved"]
        read_only_fields = fields


class ShardDeletionSerializer(serializers.Serializer):
    deleted = serializers.ListField(child=serializers.CharField(), read_only=True, help_text="The shards deleted.")
    hosts_moved = _moves()
    jobs_aborted = serializers.ListField(
        child=serializers.IntegerField(), read_only=True, help_text="Ids of the shards' active jobs, now aborted."
    )


class ErrorSerializer(serializers.Serializer):
    """Every error response: a one-line message, and details such as the offending field."""

    error = serializers.CharField()
    detail = serializers.JSONField(allow_null=True)


class AuditTargetSerializer(serializers.ModelSerializer):
    id = serializers.IntegerField(source="object_id", allow_null=True, read_only=True)

    class Meta:
        model = AuditTarget
        fields = ["kind", "id", "name"]
        read_only_fields = fields


class AuditRecordSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="actor", read_only=True, help_text="The username, or 'system'.")
    targets = AuditTargetSerializer(many=True, read_only=True)
    details = serializers.DictField(read_only=True)

    class Meta:
        model = AuditRecord
        fields = ["id", "at", "user", "action", "targets", "reason", "details"]
        read_only_fields = fields


# Input


# At most this many names or ids in one request: SQLite binds at most 32766 values in one query, and a
# request of more would fail there with a 500 rather than say what is wrong.
MAX_ITEMS = 10_000


def _names(help_text: str) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=255), min_length=1, max_length=MAX_ITEMS, help_text=help_text
    )


def _optional_names(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=255), required=False, default=list, max_length=MAX_ITEMS, **kwargs
    )


class _StringMap(serializers.DictField):
    """A JSON object of strings whose keys are checked too (DictField checks only the values)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=serializers.CharField(max_length=1024, allow_blank=True), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        value = super().to_internal_value(data)
        for key in value:
            if not key or len(key) > 255:
                raise serializers.ValidationError(f"invalid key {key!r}: use 1-255 characters")
            _storable(key)
        return value


class LabelNamesSerializer(serializers.Serializer):
    names = _names("Label names; all are created (or deleted) or none.")


class HostsOfLabelSerializer(serializers.Serializer):
    hosts = _names("Hostnames to add the label to (or remove it from).")


class HostCreateSerializer(serializers.Serializer):
    hostnames = _names("Hostnames to create, all with the same labels and attributes.")
    labels = _optional_names()
    attributes = _StringMap(required=False, default=dict)
    locked = serializers.BooleanField(required=False, default=False)
    lock_reason = serializers.CharField(max_length=1024, required=False, default="", allow_blank=True)


class HostnamesSerializer(serializers.Serializer):
    hostnames = _names("Hostnames; the change applies to all or none.")


class HostLockSerializer(HostnamesSerializer):
    reason = serializers.CharField(max_length=1024, required=False, default="", allow_blank=True)


class HostAttributesSerializer(HostnamesSerializer):
    set = _StringMap(required=False, default=dict, help_text="Attributes to set (added or replaced).")
    remove = serializers.ListField(
        child=serializers.CharField(max_length=255),
        required=False,
        default=list,
        max_length=256,
        help_text="Attribute names to remove; each must be on every host named.",
    )


class ShardCreateSerializer(serializers.Serializer):
    hostname = serializers.CharField(max_length=255)
    labels = _optional_names()


class ShardLabelsSerializer(serializers.Serializer):
    labels = _names("Labels to give to the shard; its hosts follow them.")


class ShardLabelSerializer(serializers.Serializer):
    label = serializers.CharField(max_length=255)  # type: ignore[assignment]  # a declared field (see JobSerializer)


class ShardHostnamesSerializer(serializers.Serializer):
    hostnames = _names("Shard hostnames to delete.")


class TokenCreateSerializer(serializers.Serializer):
    shard = serializers.CharField(
        max_length=255, required=False, allow_null=True, default=None, help_text="A heartbeat token for this shard."
    )
    description = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")

    def validate_description(self, value: str) -> str:
        return _storable(value)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": -INT32_MAX, "maximum": INT32_MAX},
            {"type": "string", "description": "an integer or one of " + ", ".join(PRIORITY_NAMES)},
        ]
    }
)
class PriorityField(serializers.Field):
    """An integer or a priority name (parse_priority decides which names exist), read as an integer."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | str):
            raise serializers.ValidationError("must be an integer or a priority name")
        if isinstance(data, int) and abs(data) > INT32_MAX:
            raise serializers.ValidationError(f"must be between {-INT32_MAX} and {INT32_MAX}")
        if isinstance(data, str):
            _storable(data)
            # ASCII digits only: '²'.isdigit() is true but int('²') raises. Other text goes to
            # parse_priority, which names what is accepted.
            text = data.strip()
            digits = text[1:] if text[:1] in "+-" else text
            if ASCII_DIGITS.fullmatch(digits) and (len(digits) > 10 or abs(int(digits)) > INT32_MAX):
                raise serializers.ValidationError(f"must be between {-INT32_MAX} and {INT32_MAX}")
        return parse_priority(data)

    def to_representation(self, value: Any) -> Any:
        return value


class JobCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=255)
    command = serializers.CharField()
    meta_hosts = serializers.ListField(
        child=serializers.CharField(max_length=300),
        required=False,
        default=list,
        max_length=MAX_ITEMS,
        help_text="Meta-host labels, each LABEL or LABEL*N for N different hosts with that label.",
    )
    hosts = _optional_names()
    dependency_labels = _optional_names()
    priority = PriorityField(required=False, default=PRIORITY_NAMES["default"])
    timeout_mins = serializers.IntegerField(
        min_value=1, max_value=INT32_MAX, required=False, default=DEFAULT_TIMEOUT_MINS
    )
    max_runtime_mins = serializers.IntegerField(
        min_value=1, max_value=INT32_MAX, required=False, default=DEFAULT_MAX_RUNTIME_MINS
    )
    keyvals = _StringMap(required=False, default=dict)
    parent = serializers.IntegerField(min_value=1, max_value=INT64_MAX, required=False, allow_null=True, default=None)  # type: ignore[assignment]  # a declared field (see JobSerializer)
    inputs = serializers.ListField(
        child=InputSerializer(),
        required=False,
        default=list,
        max_length=32,
        help_text="Blobs the runs read at $FLEETSHARD_INPUT_DIR/NAME; each uploaded first (PUT /api/v1/blobs/DIGEST).",
    )
    variants = serializers.ListField(
        child=serializers.CharField(max_length=64),
        required=False,
        default=list,
        max_length=MAX_ITEMS,
        help_text="An A/B job: two variant names, the baseline first; each run gets FLEETSHARD_VARIANT.",
    )
    repeat = serializers.CharField(
        required=False,
        default=None,
        allow_null=True,
        max_length=20,
        help_text="With variants: runs of each (N, default 1), or auto / auto:MAX to alternate until decided.",
    )
    revision = serializers.CharField(
        required=False, default=None, allow_null=True, max_length=255, help_text="What the job measures (a keyval)."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        variants, repeat = attrs.get("variants") or [], attrs.get("repeat")
        if repeat is not None and not variants:
            raise FleetshardError("repeat: only an A/B job (with variants) repeats its runs", field="repeat")
        attrs["ab"] = None
        if variants:
            count, auto = parse_repeat(repeat) if repeat is not None else (1, False)
            attrs["ab"] = make_plan(list(variants), count, auto=auto)
        if attrs.get("revision") is not None:
            attrs["keyvals"] = {**attrs.get("keyvals", {}), REVISION_KEYVAL: attrs["revision"]}
        return attrs

    def validate_meta_hosts(self, value: list[str]) -> list[tuple[str, int]]:
        return [pair for text in value for pair in parse_meta_hosts(text)]


class JobIdsSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=INT64_MAX), min_length=1, max_length=MAX_ITEMS
    )
