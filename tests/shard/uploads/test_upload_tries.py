"""Issue 23, finding 1 on the shard: a record the master answers but fails on (a 500, a 409) delays
only that record, and is quarantined, with the reason reported, after a bounded number of tries."""

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shard.run.workspace import ARCHIVE, QUARANTINE, TRACE
from shard.sync.client import MasterUnavailable, RecordFailed, unavailable
from shard.uploads.record_tries import RecordTries
from shard.uploads.results import Sender, upload_run
from tests.shard.uploads.test_results_upload import (
    WRITES_RESULTS,
    Answers,
    lab,
    listing,
    make_run,
    master_rows,
    owners,
    sender_of,
    tf_file,
    uploader_for,
)

__all__ = ["lab"]  # the fixture, used below

FAILED = RecordFailed("the master answered HTTP 500: Internal Server Error")


def tries(max_tries: int = 3, healthy: list[float | None] | None = None) -> RecordTries:
    seen = healthy if healthy is not None else []
    return RecordTries(max_tries, lambda: 0.0, lambda: seen[-1] if seen else float("inf"))


def due_now(t: RecordTries) -> None:
    for attempts in t.by_key.values():
        attempts.next_at = 0.0


def runs(tmp_path: Path, *files: dict[str, bytes]) -> list[Path]:
    return [make_run(tmp_path / str(n), f) for n, f in enumerate(files)]


def test_a_file_the_master_fails_on_holds_back_neither_its_runs_other_files_nor_later_runs(tmp_path):
    first, second = runs(tmp_path, {"a-bad.json": b"{}", "b-good.json": b"{}"}, {"c.json": b"{}"})
    answers = Answers(**{"a-bad.json": FAILED})
    t = tries()
    assert not upload_run(first, 12, answers, owners(), threading.Event(), t)
    assert upload_run(second, 13, answers, owners(), threading.Event(), t)
    assert [name for _, name, _ in answers.sent] == ["b-good.json", "c.json"]
    assert listing(first / "results") == ["a-bad.json"] and listing(first / ARCHIVE) == ["b-good.json"]
    assert listing(second / ARCHIVE) == ["c.json"]
    # Not due yet: the next pass does not send it again before its backoff.
    assert not upload_run(first, 12, answers, owners(), threading.Event(), t)
    assert t.by_key[(12, "a-bad.json")].count == 1


def test_a_file_failed_too_often_is_quarantined_with_the_reason_and_reported(tmp_path):
    (run,) = runs(tmp_path, {"bad.json": b"{}"})
    answers = Answers(**{"bad.json": FAILED})
    t = tries(3)
    for _ in range(2):
        assert not upload_run(run, 12, answers, owners(), threading.Event(), t)
        due_now(t)
    assert upload_run(run, 12, answers, owners(), threading.Event(), t)
    reason = f"not stored: the master failed on it 3 times; the last: {FAILED}"
    assert listing(run / QUARANTINE) == ["bad.json", "bad.json.error"]
    assert (run / QUARANTINE / "bad.json.error").read_text() == reason + "\n"
    assert answers.reported == [(12, "bad.json", reason)]
    assert t.waiting() == 0


def test_a_trace_the_master_fails_on_waits_and_the_results_go_on(tmp_path):
    (run,) = runs(tmp_path, {"a.json": b"{}"})
    (run / TRACE).write_bytes(b"[]")
    answers = Answers(**{TRACE: FAILED})
    t = tries(2)
    assert not upload_run(run, 12, answers, owners(), threading.Event(), t)
    assert listing(run / ARCHIVE) == ["a.json"] and (run / TRACE).exists()
    due_now(t)
    assert upload_run(run, 12, answers, owners(), threading.Event(), t)
    assert listing(run / QUARANTINE) == [TRACE, TRACE + ".error"]


def test_a_failing_report_of_a_file_given_up_does_not_keep_it(tmp_path):
    (run,) = runs(tmp_path, {"bad.json": b"{}"})
    answers = Answers(**{"bad.json": FAILED})
    answers.report_answers["bad.json"] = FAILED
    t = tries(1)
    assert upload_run(run, 12, answers, owners(), threading.Event(), t)
    assert listing(run / QUARANTINE) == ["bad.json", "bad.json.error"]


def test_an_outage_still_stops_the_pass_and_counts_no_try(tmp_path):
    (run,) = runs(tmp_path, {"a.json": b"{}", "b.json": b"{}"})
    t = tries()
    with pytest.raises(MasterUnavailable) as raised:
        upload_run(run, 12, Answers(**{"a.json": MasterUnavailable("down")}), owners(), threading.Event(), t)
    assert not isinstance(raised.value, RecordFailed)
    assert listing(run / "results") == ["a.json", "b.json"] and t.waiting() == 0


