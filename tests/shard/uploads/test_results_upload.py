"""The shard's upload of ended runs' result files: which files go, where each ends, and what a job
cannot make the shard do. The file handling runs on real files against a recording stand-in for the
master's answers; the uploads themselves against a real master (the `master_server` tests below)."""

import json
import os
import pwd
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from common.constants import MAX_RESULT_FILE_BYTES, MAX_RESULT_FILES_PER_RUN
from common.models import HostQueueEntry
from shard.config import SchedulerConfig
from shard.run.isolation import JobUser
from shard.run.workspace import ARCHIVE, QUARANTINE, TRACE
from shard.sync.client import HeartbeatClient
from shard.uploads.results import (
    ARCHIVED,
    MasterUnavailable,
    ResultsUploader,
    Sender,
    Verdict,
    job_owners,
    upload_run,
)
from tests.shard.fleet import ACTIVE, new_shard, sql, submit, writable_by_jobs
from tests.shard.world import ShardWorld, make_world
from tests.support import Master, free_port, serve, stop, wait_until

NOBODY = pwd.getpwnam("nobody")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the job's files belong to another user")


class Answers:
    """Stands in for the master's answers to uploads and reports: records what was sent, answers per name."""

    def __init__(self, **by_name: Verdict | Exception) -> None:
        self.by_name = by_name
        self.sent: list[tuple[int, str, bytes]] = []
        self.reported: list[tuple[int, str, str]] = []
        self.report_answers: dict[str, Verdict | Exception] = {}

    def send(self, hqe_id: int, name: str, data: bytes) -> Verdict:
        answer = self.by_name.get(name, ARCHIVED)
        if isinstance(answer, Exception):
            raise answer
        self.sent.append((hqe_id, name, data))
        return answer

    def send_trace(self, hqe_id: int, data: bytes) -> Verdict:
        return self.send(hqe_id, TRACE, data)

    def report(self, hqe_id: int, name: str, reason: str) -> Verdict | None:
        answer = self.report_answers.get(name)
        if isinstance(answer, Exception):
            raise answer
        self.reported.append((hqe_id, name, reason))
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


def test_the_jobs_trace_json_beside_results_goes_first_and_is_archived_or_quarantined_as_answered(tmp_path):
    run = make_run(tmp_path, {"a.json": b"{}"})
    (run / TRACE).write_bytes(b'[{"ph": "X", "ts": 0, "dur": 1}]')
    answers = Answers()
    assert upload(run, answers)
    assert [name for _, name, _ in answers.sent] == [TRACE, "a.json"]
    assert listing(run / ARCHIVE) == ["a.json", TRACE] and not (run / TRACE).exists()
    (run / TRACE).write_bytes(b"[]")
    old_master = Verdict(quarantine=True, reason="the master takes no job traces (404)")
    assert upload(run, Answers(**{TRACE: old_master}))
    assert listing(run / QUARANTINE) == [TRACE, TRACE + ".error"]
    (run / TRACE).write_bytes(b"[]")
    with pytest.raises(MasterUnavailable):
        upload(run, Answers(**{TRACE: MasterUnavailable("down")}))
    assert (run / TRACE).exists(), "kept while the master cannot take it"


def test_a_trace_json_planted_as_a_link_is_never_opened_but_quarantined(tmp_path):
    run = make_run(tmp_path, {})
    (run / TRACE).symlink_to("/etc/passwd")
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == [] and listing(run / QUARANTINE) == [TRACE, TRACE + ".error"]
    assert (run / QUARANTINE / (TRACE + ".error")).read_text() == "not sent: a symbolic link\n"


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
    names = {f"r{i:05d}.json": b"{}" for i in range(MAX_RESULT_FILES_PER_RUN + 2)}
    run = make_run(tmp_path, names)
    answers = Answers()
    assert upload(run, answers)
    assert len(answers.sent) == MAX_RESULT_FILES_PER_RUN
    assert len(listing(run / ARCHIVE)) == MAX_RESULT_FILES_PER_RUN
    last = sorted(names)[-1]
    over_cap = f"not sent: more than {MAX_RESULT_FILES_PER_RUN} result files in one run"
    assert (run / QUARANTINE / f"{last}.error").read_text() == over_cap + "\n"
    # One report for all of them, named after the first: a job may write any number of files.
    first = sorted(names)[MAX_RESULT_FILES_PER_RUN]
    assert answers.reported == [(12, first, f"{over_cap}: this one and 1 more quarantined unsent")]


