"""The shard's log shipping (shard/uploads/logs.py): which runs' logs go, in which chunks, and how it
resumes. In-process tests run real jobs in a shard world and ship to the master's own store
(master.logs.store, the same database in the test settings) through a stand-in for HTTP that can
fail; the sender itself is tested against a real master process below."""

import os
import threading
import time
from pathlib import Path

import pytest

from common.constants import MAX_LOG_CHUNK_BYTES
from master.logs.models import RunLog, RunLogChunk
from master.logs.store import LogEnded, LogGap, append_log
from shard.run.workspace import RUN_LOG
from shard.sync.client import HeartbeatClient
from shard.uploads.logs import Answer, LogRefused, LogSender, LogShipper, LogsUnsupported, MasterUnavailable
from tests.shard.fleet import new_shard, submit
from tests.shard.world import ShardWorld
from tests.support import Master, free_port


class StoreMaster:
    """Answers chunks as the master's endpoint would, from its store; records them; can be made to fail."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, bytes, bool]] = []
        self.down = False
        self.refuse: set[int] = set()

    def send(self, hqe_id: int, offset: int, data: bytes, *, final: bool) -> Answer:
        if self.down:
            raise MasterUnavailable("down")
        if hqe_id in self.refuse:
            raise LogRefused("not yours")
        self.sent.append((hqe_id, offset, data, final))
        try:
            appended = append_log(hqe_id, offset, data, final=final)
        except LogGap as gap:
            return Answer(gap.expected)
        except LogEnded as ended:
            raise LogRefused(ended.message) from ended
        return Answer(appended.size, appended.truncated, appended.complete)


def stored(hqe_id: int) -> bytes:
    return b"".join(bytes(c.data) for c in RunLogChunk.objects.filter(log_id=hqe_id).order_by("start"))


def shipper_for(world: ShardWorld, master: StoreMaster) -> LogShipper:
    shipper = LogShipper(HeartbeatClient("http://127.0.0.1:9", "shard1", "token"), world.config.results_root)
    shipper.sender = master  # type: ignore[assignment]
    return shipper


def ship_until(world: ShardWorld, shipper: LogShipper, predicate, what: str) -> None:
    def step():
        shipper.find_runs()
        shipper.ship_pass(threading.Event())
        return predicate()

    world.run_until(step, what=what)


def log_file(world: ShardWorld, job: int) -> Path:
    return Path(world.results_dir(job)) / RUN_LOG


def test_a_running_jobs_log_reaches_the_master_as_it_grows_then_whole_and_complete(world):
    world.host("h1", ("lab",))
    go = world.config.results_root.parent / "go"
    job = world.job(f'echo first; while [ ! -e "{go}" ]; do sleep 0.05; done; echo second', meta_host="lab")
    master = StoreMaster()
    shipper = shipper_for(world, master)
    ship_until(world, shipper, lambda: stored(world.hqe(job).id) == b"first\n", "the first line shipped")
    hqe_id = world.hqe(job).id
    assert not RunLog.objects.get(hqe_id=hqe_id).complete
    go.touch()
    ship_until(world, shipper, lambda: hqe_id not in shipper.logs and world.finished(job), "the log shipped whole")
    assert stored(hqe_id) == log_file(world, job).read_bytes() == b"first\nsecond\n"
    assert RunLog.objects.get(hqe_id=hqe_id).complete
    # Once the master has it whole, later passes send nothing for it.
    sent = len(master.sent)
    shipper.find_runs()
    shipper.ship_pass(threading.Event())
    assert len(master.sent) == sent


def test_a_backlog_goes_in_bounded_chunks_each_log_in_turn_within_a_pass_budget(world):
    world.host("h1", ("lab",))
    world.host("h2", ("lab",))
    big = "head -c 700000 /dev/zero | tr '\\0' x"
    first, second = world.job(big, meta_host="lab"), world.job(big, meta_host="lab")
    world.run_until(lambda: world.finished(first, second), what="the jobs to end")
    a, b = world.hqe(first).id, world.hqe(second).id
    master = StoreMaster()
    shipper = shipper_for(world, master)
    shipper.pass_bytes = 3 * MAX_LOG_CHUNK_BYTES
    shipper.find_runs()
    shipper.ship_pass(threading.Event())
    assert [(hqe, len(data)) for hqe, _, data, _ in master.sent] == [
        (a, 0),
        (a, MAX_LOG_CHUNK_BYTES),
        (b, 0),
        (b, MAX_LOG_CHUNK_BYTES),
        (a, MAX_LOG_CHUNK_BYTES),
    ]
    master.sent.clear()
    shipper.ship_pass(threading.Event())
    last = 700000 - 2 * MAX_LOG_CHUNK_BYTES
    assert [(hqe, len(data), final) for hqe, _, data, final in master.sent] == [
        (a, last, True),
        (b, MAX_LOG_CHUNK_BYTES, False),
        (b, last, True),
    ]
    assert stored(a) == stored(b) == b"x" * 700000 and shipper.logs == {}


def test_a_restarted_shard_asks_where_the_master_is_and_sends_only_the_rest(world):
    world.host("h1", ("lab",))
    job = world.job("printf 'aaaa\\nbbbb\\n'", meta_host="lab")
    world.run_until(lambda: world.finished(job), what="the job to end")
    hqe_id = world.hqe(job).id
    append_log(hqe_id, 0, b"aaaa\n")
    master = StoreMaster()
    shipper_for(world, master)  # a shard process that died before sending anything
    restarted = shipper_for(world, master)
    restarted.find_runs()
    restarted.ship_pass(threading.Event())
    restarted.ship_pass(threading.Event())
    assert master.sent == [(hqe_id, 0, b"", False), (hqe_id, 5, b"bbbb\n", True)]
    assert stored(hqe_id) == b"aaaa\nbbbb\n"


def test_a_restarted_shard_leaves_a_log_the_master_has_whole_after_one_question(world):
    world.host("h1", ("lab",))
    job = world.job("echo whole", meta_host="lab")
    world.run_until(lambda: world.finished(job), what="the job to end")
    hqe_id = world.hqe(job).id
    append_log(hqe_id, 0, b"whole\n", final=True)
    master = StoreMaster()
    restarted = shipper_for(world, master)
    restarted.find_runs()
    restarted.ship_pass(threading.Event())
    assert master.sent == [(hqe_id, 0, b"", False)]
    assert restarted.logs == {} and hqe_id in restarted.done


def test_a_master_outage_only_delays_shipping(world):
    world.host("h1", ("lab",))
    job = world.job("echo one; echo two", meta_host="lab")
    world.run_until(lambda: world.finished(job), what="the job to end")
    master = StoreMaster()
    master.down = True
    shipper = shipper_for(world, master)
    shipper.find_runs()
    with pytest.raises(MasterUnavailable):
        shipper.ship_pass(threading.Event())
    master.down = False
    shipper.ship_pass(threading.Event())
    shipper.ship_pass(threading.Event())
    assert stored(world.hqe(job).id) == b"one\ntwo\n" and shipper.logs == {}


def test_past_the_masters_cap_the_shard_skips_to_the_end_and_sends_only_the_end(world, settings):
    settings.FLEETSHARD_MAX_LOG_BYTES = 1000
    world.host("h1", ("lab",))
    job = world.job("head -c 600000 /dev/zero | tr '\\0' y", meta_host="lab")
    world.run_until(lambda: world.finished(job), what="the job to end")
    master = StoreMaster()
    shipper = shipper_for(world, master)
    shipper.find_runs()
    for _ in range(4):
        shipper.ship_pass(threading.Event())
    assert [(offset, len(data), final) for _, offset, data, final in master.sent] == [
        (0, 0, False),
        (0, MAX_LOG_CHUNK_BYTES, False),
        (600000, 0, True),
    ]
    log = RunLog.objects.get(hqe_id=world.hqe(job).id)
    assert (log.kept, log.size, log.complete) == (1000, 600000, True)


def test_a_log_the_job_replaced_with_a_link_is_never_read(world, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the shard's secret\n")
    world.host("h1", ("lab",))
    job = world.job(
        f'rm "$FLEETSHARD_RESULTS_DIR/job.log"; ln -s {secret} "$FLEETSHARD_RESULTS_DIR/job.log"', meta_host="lab"
    )
    world.run_until(lambda: world.finished(job), what="the job to end")
    assert log_file(world, job).is_symlink()
    master = StoreMaster()
    shipper = shipper_for(world, master)
    shipper.find_runs()
    shipper.ship_pass(threading.Event())
    shipper.ship_pass(threading.Event())
    hqe_id = world.hqe(job).id
    assert all(data == b"" for _, _, data, _ in master.sent)
    assert RunLog.objects.get(hqe_id=hqe_id).complete and stored(hqe_id) == b""


def test_a_log_the_master_refuses_is_dropped_and_the_others_go_on(world):
    world.host("h1", ("lab",))
    world.host("h2", ("lab",))
    refused, fine = world.job("echo no", meta_host="lab"), world.job("echo yes", meta_host="lab")
    world.run_until(lambda: world.finished(refused, fine), what="the jobs to end")
    master = StoreMaster()
    master.refuse.add(world.hqe(refused).id)
    shipper = shipper_for(world, master)
    shipper.find_runs()
    shipper.ship_pass(threading.Event())
    shipper.ship_pass(threading.Event())
    assert shipper.logs == {}
    assert stored(world.hqe(fine).id) == b"yes\n" and not RunLog.objects.filter(hqe_id=world.hqe(refused).id).exists()
    shipper.find_runs()
    assert shipper.logs == {}


class SlowMaster(StoreMaster):
    def send(self, hqe_id: int, offset: int, data: bytes, *, final: bool) -> Answer:
        time.sleep(1.0)
        return super().send(hqe_id, offset, data, final=final)


def test_a_stopping_shards_flush_ends_by_its_deadline_however_many_logs_wait(world):
    for name in ("h1", "h2", "h3"):
        world.host(name, ("lab",))
    jobs = [world.job(f"echo {n}", meta_host="lab") for n in range(3)]
    world.run_until(lambda: world.finished(*jobs), what="the jobs to end")
    shipper = shipper_for(world, SlowMaster())
    started = time.monotonic()
    shipper.flush(0.2)
    # At most the chunk in flight at the deadline (1 s); shipping all three would take 6 s. Room for a
    # loaded machine: what was shipped is pinned by the logs left below, not by the clock.
    assert time.monotonic() - started < 5.0
    assert len(shipper.logs) >= 2


def test_a_run_outside_the_results_root_is_not_shipped(world):
    world.host("h1", ("lab",))
    job = world.job("echo hi", meta_host="lab")
    world.run_until(lambda: world.finished(job), what="the job to end")
    from shard.models import Run

    Run.objects.filter(hqe_id=world.hqe(job).id).update(results_dir="/etc")
    shipper = shipper_for(world, StoreMaster())
    shipper.find_runs()
    assert shipper.logs == {}


# The sender against a real master process (master/api/logs.py over HTTP).


@pytest.fixture
def lab(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1)
    (job,) = submit(master_server, [{"name": "logged", "command": "true", "meta_hosts": [[shard.label, 1]]}])
    hqe = master_server.shell(
        f"from common.models import HostQueueEntry\nresult = HostQueueEntry.objects.get(job_id={job}).id"
    )
    return shard, hqe


def sender_of(master: Master, shard) -> LogSender:
    return LogSender(master.url, shard.process.role.extra_env["FLEETSHARD_SHARD_TOKEN"], timeout_s=30)


@pytest.mark.e2e
def test_the_sender_speaks_the_masters_endpoint(master_server, tmp_path, lab):
    shard, hqe = lab
    sender = sender_of(master_server, shard)
    assert sender.send(hqe, 0, b"", final=False) == Answer(0)
    assert sender.send(hqe, 0, b"hello\n", final=False) == Answer(6)
    assert sender.send(hqe, 0, b"hello\n", final=False) == Answer(6)
    assert sender.send(hqe, 50, b"gap", final=False) == Answer(6)
    assert sender.send(hqe, 6, b"\x00\xff bye\n", final=True) == Answer(13, complete=True)
    other = new_shard(master_server, tmp_path / "other", hosts=1)
    with pytest.raises(LogRefused, match="403"):
        sender_of(master_server, other).send(hqe, 13, b"x", final=False)
    with pytest.raises(LogRefused, match="404"):
        sender.send(2**40, 0, b"x", final=False)
    with pytest.raises(LogRefused, match="413"):
        sender.send(hqe, 13, b"x" * (MAX_LOG_CHUNK_BYTES + 1), final=False)
    with pytest.raises(MasterUnavailable, match="401"):
        LogSender(master_server.url, "revoked", 30).send(hqe, 0, b"", final=False)
    with pytest.raises(MasterUnavailable, match="cannot reach"):
        LogSender(f"http://127.0.0.1:{free_port()}", "t", 30).send(hqe, 0, b"", final=False)
    older = LogSender(master_server.url, "t", 30)
    older.url = master_server.url + "/api/v1/logs/nowhere"
    with pytest.raises(LogsUnsupported):
        older.send(hqe, 0, b"", final=False)


def test_the_shipper_never_opens_another_users_file(world, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the planted file belongs to another user")
    world.host("h1", ("lab",))
    job = world.job("true", meta_host="lab")
    world.run_until(lambda: world.finished(job), what="the job to end")
    path = log_file(world, job)
    path.unlink()
    path.write_text("planted\n")
    os.chown(path, 65534, 65534)
    master = StoreMaster()
    shipper = shipper_for(world, master)
    shipper.find_runs()
    shipper.ship_pass(threading.Event())
    shipper.ship_pass(threading.Event())
    assert stored(world.hqe(job).id) == b"" and shipper.logs == {}
