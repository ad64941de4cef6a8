"""Workers are capacity (shard/run/workers.py): a worker's registration, the set the heartbeat holder sends,
the scheduler's restriction to a worker's own hosts, and the manager's count of free slots."""

import logging
import socket
import uuid

import pytest
from django.core.management import CommandError, call_command

from common.constants import PROTOCOL_VERSION
from common.models import Host
from common.wire import MAX_POOL_LABELS, MAX_POOLS, DiscoveredAck, HeartbeatRequest
from shard.elastic.manager import WorkerManager
from shard.elastic.policy import Limits, Skip, Worker, WorkerState, decide
from shard.models import DiscoveryState, WorkerRegistration
from shard.run import scheduler as scheduler_module
from shard.run.recovery import current_runner_id
from shard.run.workers import (
    PoolError,
    RegistrationError,
    WorkerIdentity,
    announce_pool,
    delete_work_dirs,
    free_slots,
    own_hosts,
    parse_size,
    register,
    release,
    sync_worker_hosts,
    work_dir_size,
    work_dirs,
)
from shard.sync.discovery import discovery_request, note_ack
from tests.shard.elastic.memory import Clock, MemoryBackend
from tests.support import assert_waits_for

DEAD = f"{socket.gethostname()}:999999999:1"


@pytest.fixture
def shard_name(settings):
    settings.FLEETSHARD_SHARD_HOSTNAME = "lab1"
    return "lab1"


def identity(worker_id="7", slots=2, backend_job=""):
    return WorkerIdentity(worker_id, slots, ("board:a",), backend_job)


def test_a_worker_registers_its_slots_as_hosts_with_the_pools_labels_and_its_attributes(db, shard_name):
    register(identity(backend_job="4242"), current_runner_id())
    (row,) = WorkerRegistration.objects.all()
    node = socket.gethostname()
    assert row.hosts == [
        {
            "hostname": f"lab1-7-{k}",
            "labels": ["board:a"],
            "attributes": {"node": node, "worker_id": "7", "backend_job": "4242"},
        }
        for k in (1, 2)
    ]


@pytest.mark.parametrize(
    ("worker_id", "slots", "labels", "error"),
    [
        ("../x", 1, ("a",), "--worker-id must be"),
        ("7", 0, ("a",), "--slots must be between 1 and 64"),
        ("7", 65, ("a",), "--slots must be between 1 and 64"),
        ("7", 1, (), "need the pool's labels"),
    ],
)
def test_a_bad_identity_is_refused_saying_what_is_wrong(worker_id, slots, labels, error):
    with pytest.raises(RegistrationError, match=error):
        WorkerIdentity(worker_id, slots, labels)


def test_a_live_workers_id_is_refused_a_dead_ones_is_taken_over(db, shard_name):
    register(identity(), DEAD)
    register(identity(slots=1), current_runner_id())
    assert [len(r.hosts) for r in WorkerRegistration.objects.all()] == [1]
    with pytest.raises(RegistrationError, match="already registered by live process"):
        register(identity(), DEAD)
    assert WorkerRegistration.objects.get().runner == current_runner_id()


def test_a_shard_that_never_had_a_worker_pays_one_query(db, django_assert_num_queries):
    with django_assert_num_queries(2):
        assert sync_worker_hosts() is False


def test_live_workers_hosts_join_the_set_released_ones_are_sent_until_acked_dead_ones_just_leave(db, shard_name):
    DiscoveryState.objects.create(id=1, hosts=[{"hostname": "adb-x", "labels": ["board:a"], "attributes": {}}])
    register(identity("1", 1), current_runner_id())
    register(identity("2", 1), current_runner_id())  # released below
    register(identity("3", 1), DEAD)
    WorkerRegistration.objects.filter(worker_id="3").update(runner=DEAD)
    assert sync_worker_hosts() is True
    sent = discovery_request()
    assert [h["hostname"] for h in sent["discovered"]["hosts"]] == ["adb-x", "lab1-1-1", "lab1-2-1"]
    assert "released" not in sent["discovered"]
    assert not WorkerRegistration.objects.filter(worker_id="3").exists(), "a dead worker's row goes"
    assert sync_worker_hosts() is False, "nothing changed: no new generation"

    release("2", current_runner_id())
    assert sync_worker_hosts() is True
    sent = discovery_request()
    assert [h["hostname"] for h in sent["discovered"]["hosts"]] == ["adb-x", "lab1-1-1"]
    assert sent["discovered"]["released"] == ["lab1-2-1"]
    note_ack(sent, None)  # a lost answer: the release goes again
    assert discovery_request()["discovered"]["released"] == ["lab1-2-1"]
    note_ack(sent, DiscoveredAck(sent["discovered"]["generation"]))
    assert discovery_request() == {}
    assert DiscoveryState.objects.get().released == []


