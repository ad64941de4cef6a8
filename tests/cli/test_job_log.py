"""`fleetshard job log` against a live server; the log is what a shard pushed (master.logs.store)."""

import json
import threading
import time

import pytest

from common.constants import MAX_LOG_READ_BYTES, HQEStatus
from common.models import HostQueueEntry
from master.logs.store import append_log
from tests.cli.conftest import fails, ok

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hqe(fleet) -> HostQueueEntry:
    return HostQueueEntry.objects.get(job=fleet.job())


def test_job_log_prints_the_whole_log_in_as_many_reads_as_it_takes(cli, hqe):
    big = b"".join(b"line %07d\n" % n for n in range(MAX_LOG_READ_BYTES // 13 + 1000))
    for start in range(0, len(big), 200_000):
        append_log(hqe.id, start, big[start : start + 200_000])
    result = ok(cli("job", "log", str(hqe.job_id)))
    assert result.stdout == big.decode()
    assert result.stderr == ""


def test_job_log_json_is_one_object_with_the_whole_text(cli, hqe):
    append_log(hqe.id, 0, b"hello\n\xff", final=True)
    out = json.loads(ok(cli("job", "log", str(hqe.job_id), "--hqe", str(hqe.id), "--json")).stdout)
    assert out["text"] == "hello\n\ufffd" and out["complete"] is True and out["ended"] is True
    assert (out["job"], out["hqe"], out["offset"], out["next_offset"]) == (hqe.job_id, hqe.id, 0, 7)


def test_job_log_shows_terminal_controls_instead_of_acting_on_them(cli, hqe):
    append_log(hqe.id, 0, b"\x1b]0;owned\x07red \x1b[31mtext\n")
    assert ok(cli("job", "log", str(hqe.job_id))).stdout == "\\x1b]0;owned\\x07red \\x1b[31mtext\n"


def test_job_log_says_on_stderr_when_there_is_no_log_yet(cli, hqe):
    result = ok(cli("job", "log", str(hqe.job_id)))
    assert result.stdout == ""
    assert result.stderr == f"job {hqe.job_id} entry {hqe.id} has no log yet (Queued)\n"


def test_job_log_says_on_stderr_where_the_master_cut_the_log(cli, hqe, settings):
    settings.FLEETSHARD_MAX_LOG_BYTES = 6
    append_log(hqe.id, 0, b"12345\n789\n", final=True)
    result = ok(cli("job", "log", str(hqe.job_id)))
    assert result.stdout == "12345\n"
    assert result.stderr.startswith("[fleetshard] the master keeps the first 6 bytes of this log")


def test_job_log_follow_prints_output_as_it_comes_and_ends_with_the_entry(cli, hqe):
    def shard() -> None:
        offset = 0
        for n in range(4):
            line = f"tick {n}\n".encode()
            append_log(hqe.id, offset, line, final=n == 3)
            offset += len(line)
            time.sleep(0.3)
        HostQueueEntry.objects.filter(id=hqe.id).update(status=HQEStatus.COMPLETED)

    HostQueueEntry.objects.filter(id=hqe.id).update(status=HQEStatus.RUNNING)
    writer = threading.Thread(target=shard)
    started = time.monotonic()
    writer.start()
    result = ok(cli("job", "log", str(hqe.job_id), "--follow"))
    writer.join()
    assert result.stdout == "tick 0\ntick 1\ntick 2\ntick 3\n"
    assert time.monotonic() - started < 10


def test_job_log_follow_json_is_one_slice_per_line(cli, hqe):
    append_log(hqe.id, 0, b"a\n")
    append_log(hqe.id, 2, b"b\n", final=True)
    lines = ok(cli("job", "log", str(hqe.job_id), "-f", "--json")).stdout.splitlines()
    slices = [json.loads(line) for line in lines]
    assert "".join(s["text"] for s in slices) == "a\nb\n" and slices[-1]["ended"] is True


def test_job_log_of_a_job_with_several_entries_asks_for_one(cli, fleet):
    job = fleet.job(meta_hosts=[("board:a", 2)])
    fails(cli("job", "log", str(job.id)), f"hqe: job {job.id} has 2 entries: name one with --hqe N")


def test_job_log_of_an_unknown_job_fails_in_one_line(cli, fleet):
    fails(cli("job", "log", "987654"), "unknown job 987654")


def test_job_log_refuses_a_bad_entry_as_usage(cli, hqe):
    result = cli("job", "log", str(hqe.job_id), "--hqe", "0")
    assert result.exit_code == 2 and "--hqe" in result.stderr
