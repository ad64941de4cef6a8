"""The rule entry -> run without a per-row foreign key (migration 0013): the database still refuses an
entry of no run, and a deleted run (by the ORM or by SQL) leaves no entries."""

import io

import pytest
from django.db import IntegrityError, connection, transaction

from master.models import TestEntry, TestRun
from master.results.ingest import store_result_file
from tests.master.results.factories import hour, tf_file


def store(i: int, n: int = 3) -> TestRun:
    timings = {f"e{j}": 1.0 + j for j in range(n)}
    return store_result_file(tf_file("t", hour(i), timings), "r.json", acting_user=None).run


def missing_run_id() -> int:
    return (TestRun.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1000


def test_deleting_a_run_deletes_its_entries_and_no_other(db):
    gone, kept = store(0), store(1)
    gone.delete()
    assert not TestEntry.objects.filter(run_id=gone.id).exists()
    assert TestEntry.objects.filter(run=kept).count() == 3
    TestRun.objects.filter(id=kept.id).delete()  # a queryset's delete (purge's) cascades too
    assert not TestEntry.objects.exists()


def test_an_entry_of_no_run_cannot_be_written(db):
    run = store(0)
    bad = missing_run_id()
    with pytest.raises(IntegrityError), transaction.atomic():
        TestEntry.objects.create(run_id=bad, test="t", entry="x", start=hour(0), wall_time_s=1.0)
    # One statement of many rows (how ingest writes them): a single bad row refuses them all.
    good, wrong = (
        TestEntry(run=run, test="t", entry="y", start=hour(0)),
        TestEntry(run_id=bad, test="t", entry="z", start=hour(0)),
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        TestEntry.objects.bulk_create([good, wrong])
    with pytest.raises(IntegrityError), transaction.atomic():
        TestEntry.objects.filter(run=run, entry="e0").update(run_id=bad)
    assert sorted(TestEntry.objects.values_list("run_id", "entry")) == [(run.id, "e0"), (run.id, "e1"), (run.id, "e2")]


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="COPY is PostgreSQL's")
def test_a_copy_naming_no_run_is_refused(db):
    """Ingest writes entries with COPY: the check is the statement's, over all its rows."""
    run = store(0)
    rows = f"{run.id}\tt\tok\t{hour(0).isoformat()}\n{missing_run_id()}\tt\tbad\t{hour(0).isoformat()}\n"
    with (
        pytest.raises(IntegrityError),
        transaction.atomic(),
        connection.cursor() as cursor,
        connection.wrap_database_errors,
    ):
        cursor.copy_expert("COPY master_testentry (run_id, test, entry, start) FROM STDIN", io.StringIO(rows))
    assert TestEntry.objects.count() == 3


def test_sql_that_deletes_a_run_deletes_its_entries(db):
    """Not only the ORM cascades: a run deleted by SQL takes its entries along, and no other run's."""
    gone, kept = store(0), store(1)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TestRun._meta.db_table} WHERE id = %s", [gone.id])
    assert not TestEntry.objects.filter(run_id=gone.id).exists()
    assert TestEntry.objects.filter(run=kept).count() == 3


@pytest.fixture
def before_0013(transactional_db):
    """The test database taken back to just before migration 0013; forward to the latest again afterwards."""
    from django.db.migrations.executor import MigrationExecutor

    MigrationExecutor(connection).migrate([("master", "0012_subscription_creator_cascade")])
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_0013_migrates_a_database_with_entries_and_back(before_0013):
    """Rows stored under the per-row foreign key stay, and the rules hold after the move either way."""
    from django.db.migrations.executor import MigrationExecutor

    run = store(0)  # the ingest writes the same columns before and after 0013
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert TestEntry.objects.filter(run=run).count() == 3
    with pytest.raises(IntegrityError), transaction.atomic():
        TestEntry.objects.create(run_id=missing_run_id(), test="t", entry="x", start=hour(0))
    MigrationExecutor(connection).migrate([("master", "0012_subscription_creator_cascade")])
    assert TestEntry.objects.filter(run=run).count() == 3