def test_pools_are_sent_until_the_master_takes_them_and_again_when_they_change(db):
    announce_pool(["board:a"], 6)
    sent = discovery_request()
    assert sent == {"pools": [{"labels": ["board:a"], "max_hosts": 6}]}
    note_ack(sent, None)
    assert discovery_request() == {}
    announce_pool(["board:a"], 4)
    assert discovery_request() == {"pools": [{"labels": ["board:a"], "max_hosts": 4}]}


def test_a_worker_runs_only_on_its_own_hosts_and_an_ordinary_shard_never_on_a_workers(world, shard_name):
    world.host("dut1", ("board:a",))
    world.host("lab1-7-1", ("board:a",), attributes={"worker_id": "7"})
    world.host("lab1-8-1", ("board:a",), attributes={"worker_id": "8"})
    names = lambda q: sorted(Host.objects.filter(q).values_list("hostname", flat=True))  # noqa: E731
    assert names(own_hosts(None)) == ["dut1"]
    assert names(own_hosts(identity("7", 1))) == ["lab1-7-1"]
    world.scheduler.own_hosts = own_hosts(identity("7", 1))
    world.job("sleep 5", meta_host="board:a", count=2)
    world.scheduler._schedule()
    started = sorted(Host.objects.get(id=r.host_id).hostname for r in world.scheduler.runs.values())
    assert started == ["lab1-7-1"], "one slot: one run, on the worker's own host"


def test_free_slots_count_idle_worker_hosts_unseen_ones_and_workers_not_yet_registered(world, shard_name):
    register(identity("7", 2), current_runner_id())
    # Neither host back from the master yet; backend worker 9 runs but has not registered.
    assert free_slots(2, {"7", "9"}) == 2 + 2
    world.host("lab1-7-1", ("board:a",), attributes={"worker_id": "7"})
    world.host("lab1-7-2", ("board:a",), attributes={"worker_id": "7"}, locked=True)
    assert free_slots(2, {"7"}) == 1, "one idle Ready host; the locked one takes nothing"


def test_the_manager_counts_only_what_no_worker_host_can_take_and_pending_workers_by_their_slots(db):
    clock = Clock()
    backend = MemoryBackend(clock)
    free = {"n": 0}
    manager = WorkerManager(
        backend, Limits(0, 3, 0.0), "pool-slots", lambda: backend.queued, clock=clock, slots=2, free=lambda _: free["n"]
    )
    backend.queued = 2
    free["n"] = 2
    assert manager.tick().start is False, "two free slots take the two queued HQEs"
    free["n"] = 0
    assert manager.tick().start is True
    assert manager.tick().skip == Skip.PENDING_COVERS_QUEUE, "a pending worker of two slots covers two HQEs"
    backend.queued = 3
    assert manager.tick().start is True
    # Pending workers beyond the queue are stopped by their slots: 1 HQE needs one worker of two.
    pending = [Worker("a", WorkerState.PENDING, 1), Worker("b", WorkerState.PENDING, 2)]
    assert decide(Limits(0, 3, 0.0), 1, pending, None, slots=2).stop == ("b",)


