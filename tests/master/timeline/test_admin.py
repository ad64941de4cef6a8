"""The admin's timeline: the fleet overview's utilisation table and download link, a job's link."""

import gzip
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from common.models import Host
from master.timeline.models import Interval
from tests.master.test_admin_queries import OVERVIEW_QUERIES
from tests.master.timeline.factories import T0, add_run, add_state
from tests.master.timeline.validate import validate


@pytest.fixture
def staff(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def _recent(hostname, ago, length, **kw):
    """A run that started `ago` seconds before now, in the factories' seconds after T0."""
    start = (timezone.now() - T0).total_seconds() - ago
    return add_run(hostname, start, start + length, **kw)


def test_overview_shows_each_shards_utilisation_in_pinned_queries(fleet, staff, django_assert_num_queries):
    Host.objects.update(created_on=timezone.now() - timedelta(days=2))  # older than the day the overview shows
    _recent("a1", 7200, 3600)
    staff.get("/admin/fleet/")
    with django_assert_num_queries(OVERVIEW_QUERIES):
        page = staff.get("/admin/fleet/")
    rows = {r["key"]: r for r in page.context["snapshot"].utilisation}
    assert rows["lab1"]["running_s"] == pytest.approx(3600) and rows["lab1"]["runs"] == 1
    assert rows["lab1"]["utilisation"] == pytest.approx(3600 / (3 * 86400), rel=1e-3)
    html = page.content.decode()
    assert 'id="fs-utilisation"' in html and '<tr data-shard="lab1">' in html
    for i in range(50):
        _recent("a2", 60 * (i + 2), 30)
    add_state("a3", "Repairing", 0, None)
    assert Interval.objects.count() == 52
    with django_assert_num_queries(OVERVIEW_QUERIES):
        staff.get("/admin/fleet/")


def test_download_links_give_the_trace_to_a_signed_in_operator(fleet, staff):
    run = _recent("a1", 600, 60)
    page = staff.get("/admin/fleet/").content.decode()
    assert 'href="/api/v1/timeline/export?since=24h&amp;gzip=true"' in page
    resp = staff.get("/api/v1/timeline/export?since=24h&gzip=true")
    trace = json.loads(gzip.decompress(b"".join(resp.streaming_content)))
    assert validate(trace).slices == 1
    job_page = staff.get(f"/admin/common/job/{run.job_id}/change/").content.decode()
    link = f"/api/v1/timeline/export?job={run.job_id}&amp;gzip=true"
    assert link in job_page
    resp = staff.get(link.replace("&amp;", "&"))
    assert [
        e["args"]["job"]
        for e in json.loads(gzip.decompress(b"".join(resp.streaming_content)))["traceEvents"]
        if e["ph"] == "X"
    ] == [run.job_id]