def test_tries_count_only_while_the_master_otherwise_answers_well():
    """A master failing everything (its database down) delays records but never gives them up."""
    healthy: list[float | None] = [None]
    t = tries(2, healthy)
    assert t.failed("k", "500") is None  # the first try always counts
    assert t.failed("k", "500") is None and t.by_key["k"].count == 1
    healthy.append(float("inf"))  # something was answered well since
    assert t.failed("k", "500") == "failed on it 2 times; the last: 500"


@pytest.mark.parametrize(
    ("code", "kind"), [(500, RecordFailed), (409, RecordFailed), (401, MasterUnavailable), (503, MasterUnavailable)]
)
def test_which_answers_are_one_records_and_which_an_outage(code, kind):
    assert type(unavailable(code, "x")) is kind


def test_the_uploader_goes_on_past_a_run_whose_file_the_master_fails_on(world):
    """Oldest first used to stop at the first failure: the later run's file waited behind it forever."""
    world.host("h1", ("lab",))
    world.host("h2", ("lab",))
    older = world.job(WRITES_RESULTS, meta_host="lab")
    world.run_until(lambda: world.finished(older), what="the first job to end")
    newer = world.job(WRITES_RESULTS, meta_host="lab")
    world.run_until(lambda: world.finished(newer), what="the second job to end")
    answers = Answers()
    failing = world.hqe(older).id

    def send(hqe_id: int, name: str, data: bytes):
        if hqe_id == failing:
            raise FAILED
        return Answers.send(answers, hqe_id, name, data)

    answers.send = send  # type: ignore[method-assign]
    uploader = uploader_for(world, answers)
    uploader.find_ended()
    uploader.upload_pending(threading.Event())
    assert listing(Path(world.results_dir(newer)) / ARCHIVE) == ["r.json"]
    assert listing(Path(world.results_dir(older)) / "results") == ["r.json"]
    assert list(uploader.pending) == [failing]


@pytest.mark.e2e
def test_a_file_the_real_master_keeps_answering_409_is_quarantined_and_shown_in_the_jobs_stat(
    master_server, tmp_path, lab
):
    shard, hqe_id = lab
    # The master never hears which host ran it (and that it ended): a 409 on every try.
    master_server.shell(
        "from common.models import HostQueueEntry\n"
        f"result = HostQueueEntry.objects.filter(id={hqe_id}).update(host_id=None)"
    )
    run = make_run(tmp_path, {"r.json": tf_file("never-placed", 1_700_000_900)})
    sender = sender_of(master_server, shard)
    t = tries(2)
    assert not upload_run(run, hqe_id, sender, owners(), threading.Event(), t)
    due_now(t)
    assert upload_run(run, hqe_id, sender, owners(), threading.Event(), t)
    assert listing(run / QUARANTINE) == ["r.json", "r.json.error"]
    ((name, reason),) = master_rows(
        master_server, f"SELECT name, reason FROM master_rejectedresult WHERE hqe_id = {int(hqe_id)}"
    )
    assert name == "r.json"
    assert reason.startswith("not stored: the master failed on it 2 times; the last: the master answered HTTP 409")


class SlowOnSome(BaseHTTPRequestHandler):
    """A master that takes every record but answers those named slow* only after the shard gave up."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "name=slow" in self.path:
            time.sleep(1.5)
        try:
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"created": true}')
        except OSError:
            pass  # the shard stopped waiting

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_master() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowOnSome)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_file_the_master_is_too_slow_on_holds_back_no_later_run(tmp_path, slow_master):
    """A large file on a busy master outlasting the read timeout was an outage: the pass stopped at it,
    and the next pass began with it again, so no later run's results ever went. Now it waits its own
    backoff like a 500, and counts as a failed try."""
    first, second = runs(tmp_path, {"slow.json": b"{}"}, {"good.json": b"{}"})
    sender = Sender(slow_master, "token", timeout_s=0.3)
    t = tries()
    assert not upload_run(first, 12, sender, owners(), threading.Event(), t)
    assert upload_run(second, 13, sender, owners(), threading.Event(), t)
    assert listing(first / "results") == ["slow.json"]
    assert listing(second / ARCHIVE) == ["good.json"]
    attempts = t.by_key[(12, "slow.json")]
    assert attempts.count == 1 and "did not answer within 0.3 s" in attempts.last


def test_two_records_in_a_row_without_an_answer_are_an_outage(tmp_path, slow_master):
    """A master that answers nothing in time (hung, its database locked) stops the pass as an outage:
    the records are not tried one by one at a timeout each."""
    (run,) = runs(tmp_path, {"slow-a.json": b"{}", "slow-b.json": b"{}", "slow-c.json": b"{}"})
    sender = Sender(slow_master, "token", timeout_s=0.3)
    t = tries()
    with pytest.raises(MasterUnavailable) as raised:
        upload_run(run, 12, sender, owners(), threading.Event(), t)
    assert not isinstance(raised.value, RecordFailed)
    assert listing(run / "results") == ["slow-a.json", "slow-b.json", "slow-c.json"]
    assert list(t.by_key) == [(12, "slow-a.json")]
