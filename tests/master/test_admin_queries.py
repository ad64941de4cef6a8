"""Admin pages cost the same, exactly pinned, number of SQL queries with 1 row as with more than a page."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from common.models import HostQueueEntry, Job, Label
from master import services
from tests.master.rows import add_rows
from tests.support import assert_status

MANY = 120  # more than a page (100 rows)


@pytest.fixture
def staff(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


# Each changelist and its exact query count, plain, filtered, searched and sorted: the session, the
# user, the filters' choices, the page's count (shown; no second COUNT(*) of the whole table:
# show_full_result_count is off), its rows with their select_related relations, and one query per
# prefetched relation. `{label}` is the first row's label id.
CHANGELISTS = [
    ("/admin/common/label/", 6, ["?q=board", "?o=-1"]),  # and its hosts counted
    ("/admin/common/host/", 7, ["?labels__id__exact={label}&q=dut", "?locked__exact=0&status__exact=Ready", "?o=-1"]),
    ("/admin/common/shard/", 6, ["?state=offline&q=lab", "?o=6", "?o=-9"]),  # and its hosts by status
    ("/admin/common/job/", 6, ["?label=board:0&status__exact=Queued", "?o=3"]),
    ("/admin/master/token/", 4, ["?kind=shard"]),
]


@pytest.mark.parametrize("path, expected, queries", CHANGELISTS)
def test_changelist_query_count_is_pinned_and_equal_for_one_row_and_many(
    staff, django_assert_num_queries, path, expected, queries
):
    add_rows(0, 1)
    urls = [path] + [path + q.format(label=Label.objects.get(name="board:0").id) for q in queries]
    staff.get(path)  # warm caches (content types, the session) so both measures see the same work
    for url in urls:
        with django_assert_num_queries(expected):
            assert staff.get(url).context["cl"].result_count == 1
    add_rows(1, MANY - 1)
    for url in urls:
        with django_assert_num_queries(expected):
            cl = staff.get(url).context["cl"]
        # A filter on the first row's label keeps that row only; every other page grew.
        assert cl.result_count == 1 if "labels__id__exact" in url or "label=board:0" in url else cl.result_count > 1
    with django_assert_num_queries(expected):
        assert len(staff.get(path).context["cl"].result_list) == 100  # a full page


# The other changelists of the master's admin, whose rows add_rows does not make (or makes many of
# at once): the same count before and after it. The session, the user, then the page's own.
OTHER_CHANGELISTS = [
    ("/admin/master/auditrecord/", 8),  # with its date hierarchy's years and its rows' targets
    ("/admin/auth/user/", 6),
    ("/admin/auth/group/", 5),
    ("/admin/master/testrun/", 7),
    ("/admin/master/regression/", 4),
    ("/admin/master/rejectedresult/", 4),
    ("/admin/master/subscription/", 4),
]


@pytest.mark.parametrize("path, expected", OTHER_CHANGELISTS)
def test_other_changelists_cost_the_same_with_few_rows_and_many(staff, django_assert_num_queries, path, expected):
    add_rows(0, 1)
    staff.get(path)
    with django_assert_num_queries(expected):
        assert_status(staff.get(path), 200)
    add_rows(1, MANY - 1)
    with django_assert_num_queries(expected):
        assert_status(staff.get(path), 200)


# The session, the user, the shards, hosts grouped by shard and status, active jobs and jobs failed
# in a day grouped by shard, the page's labels, and the utilisation table's three (its sums, its
# hosts, its queue waits) for the page's shards. The same on any page, in any order, with a search.
OVERVIEW_QUERIES = 10
OVERVIEW_URLS = ["/admin/fleet/", "/admin/fleet/?sort=name", "/admin/fleet/?sort=hosts&q=lab0"]


def test_overview_query_count_is_pinned(staff, django_assert_num_queries):
    add_rows(0, 1)
    staff.get("/admin/fleet/")
    for url in OVERVIEW_URLS:
        with django_assert_num_queries(OVERVIEW_QUERIES):
            assert_status(staff.get(url), 200)
    add_rows(1, MANY - 1)
    for url in [*OVERVIEW_URLS, "/admin/fleet/?page=3&sort=heartbeat"]:
        with django_assert_num_queries(OVERVIEW_QUERIES):
            assert_status(staff.get(url), 200)
    # No shard matches: no page of shards to count the utilisation of.
    with django_assert_num_queries(OVERVIEW_QUERIES - 3):
        assert "no shard's name contains" in staff.get("/admin/fleet/?q=nothing").content.decode()
    # A bad parameter is answered before any query of the fleet; a page past the last after counting.
    with django_assert_num_queries(2):
        assert_status(staff.get("/admin/fleet/?page=abc"), 400)
    with django_assert_num_queries(6):
        assert_status(staff.get("/admin/fleet/?page=4"), 404)


def test_job_page_query_count_is_pinned_whatever_its_hqes(fleet, staff, django_assert_num_queries):
    services.create_hosts([f"a-extra{i}" for i in range(60)], labels=["board:a"], acting_user=None)  # one host per HQE
    small = fleet.job("small", meta_hosts=[("board:a", 1)])
    large = fleet.job("large", meta_hosts=[("board:a", 60)])
    staff.get(f"/admin/common/job/{small.id}/change/")
    assert HostQueueEntry.objects.filter(job=large).count() == 60
    for job in (small, large):
        # 8: the page's 6, its results by test, the outputs its runs left.
        with django_assert_num_queries(8):
            assert_status(staff.get(f"/admin/common/job/{job.id}/change/"), 200)
    assert Job.objects.count() == 2
