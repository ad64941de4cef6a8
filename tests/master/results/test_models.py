"""The rule entry -> run without a per-row foreign key (migration 0013): the database still refuses an
entry of no run and a run deleted under its entries, and the ORM still deletes a run's entries with it."""

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


def test_a_run_cannot_be_deleted_under_its_entries(db):
    """Only the ORM cascades: SQL that deletes a run but not its entries is refused, as the foreign key did."""
    run = store(0)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TestRun._meta.db_table} WHERE id = %s", [run.id])
    assert TestRun.objects.filter(id=run.id).exists() and TestEntry.objects.filter(run=run).count() == 3
    empty = TestRun.objects.create(test="t", start=hour(5), format="tensorflow", digest="0" * 64)
    with connection.cursor() as cursor:  # a run without entries goes
        cursor.execute(f"DELETE FROM {TestRun._meta.db_table} WHERE id = %s", [empty.id])
    assert not TestRun.objects.filter(id=empty.id).exists()
