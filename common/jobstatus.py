"""Keeps the stored Job.status equal to what its HQEs say, in a fixed number of queries."""

from collections import defaultdict
from collections.abc import Iterable

from common.bulk import bulk_set
from common.constants import derive_job_status
from common.models import HostQueueEntry, Job


def refresh_job_statuses(job_ids: Iterable[int]) -> None:
    ids = set(job_ids)
    if not ids:
        return
    statuses: dict[int, list[str]] = defaultdict(list)
    for job_id, status in HostQueueEntry.objects.filter(job_id__in=ids).values_list("job_id", "status"):
        statuses[job_id].append(status)
    bulk_set(Job, [{"id": i, "status": derive_job_status(statuses[i])} for i in ids], ["status"])
