"""The shard's upload of ended runs' result files: which files go, where each ends, and what a job
cannot make the shard do. The file handling runs on real files against a recording stand-in for the
master's answers; the uploads themselves against a real master (the `master_server` tests below)."""

import os
import pwd
import threading
from pathlib import Path

import pytest

from master.results.formats.records import MAX_FILE_BYTES
from shard.client import HeartbeatClient
from shard.config import SchedulerConfig
from shard.isolation import JobUser
from shard.results_upload import (
    ARCHIVED,
    MAX_FILES_PER_RUN,
    MasterUnavailable,
    ResultsUploader,
    Verdict,
    job_owners,
    upload_run,
)
from shard.workspace import ARCHIVE, QUARANTINE
from tests.shard.world import ShardWorld

NOBODY = pwd.getpwnam("nobody")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the job's files belong to another user")


class Answers:
    """Stands in for the master's answers to uploads: records what was sent, answers per name."""

    def __init__(self, **by_name: Verdict | Exception) -> None:
        self.by_name = by_name
        self.sent: list[tuple[int, str, bytes]] = []

    def send(self, hqe_id: int, name: str, data: bytes) -> Verdict:
        answer = self.by_name.get(name, ARCHIVED)
        if isinstance(answer, Exception):
            raise answer
        self.sent.append((hqe_id, name, data))
        return answer


def owners() -> tuple[int, ...]:
    user = JobUser("nobody", NOBODY.pw_uid, NOBODY.pw_gid) if os.geteuid() == 0 else None
    return job_owners(SchedulerConfig(results_root=Path("/nonexistent"), job_user=user))