def test_the_cap_counts_the_files_sent_before_a_restart(tmp_path):
    run = make_run(tmp_path, {f"r{i:05d}.json": b"{}" for i in range(MAX_RESULT_FILES_PER_RUN + 1)})
    answers = Answers(**{"r00010.json": MasterUnavailable("down")})
    with pytest.raises(MasterUnavailable):
        upload(run, answers)
    answers.by_name.clear()
    assert upload(run, answers)
    assert len(answers.sent) == MAX_RESULT_FILES_PER_RUN
    assert listing(run / QUARANTINE) == [
        f"r{MAX_RESULT_FILES_PER_RUN:05d}.json",
        f"r{MAX_RESULT_FILES_PER_RUN:05d}.json.error",
    ]


def test_a_file_larger_than_the_masters_limit_is_quarantined_unsent(tmp_path):
    run = make_run(tmp_path, {"huge.json": b" " * (MAX_RESULT_FILE_BYTES + 1)})
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == []
    reason = f"not sent: larger than {MAX_RESULT_FILE_BYTES} bytes"
    assert (run / QUARANTINE / "huge.json.error").read_text() == reason + "\n"
    assert answers.reported == [(12, "huge.json", reason)]


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
    assert answers.reported == [
        (12, "dir.json", "not sent: not a regular file"),
        (12, "hard.json", "not sent: a hard link (2 names)"),
        (12, "link.json", "not sent: a symbolic link"),
        (12, "pipe.json", "not sent: not a regular file"),
    ]


def test_a_file_refused_unsent_stays_until_the_master_has_heard_why(tmp_path):
    run = make_run(tmp_path, {"a.json": b"{}", "z.json": b"{}"})
    (run / "results" / "link.json").symlink_to(tmp_path)
    answers = Answers()
    answers.report_answers["link.json"] = MasterUnavailable("down")
    with pytest.raises(MasterUnavailable):
        upload(run, answers)
    assert listing(run / "results") == ["link.json", "z.json"]
    assert not (run / QUARANTINE).exists()
    answers.report_answers.clear()
    assert upload(run, answers)
    assert answers.reported == [(12, "link.json", "not sent: a symbolic link")]
    assert listing(run / QUARANTINE) == ["link.json", "link.json.error"]
    assert listing(run / ARCHIVE) == ["a.json", "z.json"]


def test_a_report_the_master_refuses_for_the_run_quarantines_the_rest_unsent(tmp_path):
    run = make_run(tmp_path, {"z.json": b"{}"})
    (run / "results" / "link.json").symlink_to(tmp_path)
    refused = Verdict(True, "the master refused HQE 12 (403): not this shard's", whole_run=True)
    answers = Answers()
    answers.report_answers["link.json"] = refused
    assert upload(run, answers)
    assert answers.sent == []
    assert (run / QUARANTINE / "link.json.error").read_text() == "not sent: a symbolic link\n"
    assert (run / QUARANTINE / "z.json.error").read_text() == refused.reason + "\n"


@as_root
def test_another_users_file_is_not_sent(tmp_path):
    run = make_run(tmp_path, {"theirs.json": b"{}"})
    os.chown(run / "results" / "theirs.json", 4242, 4242)
    answers = Answers()
    assert upload(run, answers)
    assert answers.sent == []
    assert (run / QUARANTINE / "theirs.json.error").read_text() == "not sent: owned by uid 4242\n"
    assert answers.reported == [(12, "theirs.json", "not sent: owned by uid 4242")]


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


WRITES_RESULTS = 'echo {} > "$FLEETSHARD_RESULTS_DIR/results/r.json"'  # results/ is made for the job


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
    run = Path(world.results_dir(ended))
    assert listing(run / ARCHIVE) == ["r.json"]
    # A later look skips runs it has seen; the second job's run is taken once it ends.
    world.abort(running)
    world.run_until(lambda: world.finished(running), what="the second job to end")
    restarted.find_ended()
    assert list(restarted.pending) == [world.hqe(running).id]


