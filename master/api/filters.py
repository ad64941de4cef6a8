"""Query filters of the list endpoints. Filters by name resolve the name first, so an unknown label
or shard is an error that names it (404) rather than a silently empty list."""

from datetime import UTC, datetime

from django.db import connections
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_filters import rest_framework as filters

from common.ages import parse_age
from common.constants import HostOrigin, HostStatus, JobStatus
from common.errors import FleetshardError
from common.models import Host, Job, Label
from master import services
from master.api.serializers import INT64_MAX
from master.models import AuditRecord, AuditTarget


def _by_shard(queryset: QuerySet, name: str, value: str) -> QuerySet:
    return queryset.filter(shard=services.get_shard(value))


def _by_label(queryset: QuerySet, name: str, value: str) -> QuerySet:
    (label,) = services.get_labels([value])
    return queryset.filter(labels=label)


class LabelFilter(filters.FilterSet):
    shard = filters.CharFilter(method=_by_shard, help_text="Only the labels of this shard (hostname).")
    name = filters.CharFilter(help_text="Exact label name.")

    class Meta:
        model = Label
        fields = ["shard", "name"]


class HostFilter(filters.FilterSet):
    label = filters.CharFilter(method=_by_label, help_text="Only hosts with this label.")
    shard = filters.CharFilter(method=_by_shard, help_text="Only hosts assigned to this shard (hostname).")
    status = filters.ChoiceFilter(choices=[(s, s) for s in HostStatus.ALL])
    locked = filters.BooleanFilter()
    hostname = filters.CharFilter(help_text="Exact hostname.")
    origin = filters.ChoiceFilter(choices=[(o, o) for o in HostOrigin.ALL], help_text="declared or discovered.")

    class Meta:
        model = Host
        fields = ["label", "shard", "status", "locked", "hostname", "origin"]


class JobFilter(filters.FilterSet):
    status = filters.ChoiceFilter(choices=[(s, s) for s in JobStatus.ALL])
    owner = filters.CharFilter(help_text="Exact username of the job's owner.")
    shard = filters.CharFilter(method=_by_shard, help_text="Only jobs assigned to this shard (hostname).")
    name = filters.CharFilter(help_text="Exact job name.")
    name_like = filters.CharFilter(
        method="filter_name_like",
        help_text="Job names matching this pattern: `*` any characters, `?` one (bench-*, *nightly*).",
    )
    since = filters.CharFilter(
        method="filter_since", help_text="Only jobs created at or after this ISO time, or within this age (90m, 24h)."
    )
    ids = filters.CharFilter(method="filter_ids", help_text="Comma-separated job ids, e.g. 4,5,9.")

    class Meta:
        model = Job
        fields = ["status", "owner", "shard", "name", "name_like", "since", "ids"]

    def filter_name_like(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        backtracking = connections[queryset.db].vendor != "postgresql"
        return queryset.filter(name__regex=glob_regex(value, "name_like", backtracking=backtracking))

    def filter_since(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(created_on__gte=parse_since(value, timezone.now()))

    def filter_ids(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        ids = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if not part.isdigit() or not 0 < int(part) <= INT64_MAX:
                raise FleetshardError(f"invalid job id {part!r} in ids: use positive integers", field="ids")
            ids.append(int(part))
        return queryset.filter(id__in=ids)


MAX_PATTERN_CHARS = 255


def glob_regex(pattern: str, field: str, *, backtracking: bool = False) -> str:
    """A shell-like pattern (`*`, `?`) as a regular expression both PostgreSQL and SQLite (Python's re)
    read alike: letters, digits and non-ASCII characters stand for themselves, other ASCII characters
    are escaped with a backslash, which both read as the character itself. For a `backtracking` engine
    (Python's, behind SQLite's REGEXP) each `*` but the last takes the first place its text fits, in an
    atomic group: `*a*a*a...*b` as plain `.*` tried every split of a name, for hours."""
    bad = next((c for c in pattern if ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF), None)
    if bad is not None or not pattern or len(pattern) > MAX_PATTERN_CHARS:
        raise FleetshardError(
            f"invalid {field} {pattern[:40]!r}: use 1 to {MAX_PATTERN_CHARS} printable characters, "
            "with * for any characters and ? for one",
            field=field,
        )
    segments = ["".join(_glob_char(c) for c in text) for text in pattern.split("*")]
    if len(segments) == 1:
        return "^" + segments[0] + "$"
    first, middle, last = segments[0], [s for s in segments[1:-1] if s], segments[-1]
    if backtracking:
        # A segment is of fixed length, so its first place is never worse than a later one.
        return "(?s)^" + first + "".join(f"(?>.*?{s})" for s in middle) + ".*" + last + "$"
    return "^" + first + "".join(f".*{s}" for s in middle) + ".*" + last + "$"


def _glob_char(char: str) -> str:
    if char == "?":
        return "."
    return char if char.isalnum() or not char.isascii() else "\\" + char


def parse_since(text: str, now: datetime) -> datetime:
    """`2026-11-23T04:00:00Z` (a naive time is UTC) or an age before `now` such as 90m, 24h, 7d."""
    age = parse_age(text)
    try:
        if age is not None:
            return now - age
        when = parse_datetime(text.strip())
        if when is not None:
            when = when if timezone.is_aware(when) else when.replace(tzinfo=UTC)
            when.astimezone(UTC)  # the database compares in UTC: 0001-01-01T00:00+01:00 has no UTC time
            return when
    except ValueError:
        pass
    except OverflowError:
        raise FleetshardError(
            f"invalid since {text!r}: it is before year 1 or after year 9999", field="since"
        ) from None
    raise FleetshardError(
        f"invalid since {text!r}: use an ISO time (2026-11-23T04:00:00Z) or an age such as 90m, 24h or 7d",
        field="since",
    )


def _touching(queryset: QuerySet, kind: str, **target: object) -> QuerySet:
    return queryset.filter(id__in=AuditTarget.objects.filter(kind=kind, **target).values("record_id"))


class AuditFilter(filters.FilterSet):
    host = filters.CharFilter(method="filter_host", help_text="Only changes that touched this host (hostname).")
    job = filters.CharFilter(method="filter_job", help_text="Only changes that touched this job (id).")
    user = filters.CharFilter(
        field_name="actor", help_text="Only changes by this username ('system': the master's own)."
    )
    since = filters.CharFilter(
        method="filter_since", help_text="Only changes at or after this ISO time, or within this age (90m, 24h, 7d)."
    )

    class Meta:
        model = AuditRecord
        fields = ["host", "job", "user", "since"]

    def filter_host(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        # By name: the trail outlives the host, and a deleted host's changes stay findable.
        return _touching(queryset, "host", name=value)

    def filter_job(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        if not (value.isascii() and value.isdigit() and len(value) < 20 and 0 < int(value) <= INT64_MAX):
            raise FleetshardError(f"invalid job id {value!r}: use a positive integer", field="job")
        return _touching(queryset, "job", object_id=int(value))

    def filter_since(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(at__gte=parse_since(value, timezone.now()))