def make_run(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A run directory as an ended job leaves it: `results/` and its files are the job user's."""
    run = tmp_path / "7" / "12-host1"
    results = run / "results"
    results.mkdir(parents=True)
    for name, data in files.items():
        (results / name).write_bytes(data)
    if os.geteuid() == 0:
        for path in (results, *results.iterdir()):
            os.lchown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return run


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def upload(run: Path, answers: Answers, stop: threading.Event | None = None) -> bool:
    return upload_run(run, 12, answers, owners(), stop or threading.Event())  # type: ignore[arg-type]


def test_result_files_go_to_the_master_then_to_archive_and_other_files_stay(tmp_path):
    run = make_run(tmp_path, {"b.json": b'{"b": 1}', "a.json": b'{"a": 1}', "notes.txt": b"x"})
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == [(12, "a.json", b'{"a": 1}'), (12, "b.json", b'{"b": 1}')]
    assert listing(run / ARCHIVE) == ["a.json", "b.json"]
    assert listing(run / "results") == ["notes.txt"]
    assert not (run / QUARANTINE).exists()
    assert (run / ARCHIVE).stat().st_uid == os.geteuid()
    assert (run / ARCHIVE / "a.json").read_bytes() == b'{"a": 1}'


def test_a_malformed_file_goes_to_quarantine_with_the_masters_reason_and_the_rest_is_archived(tmp_path):
    run = make_run(tmp_path, {"bad.json": b"{", "good.json": b"{}"})
    reason = "the master refused it (400): bad.json: not JSON"
    assert upload(run, Answers(**{"bad.json": Verdict(True, reason)}))
    assert listing(run / QUARANTINE) == ["bad.json", "bad.json.error"]
    assert (run / QUARANTINE / "bad.json.error").read_text() == reason + "\n"
    assert listing(run / ARCHIVE) == ["good.json"]
    assert listing(run / "results") == []


def test_an_unavailable_master_keeps_the_file_and_those_after_it(tmp_path):
    run = make_run(tmp_path, {"a.json": b"{}", "b.json": b"{}", "c.json": b"{}"})
    answers = Answers(**{"b.json": MasterUnavailable("down")})
    with pytest.raises(MasterUnavailable):
        upload(run, answers)
    assert listing(run / ARCHIVE) == ["a.json"]
    assert listing(run / "results") == ["b.json", "c.json"]
    # The master is back: the same call (a later pass, or a restarted shard) sends what is left.
    answers.by_name.clear()
    assert upload(run, answers)
    assert [name for _, name, _ in answers.sent] == ["a.json", "b.json", "c.json"]
    assert listing(run / ARCHIVE) == ["a.json", "b.json", "c.json"]


def test_a_refused_run_sends_no_more_files_and_quarantines_them_all_with_the_reason(tmp_path):
    run = make_run(tmp_path, {"a.json": b"{}", "b.json": b"{}"})
    refused = Verdict(True, "the master refused HQE 12 (404): no HQE 12", whole_run=True)
    answers = Answers(**{"a.json": refused})
    assert upload(run, answers)
    assert answers.sent == [(12, "a.json", b"{}")]
    assert listing(run / QUARANTINE) == ["a.json", "a.json.error", "b.json", "b.json.error"]
    assert (run / QUARANTINE / "b.json.error").read_text() == refused.reason + "\n"


def test_a_stop_leaves_the_rest_for_later(tmp_path):
    run = make_run(tmp_path, {"a.json": b"{}"})
    stop = threading.Event()
    stop.set()
    assert not upload(run, Answers(), stop)
    assert listing(run / "results") == ["a.json"]


def test_a_run_without_results_has_nothing_to_do(tmp_path):
    run = tmp_path / "7" / "12-host1"
    run.mkdir(parents=True)
    assert upload(run, Answers())
    assert listing(run) == []


def test_more_files_than_the_cap_are_quarantined_unsent(tmp_path):
    names = {f"r{i:05d}.json": b"{}" for i in range(MAX_FILES_PER_RUN + 2)}
    run = make_run(tmp_path, names)
    answers = Answers()
    assert upload(run, answers)
    assert len(answers.sent) == MAX_FILES_PER_RUN
    assert len(listing(run / ARCHIVE)) == MAX_FILES_PER_RUN
    last = sorted(names)[-1]
    assert (run / QUARANTINE / f"{last}.error").read_text() == (
        f"not sent: more than {MAX_FILES_PER_RUN} result files in one run\n"
    )


def test_a_file_larger_than_the_masters_limit_is_quarantined_unsent(tmp_path):
    run = make_run(tmp_path, {"huge.json": b" " * (MAX_FILE_BYTES + 1)})
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == []
    assert (run / QUARANTINE / "huge.json.error").read_text() == f"not sent: larger than {MAX_FILE_BYTES} bytes\n"


def test_a_name_with_odd_characters_is_sent_and_moved_as_it_is(tmp_path):
    odd = "a b&hqe=1?x=%2F\nñ.json"
    run = make_run(tmp_path, {odd: b"{}"})
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == [(12, odd, b"{}")]
    assert listing(run / ARCHIVE) == [odd]


def test_links_pipes_and_directories_are_never_opened_but_quarantined(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the shard's token")
    run = make_run(tmp_path, {})
    results = run / "results"
    (results / "link.json").symlink_to(secret)
    os.link(secret, results / "hard.json")
    os.mkfifo(results / "pipe.json")
    (results / "dir.json").mkdir()
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == []
    quarantine = run / QUARANTINE
    assert (quarantine / "link.json.error").read_text() == "not sent: a symbolic link\n"
    assert (quarantine / "link.json").is_symlink()
    assert (quarantine / "hard.json.error").read_text() == "not sent: a hard link (2 names)\n"
    assert (quarantine / "pipe.json.error").read_text() == "not sent: not a regular file\n"
    assert (quarantine / "dir.json.error").read_text() == "not sent: not a regular file\n"
    assert secret.read_text() == "the shard's token"


@as_root
def test_another_users_file_is_not_sent(tmp_path):
    run = make_run(tmp_path, {"theirs.json": b"{}"})
    os.chown(run / "results" / "theirs.json", 4242, 4242)
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == []
    assert (run / QUARANTINE / "theirs.json.error").read_text() == "not sent: owned by uid 4242\n"


@as_root
def test_archive_and_quarantine_the_job_made_itself_are_renamed_aside_never_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = make_run(tmp_path, {"a.json": b"{}", "bad.json": b"{"})
    (run / ARCHIVE).symlink_to(elsewhere)
    (run / QUARANTINE).mkdir()
    os.chown(run / QUARANTINE, NOBODY.pw_uid, NOBODY.pw_gid)
    assert upload(run, Answers(**{"bad.json": Verdict(True, "malformed")}))
    assert listing(elsewhere) == []
    assert (run / "archive.job").is_symlink()
    assert listing(run / ARCHIVE) == ["a.json"]
    assert listing(run / QUARANTINE) == ["bad.json", "bad.json.error"]
    assert (run / QUARANTINE).stat().st_uid == 0
    assert (run / "quarantine.job").stat().st_uid == NOBODY.pw_uid


def test_results_as_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.json").write_text("{}")
    run = tmp_path / "7" / "12-host1"
    run.mkdir(parents=True)
    (run / "results").symlink_to(elsewhere)
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == []
    assert listing(elsewhere) == ["x.json"]


def uploader_for(world: ShardWorld, answers: Answers) -> ResultsUploader:
    client = HeartbeatClient("http://127.0.0.1:9", "shard1", "token")
    uploader = ResultsUploader(client, world.config)
    uploader.sender = answers  # type: ignore[assignment]
    return uploader


WRITES_RESULTS = 'mkdir "$FLEETSHARD_RESULTS_DIR/results" && echo {} > "$FLEETSHARD_RESULTS_DIR/results/r.json"'


def test_only_ended_runs_are_taken_and_a_restart_finds_what_is_left(world):
    world.host("h1", ("lab",))
    world.host("h2", ("lab",))
    ended = world.job(WRITES_RESULTS, meta_host="lab")
    running = world.job(WRITES_RESULTS + "; sleep 60", meta_host="lab")
    world.run_until(lambda: world.finished(ended), what="the first job to end")
    world.run_until(lambda: world.hqe(running).status == "Running", what="the second job to run")
    answers = Answers(**{"r.json": MasterUnavailable("down")})
    uploader = uploader_for(world, answers)
    uploader.find_ended()
    assert list(uploader.pending) == [world.hqe(ended).id]
    with pytest.raises(MasterUnavailable):
        uploader.upload_pending(threading.Event())
    # A restarted shard looks at every ended run again: the file still in results/ is its queue.
    answers.by_name.clear()
    restarted = uploader_for(world, answers)
    restarted.find_ended()
    assert list(restarted.pending) == [world.hqe(ended).id]
    restarted.upload_pending(threading.Event())
    assert restarted.pending == {}
    run = Path(world.hqe(ended).results_dir)
    assert listing(run / ARCHIVE) == ["r.json"]
    # A later look skips runs it has seen; the second job's run is taken once it ends.
    world.abort(running)
    world.run_until(lambda: world.finished(running), what="the second job to end")
    restarted.find_ended()
    assert list(restarted.pending) == [world.hqe(running).id]
