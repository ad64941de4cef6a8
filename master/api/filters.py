"""Query filters of the list endpoints. Filters by name resolve the name first, so an unknown label
or shard is an error that names it (404) rather than a silently empty list."""

from django.db.models import QuerySet
from django_filters import rest_framework as filters

from common.constants import HostStatus, JobStatus
from common.errors import FleetshardError
from common.models import Host, Job, Label
from master import services
from master.api.serializers import INT64_MAX


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

    class Meta:
        model = Host
        fields = ["label", "shard", "status", "locked", "hostname"]


class JobFilter(filters.FilterSet):
    status = filters.ChoiceFilter(choices=[(s, s) for s in JobStatus.ALL])
    owner = filters.CharFilter(help_text="Exact username of the job's owner.")
    shard = filters.CharFilter(method=_by_shard, help_text="Only jobs assigned to this shard (hostname).")
    name = filters.CharFilter(help_text="Exact job name.")
    ids = filters.CharFilter(method="filter_ids", help_text="Comma-separated job ids, e.g. 4,5,9.")

    class Meta:
        model = Job
        fields = ["status", "owner", "shard", "name", "ids"]

    def filter_ids(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        ids = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if not part.isdigit() or not 0 < int(part) <= INT64_MAX:
                raise FleetshardError(f"invalid job id {part!r} in ids: use positive integers", field="ids")
            ids.append(int(part))
        return queryset.filter(id__in=ids)