WORKER = ("--exit-when-idle=5", "--worker-id=7", "--label=board:a")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--slots=2",), "--slots and --label are a worker's: pass --worker-id and --exit-when-idle too"),
        (("--worker-id=7",), "--worker-id needs --exit-when-idle: a worker leaves once idle"),
        (("--exit-after-num-runs=3",), "--exit-after-num-runs is an elastic worker's: pass --worker-id"),
        (("--max-work-dir-size=10g",), "--max-work-dir-size is an elastic worker's: pass --worker-id"),
        (("--delete-work-dir-on-exit",), "--delete-work-dir-on-exit is an elastic worker's: pass --worker-id"),
        (
            (*WORKER, "--exit-after-num-runs=0"),
            "--exit-after-num-runs must be a number of runs from 1 to 1000000000, not 0",
        ),
        (
            (*WORKER, "--exit-after-num-runs=-3"),
            "--exit-after-num-runs must be a number of runs from 1 to 1000000000, not -3",
        ),
        ((*WORKER, "--exit-after-num-runs=many"), "argument --exit-after-num-runs: invalid int value: 'many'"),
        ((*WORKER, "--max-work-dir-size=0"), "argument --max-work-dir-size: expected a size above 0 in bytes"),
        ((*WORKER, "--max-work-dir-size=-1g"), "argument --max-work-dir-size: expected a size above 0 in bytes"),
        ((*WORKER, "--max-work-dir-size=10x"), "with k, m, g or t (10g), not '10x'"),
        ((*WORKER, "--slots=0"), "--slots must be between 1 and 64, not 0"),
        ((*WORKER, "--slots=two"), "argument --slots: invalid int value: 'two'"),
        (("--exit-when-idle=0", "--worker-id=7"), "--exit-when-idle must be a number of seconds above 0, not 0"),
        (("--exit-when-idle=nan", "--worker-id=7"), "--exit-when-idle must be a number of seconds above 0, not nan"),
        (("--exit-when-idle=5", "--worker-id=Pixel 7", "--label=a"), "--worker-id must be 1 to 64 lower-case"),
        (("--exit-when-idle=5", "--worker-id=7", "--label="), "--label must name 1 to 20 labels of 1 to 255 printable"),
        (("--exit-when-idle=5", "--worker-id=7", "--label=a\x1b[2J"), "printable characters, not 'a\\x1b[2J'"),
        (
            ("--exit-when-idle=5", "--worker-id=7", *(f"--label=l{n}" for n in range(21))),
            "--label must name 1 to 20 labels of 1 to 255 printable characters, not 21",
        ),
    ],
)
def test_run_shard_names_the_worker_option_that_is_wrong(db, settings, args, error):
    """Each bad value is named, before anything is touched (on SQLite too, which refuses workers)."""
    settings.ROLE = "shard"
    with pytest.raises(CommandError) as caught:
        call_command("run_shard", *args)
    assert error in str(caught.value)
    assert not WorkerRegistration.objects.exists()


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1", 1),
        ("4096", 4096),
        ("500k", 500 * 1024),
        ("10g", 10 * 1024**3),
        (" 2 T ", 2 * 1024**4),
        ("3MB", 3 * 1024**2),
    ],
)
def test_work_dir_sizes_are_read_as_codalab_writes_them(text, size):
    assert parse_size(text) == size


def test_a_worker_with_exit_after_num_runs_starts_no_more(world, shard_name):
    world.host("lab1-7-1", ("board:a",), attributes={"worker_id": "7"})
    world.host("lab1-7-2", ("board:a",), attributes={"worker_id": "7"})
    world.scheduler.own_hosts = own_hosts(identity("7", 2))
    world.scheduler.max_starts = 1
    world.job("sleep 5", meta_host="board:a", count=2)
    world.scheduler._schedule()
    world.scheduler._schedule()
    assert len(world.scheduler.runs) == 1 and world.scheduler.starts_used_up


def test_a_full_work_dir_starts_no_run_and_is_deleted_on_exit_keeping_unsent_results(world, shard_name):
    world.host("lab1-7-1", ("board:a",), attributes={"worker_id": "7"})
    world.scheduler.own_hosts = own_hosts(identity("7", 1))
    world.scheduler.max_work_dir_bytes = 4000
    first = world.job('head -c 5000 /dev/zero > "$FLEETSHARD_RESULTS_DIR/blob"', meta_host="board:a")
    world.run_until(lambda: world.finished(first), what="the first job")
    runner = world.scheduler.runner_id
    assert work_dir_size(runner) >= 5000
    second = world.job("true", meta_host="board:a")
    for _ in range(5):
        world.scheduler.tick()
    assert world.hqe(second).status == "Queued", "no new run while the work directory is over its size"
    unsent = world.job('mkdir -p "$FLEETSHARD_RESULTS_DIR/results"', meta_host="board:a")
    world.scheduler.max_work_dir_bytes = None
    world.run_until(lambda: world.finished(second, unsent), what="the other jobs")
    dirs = work_dirs(runner)
    (dirs[-1] / "results").mkdir(exist_ok=True)
    (dirs[-1] / "results" / "r.json").write_text("{}")
    assert delete_work_dirs(runner) == (len(dirs) - 1, 1)
    assert [d.exists() for d in dirs] == [False] * (len(dirs) - 1) + [True]