def test_retention_keeps_a_run_until_its_files_are_uploaded_and_a_restart_still_finds_it(tmp_path, db, request):
    world = make_world(tmp_path, request, retention_days=1, upload_grace_days=2, retention_every_s=0)
    world.host("h1", ("lab",))
    ended = world.job(WRITES_RESULTS, meta_host="lab")
    world.run_until(lambda: world.finished(ended), what="the job to end")
    hqe = world.hqe(ended)
    run = Path(world.results_dir(ended))
    # The master was out of reach for two days: the run is past the retention, its file still unsent.
    HostQueueEntry.objects.filter(id=hqe.id).update(finished_on=timezone.now() - timedelta(days=2))
    age(run, 2)
    world.scheduler.tick()
    assert listing(run / "results") == ["r.json"]
    # A shard started now looks as far back as retention keeps runs waiting, and sends the file.
    uploader = uploader_for(world, Answers())
    uploader.find_ended()
    assert list(uploader.pending) == [hqe.id]
    uploader.upload_pending(threading.Event())
    assert listing(run / ARCHIVE) == ["r.json"]
    age(run, 2)
    world.scheduler.tick()
    assert not run.exists()


def age(run: Path, days: float) -> None:
    """Dates the run's directory and log `days` back, as retention sees them."""
    then = time.time() - days * 86400
    for path in (run / "job.log", run):
        os.utime(path, (then, then))


# Against a real master (the results endpoint of master/api/results.py) and real shard processes.


def tf_file(test: str, start: int, wall_s: float = 0.5) -> bytes:
    """A TensorFlow TestResults file of one entry."""
    entry = {"name": "BM_Step", "iters": "10", "wallTime": wall_s, "cpuTime": wall_s}
    return json.dumps({"name": test, "startTime": str(start), "entries": {"entry": [entry]}}).encode()


def master_rows(master: Master, query: str) -> list[tuple]:
    return sql(master.role.database_url, query)


def stored_runs(master: Master, test: str) -> list[tuple]:
    """(job_id, hqe_id, host_id, shard_id) of each stored run of `test`."""
    return master_rows(
        master, f"SELECT job_id, hqe_id, host_id, shard_id FROM master_testrun WHERE test = '{test}' ORDER BY id"
    )


def hqe_of(master: Master, job_id: int) -> int:
    ((hqe_id,),) = master_rows(master, f"SELECT id FROM common_hostqueueentry WHERE job_id = {int(job_id)}")
    return hqe_id


@pytest.fixture
def lab(master_server, tmp_path):
    """A shard on the master with one queued job, and the shard's token: the job's HQE is this shard's."""
    shard = new_shard(master_server, tmp_path, hosts=1)
    (job,) = submit(master_server, [{"name": "measured", "command": "true", "meta_hosts": [[shard.label, 1]]}])
    hqe_id = hqe_of(master_server, job)
    # As the heartbeat that started it would have: the master knows which host ran it.
    (host_id,) = shard.hosts.values()
    master_server.shell(
        "from common.models import HostQueueEntry\n"
        f"result = HostQueueEntry.objects.filter(id={hqe_id}).update(host_id={host_id})"
    )
    return shard, hqe_id


def sender_of(master: Master, shard) -> Sender:
    return Sender(master.url, shard.process.role.extra_env["FLEETSHARD_SHARD_TOKEN"], timeout_s=30)


@pytest.mark.e2e
def test_the_master_stores_a_file_once_and_a_malformed_one_is_quarantined_with_its_reason(master_server, tmp_path, lab):
    shard, hqe_id = lab
    test = f"upload-{uuid.uuid4().hex[:8]}"
    run = make_run(tmp_path, {"good.json": tf_file(test, 1_700_000_000), "bad.json": b'{"name": 3}'})
    sender = sender_of(master_server, shard)
    assert upload_run(run, hqe_id, sender, owners(), threading.Event())
    assert listing(run / ARCHIVE) == ["good.json"]
    assert listing(run / QUARANTINE) == ["bad.json", "bad.json.error"]
    reason = (run / QUARANTINE / "bad.json.error").read_text()
    assert reason.startswith("the master refused it (400): bad.json") and reason.endswith("\n")
    ((job_id, stored_hqe, _, shard_id),) = stored_runs(master_server, test)
    assert stored_hqe == hqe_id and shard_id is not None
    # A crash between the upload and the move leaves the file in results/: sent again, stored once.
    (run / ARCHIVE / "good.json").rename(run / "results" / "good.json")
    assert upload_run(run, hqe_id, sender, owners(), threading.Event())
    assert listing(run / ARCHIVE) == ["good.json"]
    assert len(stored_runs(master_server, test)) == 1


