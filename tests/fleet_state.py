"""A snapshot of everything the master's services can change, to assert that a refused request changed nothing."""

from typing import Any

from common.models import Host, HostQueueEntry, Job, Label, Shard
from master.models import Token


def snapshot() -> dict[str, Any]:
    return {
        "labels": list(Label.objects.values_list("name", "shard__hostname").order_by("name")),
        "hosts": list(
            Host.objects.values_list(
                "hostname", "shard__hostname", "locked", "lock_reason", "attributes", "version"
            ).order_by("hostname")
        ),
        "host_labels": sorted(
            (h.hostname, sorted(label.name for label in h.labels.all()))
            for h in Host.objects.prefetch_related("labels")
        ),
        "shards": list(Shard.objects.values_list("hostname", flat=True).order_by("hostname")),
        "shard_tokens": Token.objects.filter(shard__isnull=False).count(),
        "jobs": list(Job.objects.values_list("id", "name", "aborted", "version", "status").order_by("id")),
        "hqes": list(HostQueueEntry.objects.values_list("id", "job_id", "status").order_by("id")),
    }
