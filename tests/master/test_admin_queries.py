"""Admin pages cost the same number of SQL queries with 10 rows as with 200."""

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from common.models import Host, HostQueueEntry, Job
from master import services


@pytest.fixture
def staff(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def queries(client: Client, path: str, rows: int | None = None) -> int:
    with CaptureQueriesContext(connection) as ctx:
        resp = client.get(path)
    assert resp.status_code == 200, resp.content[:500]
    if rows is not None:
        assert resp.context["cl"].result_count == rows
    return len(ctx.captured_queries)


def grow(client: Client, path: str, add: Callable[[int, int], None]) -> tuple[int, int]:
    """Query counts of `path` with 10 rows and then with 200 (rows made by `add(start, count)`)."""
    add(0, 10)
    client.get(path)  # warm caches (content types, sessions) so both measures see the same work
    small = queries(client, path, 10)
    add(10, 190)
    large = queries(client, path, 200)
    return small, large


def test_host_changelist_queries_do_not_grow(fleet, staff):
    Host.objects.all().delete()

    def add(start: int, count: int) -> None:
        names = [f"h{i:03}" for i in range(start, start + count)]
        services.create_hosts(names, labels=["board:a", "wifi"], acting_user=None)
        services.lock_hosts(names[::3], "maintenance", acting_user=None)

    small, large = grow(staff, "/admin/common/host/", add)
    assert small == large
    # Filtered by a label (an m2m filter) and searched: still fixed.
    wifi = services.get_labels(["wifi"])[0].id
    assert queries(staff, f"/admin/common/host/?labels__id__exact={wifi}&q=h", 200) == large


def test_job_changelist_queries_do_not_grow(fleet, staff):
    def add(start: int, count: int) -> None:
        for i in range(start, start + count):
            fleet.job(f"job{i}", meta_hosts=[("board:a", 2)], dependency_labels=["wifi"] if i % 2 else [])

    small, large = grow(staff, "/admin/common/job/", add)
    assert small == large
    assert queries(staff, "/admin/common/job/?label=wifi&status__exact=Queued", 100) == large


def test_shard_and_label_changelists_and_overview_do_not_grow(db, staff):
    def add(start: int, count: int) -> None:
        for i in range(start, start + count):
            services.create_labels([f"board:{i}"], acting_user=None)
            services.create_shard(f"lab{i:03}", [f"board:{i}"], acting_user=None)
            services.create_hosts([f"dut{i}"], labels=[f"board:{i}"], acting_user=None)

    small, large = grow(staff, "/admin/common/shard/", add)
    assert small == large
    assert queries(staff, "/admin/common/label/", 200) == queries(staff, "/admin/common/label/?q=board", 200)
    few = queries(staff, "/admin/fleet/")
    add(200, 50)
    assert queries(staff, "/admin/fleet/") == few


def test_job_page_with_many_hqes_is_fixed(fleet, staff):
    services.create_hosts([f"a-extra{i}" for i in range(60)], labels=["board:a"], acting_user=None)  # one host per HQE
    small = fleet.job("small", meta_hosts=[("board:a", 2)])
    large = fleet.job("large", meta_hosts=[("board:a", 60)])
    staff.get(f"/admin/common/job/{small.id}/change/")
    assert HostQueueEntry.objects.filter(job=large).count() == 60
    assert queries(staff, f"/admin/common/job/{small.id}/change/") == queries(
        staff, f"/admin/common/job/{large.id}/change/"
    )
    assert Job.objects.count() == 2
