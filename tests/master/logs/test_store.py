"""The master's log store under concurrency: a shard's retry racing its first try (or two shard
processes sharing a database shipping the same log) keeps every byte once."""

import threading

import pytest
from django.db import connection

from common.models import HostQueueEntry
from master.logs.models import RunLog, RunLogChunk
from master.logs.store import MERGE_BELOW, LogGap, append_log


def stored(hqe_id: int) -> bytes:
    return b"".join(bytes(c.data) for c in RunLogChunk.objects.filter(log_id=hqe_id).order_by("start"))


def race(*calls) -> list:
    """Runs the calls at once, each in its own thread and connection; their results or exceptions."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def go(i: int) -> None:
        try:
            barrier.wait()
            results[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 (reported to the test as a result)
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_same_first_chunk_racing_itself_is_stored_once(fleet):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    news = []
    for _ in range(5):
        results = race(*[lambda: append_log(hqe.id, 0, b"hello\n")] * 3)
        assert all(not isinstance(r, Exception) and r.size == 6 for r in results), results
        news += [r.new for r in results]
    # Exactly one of the fifteen tries had anything new.
    assert sorted(news) == [0] * 14 + [6]
    assert stored(hqe.id) == b"hello\n" and RunLog.objects.get(hqe=hqe).size == 6


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_overlapping_chunks_racing_make_one_log_without_holes(fleet):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    append_log(hqe.id, 0, b"0123")
    results = race(lambda: append_log(hqe.id, 4, b"4567"), lambda: append_log(hqe.id, 2, b"234567"))
    assert all(not isinstance(r, Exception) for r in results), results
    assert stored(hqe.id) == b"01234567"


@pytest.mark.django_db
def test_a_gap_changes_nothing(fleet):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    append_log(hqe.id, 0, b"ab")
    with pytest.raises(LogGap) as gap:
        append_log(hqe.id, 3, b"d", final=True)
    assert gap.value.expected == 2
    log = RunLog.objects.get(hqe=hqe)
    assert (log.size, log.kept, log.complete, stored(hqe.id)) == (2, 2, False, b"ab")


@pytest.mark.django_db
def test_small_appends_share_rows_so_a_log_of_tiny_chunks_stays_a_few_rows(fleet):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    # 40,000 bytes, 100 a request, as a trickling job (or a hostile shard) would send them.
    data = bytes(range(200)) * 200
    for offset in range(0, len(data), 100):
        append_log(hqe.id, offset, data[offset : offset + 100])
    assert stored(hqe.id) == data
    rows = list(RunLogChunk.objects.filter(log_id=hqe.id).order_by("start").values_list("start", "end"))
    assert len(rows) == 3 and all(end - start <= MERGE_BELOW for start, end in rows), rows
    assert all(a_end == b_start for (_, a_end), (b_start, _) in zip(rows, rows[1:], strict=False))


@pytest.mark.django_db
def test_a_large_append_is_a_row_of_its_own(fleet):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    append_log(hqe.id, 0, b"a")
    append_log(hqe.id, 1, b"b" * MERGE_BELOW)
    append_log(hqe.id, 1 + MERGE_BELOW, b"c")
    assert list(RunLogChunk.objects.filter(log_id=hqe.id).values_list("start", "end")) == [
        (0, 1),
        (1, 1 + MERGE_BELOW),
        (1 + MERGE_BELOW, 2 + MERGE_BELOW),
    ]
    assert stored(hqe.id) == b"a" + b"b" * MERGE_BELOW + b"c"


@pytest.mark.django_db
def test_deleting_a_job_deletes_its_logs_with_it(fleet):
    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    append_log(hqe.id, 0, b"x" * (MERGE_BELOW + 1))
    append_log(hqe.id, MERGE_BELOW + 1, b"end", final=True)
    job.delete()
    assert not RunLog.objects.exists() and not RunLogChunk.objects.exists()
