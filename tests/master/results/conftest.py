"""The API's schema-checked clients, for the results endpoints, and an HQE a shard reports for."""

import pytest

from common.models import HostQueueEntry
from master import services
from tests.master.api.conftest import anonymous, other_user, staff, user

__all__ = ["anonymous", "other_user", "staff", "user"]


@pytest.fixture
def shard_hqe(fleet):
    """An HQE of a job on lab1, with its host, as a shard uploads for."""
    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    hqe.host = services.get_hosts(["a1"])[0]
    hqe.save(update_fields=["host"])
    return hqe