@pytest.mark.e2e
def test_the_master_stores_a_jobs_trace_once_and_refuses_a_broken_one(master_server, tmp_path, lab):
    shard, hqe_id = lab
    run = make_run(tmp_path, {})
    sender = sender_of(master_server, shard)
    (run / TRACE).write_bytes(b"{")
    assert upload_run(run, hqe_id, sender, owners(), threading.Event())
    assert listing(run / QUARANTINE) == [TRACE, TRACE + ".error"]
    assert (run / QUARANTINE / (TRACE + ".error")).read_text().startswith("the master refused it (400): trace.json")
    (run / TRACE).write_bytes(json.dumps({"traceEvents": [{"name": "step", "ph": "X", "ts": 5, "dur": 3}]}).encode())
    assert upload_run(run, hqe_id, sender, owners(), threading.Event())
    assert listing(run / ARCHIVE) == [TRACE]
    stored = master_rows(master_server, f"SELECT events FROM master_runtrace WHERE hqe_id = {hqe_id}")
    assert [json.loads(e) if isinstance(e, str) else e for (e,) in stored] == [[["step", "", 0, 3]]]
    (run / ARCHIVE / TRACE).rename(run / TRACE)
    assert upload_run(run, hqe_id, sender, owners(), threading.Event())
    assert listing(run / ARCHIVE) == [TRACE], "sent again after a crash before the move: stored once"
    assert len(master_rows(master_server, f"SELECT hqe_id FROM master_runtrace WHERE hqe_id = {hqe_id}")) == 1


@pytest.mark.e2e
def test_an_unknown_hqe_or_another_shards_quarantines_the_whole_run(master_server, tmp_path, lab):
    shard, hqe_id = lab
    other = new_shard(master_server, tmp_path / "other", hosts=1)
    test = f"upload-{uuid.uuid4().hex[:8]}"
    files = {"a.json": tf_file(test, 1_700_000_001), "b.json": tf_file(test, 1_700_000_002)}
    theirs = make_run(tmp_path / "theirs", files)
    assert upload_run(theirs, hqe_id, sender_of(master_server, other), owners(), threading.Event())
    assert listing(theirs / QUARANTINE) == ["a.json", "a.json.error", "b.json", "b.json.error"]
    assert (theirs / QUARANTINE / "b.json.error").read_text().startswith(f"the master refused HQE {hqe_id} (403): ")
    unknown = make_run(tmp_path / "unknown", files)
    assert upload_run(unknown, 2**40, sender_of(master_server, shard), owners(), threading.Event())
    assert (unknown / QUARANTINE / "a.json.error").read_text().startswith(f"the master refused HQE {2**40} (404): ")
    assert stored_runs(master_server, test) == []


@pytest.mark.e2e
def test_files_refused_unsent_are_reported_to_the_master_once(master_server, tmp_path, lab):
    shard, hqe_id = lab
    run = make_run(tmp_path, {})
    (run / "results" / "link.json").symlink_to(tmp_path)
    os.mkfifo(run / "results" / "pipe.json")
    sender = sender_of(master_server, shard)
    assert upload_run(run, hqe_id, sender, owners(), threading.Event())
    query = f"SELECT name, digest, reason FROM master_rejectedresult WHERE hqe_id = {hqe_id} ORDER BY name"
    expected = [("link.json", "", "not sent: a symbolic link"), ("pipe.json", "", "not sent: not a regular file")]
    assert master_rows(master_server, query) == expected
    # A crash between the report and the move: reported again, recorded once.
    (run / QUARANTINE / "link.json").rename(run / "results" / "link.json")
    assert upload_run(run, hqe_id, sender, owners(), threading.Event())
    assert master_rows(master_server, query) == expected
    # A master without the endpoint (a 404 naming no field): the file is set aside all the same.
    (run / "results" / "old.json").symlink_to(tmp_path)
    sender.report_url = f"{master_server.url}/api/v1/results/nowhere"
    assert upload_run(run, hqe_id, sender, owners(), threading.Event())
    assert listing(run / "results") == []
    assert master_rows(master_server, query) == expected