def test_pools_are_bounded_to_what_the_master_takes_dropping_the_one_announced_longest_ago(db, caplog):
    for n in range(MAX_POOLS):
        announce_pool([f"pool:{n}"], 2)
    announce_pool(["pool:0"], 4)  # announced again (its manager restarted): now the newest
    with caplog.at_level(logging.WARNING, logger="shard.run.workers"):
        announce_pool(["pool:new"], 2)
    pools = discovery_request()["pools"]
    assert len(pools) == MAX_POOLS and pools[-2:] == [
        {"labels": ["pool:0"], "max_hosts": 4},
        {"labels": ["pool:new"], "max_hosts": 2},
    ]
    assert {"labels": ["pool:1"], "max_hosts": 2} not in pools
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("pool pool:1 dropped from the pools this shard announces")
    # Before, a 101st pool made the master refuse every heartbeat of the shard with a 400.
    assert HeartbeatRequest.parse(
        {"shard": "lab1", "protocol": PROTOCOL_VERSION, "instance": str(uuid.uuid4()), "pools": pools}
    ).pools


@pytest.mark.parametrize("labels", [[], [f"l{n}" for n in range(MAX_POOL_LABELS + 1)]], ids=["none", "too-many"])
def test_a_pool_the_master_would_refuse_is_refused_here_changing_nothing(db, labels):
    with pytest.raises(PoolError, match=f"a pool needs 1 to {MAX_POOL_LABELS} labels, not {len(labels)}"):
        announce_pool(labels, 2)
    assert discovery_request() == {}


@pytest.mark.postgres_only
def test_two_workers_registering_one_id_at_once_are_one_after_the_other_the_second_refused(
    transactional_db, shard_name
):
    """Both saw no row of the id: the second's insert failed on the unique id with an IntegrityError
    (a traceback, not the reason). Registrations now take the discovery row's lock first."""
    refused: list[str] = []

    def second() -> None:
        with pytest.raises(RegistrationError) as caught:
            register(identity("7", 1), "elsewhere:1:1")
        refused.append(str(caught.value))

    DiscoveryState.objects.create(id=1)
    assert_waits_for(lambda: register(identity("7", 2), current_runner_id()), second, "the second registration")
    assert refused == [f"worker 7 is already registered by live process {current_runner_id()}"]
    (row,) = WorkerRegistration.objects.all()
    assert (row.runner, len(row.hosts)) == (current_runner_id(), 2)


def test_the_work_directory_is_measured_again_only_when_a_run_starts_or_ends_or_after_a_while(
    world, shard_name, monkeypatch
):
    measured: list[str] = []
    monkeypatch.setattr(scheduler_module, "work_dir_size", lambda runner: measured.append(runner) or 0)
    world.scheduler.max_work_dir_bytes = 1000
    for _ in range(5):
        assert world.scheduler.work_dir_full() is False
    assert len(measured) == 1, "a tick does not walk every run directory again"
    world.scheduler.started += 1  # a run started
    world.scheduler.work_dir_full()
    monkeypatch.setattr(scheduler_module, "WORK_DIR_CHECK_S", 0.0)
    world.scheduler.work_dir_full()
    assert len(measured) == 3


def test_a_worker_whose_hosts_the_master_would_refuse_is_refused_at_registration(db, settings):
    """Refused by the master, its hosts would never come back: the worker would idle out, and its
    manager start another, for ever. Too long a hostname, a '..' in it, or a set over the limit."""
    settings.FLEETSHARD_SHARD_HOSTNAME = "lab-" + "x" * 245
    with pytest.raises(RegistrationError, match="would be longer than 255 characters, which the master refuses"):
        register(identity("12345", 10), current_runner_id())
    with pytest.raises(RegistrationError, match=r"no '\.\.'"):
        identity("a..b")
    settings.FLEETSHARD_SHARD_HOSTNAME = "lab1"
    settings.FLEETSHARD_MAX_DISCOVERED_HOSTS = 5
    DiscoveryState.objects.create(id=1, hosts=[{"hostname": "adb-x", "labels": ["board:a"], "attributes": {}}])
    register(identity("1", 2), current_runner_id())
    with pytest.raises(
        RegistrationError,
        match=r"would hold 6 hosts \(1 found by its sources, 2 of other workers, 3 of this one\), "
        "more than FLEETSHARD_MAX_DISCOVERED_HOSTS=5",
    ):
        register(identity("2", 3), current_runner_id())
    assert list(WorkerRegistration.objects.values_list("worker_id", flat=True)) == ["1"]
    register(identity("1", 4), current_runner_id())  # the same worker again: its own old hosts do not count
