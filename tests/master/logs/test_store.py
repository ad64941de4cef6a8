"""The master's log store under concurrency: a shard's retry racing its first try (or two shard
processes sharing a database shipping the same log) keeps every byte once."""

import threading

import pytest
from django.db import connection

from common.models import HostQueueEntry
from master.logs.models import RunLog, RunLogChunk
from master.logs.store import LogGap, append_log


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