@pytest.mark.e2e
def test_a_refused_token_or_an_absent_master_keeps_the_files(master_server, tmp_path, lab):
    _, hqe_id = lab
    run = make_run(tmp_path, {"a.json": tf_file("kept", 1_700_000_003)})
    for sender in (Sender(master_server.url, "revoked-token"), Sender(f"http://127.0.0.1:{free_port()}", "t")):
        with pytest.raises(MasterUnavailable):
            upload_run(run, hqe_id, sender, owners(), threading.Event())
        assert listing(run / "results") == ["a.json"]
        assert listing(run) == ["results"]


def copying_job(tmp_path: Path, files: dict[str, bytes], *, wait_for: str = "") -> str:
    """A job command that writes `files` into its results/ (as the job user), after `wait_for` exists."""
    shared = writable_by_jobs(tmp_path)
    source = shared / uuid.uuid4().hex[:8]
    source.mkdir()
    for name, data in files.items():
        (source / name).write_bytes(data)
        (source / name).chmod(0o644)
    source.chmod(0o755)
    wait = f'while [ ! -e "{wait_for}" ]; do sleep 0.1; done; ' if wait_for else ""
    return f'{wait}cp {source}/*.json "$FLEETSHARD_RESULTS_DIR/results/"'


def shard_run_dir(shard, job_id: int) -> Path | None:
    rows = sql(
        shard.url,
        "SELECT r.results_dir, q.status FROM common_hostqueueentry q "
        f"LEFT JOIN shard_run r ON r.hqe_id = q.id WHERE q.job_id = {int(job_id)}",
    )
    return Path(rows[0][0]) if rows and rows[0][0] and rows[0][1] not in ACTIVE else None


@pytest.mark.e2e
def test_results_made_while_the_master_is_down_reach_it_once_it_is_back(own_master, tmp_path, started):
    shard = new_shard(own_master, tmp_path, hosts=1)
    test = f"outage-{uuid.uuid4().hex[:8]}"
    go = writable_by_jobs(tmp_path) / "go"
    command = copying_job(tmp_path, {"r.json": tf_file(test, 1_700_000_100)}, wait_for=str(go))
    (job,) = submit(own_master, [{"name": "measured", "command": command, "meta_hosts": [[shard.label, 1]]}])
    proc = shard.process.role.start("run_shard", log_name="run.log")
    log = shard.process.role.data_dir / "run.log"
    started.append((proc, log))
    running = f"SELECT status FROM common_hostqueueentry WHERE job_id = {job}"
    wait_until(lambda: sql(own_master.role.database_url, running) == [("Running",)], timeout=60, what="Running")
    stop(own_master.proc)
    go.touch()
    run = wait_until(lambda: shard_run_dir(shard, job), timeout=60, what="the run to end on the shard")
    wait_until(lambda: "results upload paused" in log.read_text(), timeout=60, what="an upload to fail")
    assert listing(run / "results") == ["r.json"]
    assert not (run / ARCHIVE).exists()
    own_master.proc = serve(own_master.role, int(own_master.url.rsplit(":", 1)[1]))
    wait_until(lambda: listing(run / ARCHIVE) == ["r.json"], timeout=120, what="the file archived")
    assert listing(run / "results") == []
    ((job_id, hqe_id, host_id, _),) = stored_runs(own_master, test)
    assert (job_id, host_id) == (job, next(iter(shard.hosts.values())))
    assert hqe_id == hqe_of(own_master, job)
    wait_until(lambda: sql(own_master.role.database_url, running) == [("Completed",)], timeout=60, what="Completed")
    # A restarted shard looks at every ended run again: nothing left to send, nothing sent twice.
    assert stop(proc) == 0
    (run / ARCHIVE / "r.json").rename(run / "results" / "r.json")
    again = shard.process.role.start("run_shard", log_name="run2.log")
    started.append((again, shard.process.role.data_dir / "run2.log"))
    wait_until(lambda: listing(run / ARCHIVE) == ["r.json"], timeout=120, what="the file archived again")
    assert len(stored_runs(own_master, test)) == 1
