"""The worker manager's tick with the database: which queued HQEs a pool counts, its metrics, its log
of why it started nothing (once per change), and the command's refusals."""

import logging
import re
import socket
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from shard.elastic.manager import WorkerManager, pool_key, queued_for
from shard.elastic.policy import Limits, Skip
from tests.shard.elastic.memory import Clock, MemoryBackend


def test_a_pool_counts_the_queued_hqes_whose_labels_include_all_of_its_own(world):
    pinned = world.host("pinned", ("pool:x", "gpu"))
    world.host("other", ("pool:y",))
    world.job("true", meta_host="pool:x", deps=("gpu",))
    world.job("true", meta_host="pool:x", count=1)
    world.job("true", meta_host="pool:y", deps=("gpu",))
    world.job("true", host=pinned)
    world.job("true", meta_host="pool:x", deps=("gpu",), aborted=True)
    assert queued_for([]).count() == 4
    assert queued_for(["pool:x"]).count() == 3
    assert queued_for(["pool:x", "gpu"]).count() == 2
    assert queued_for(["gpu", "pool:x", "gpu"]).count() == 2
    assert queued_for(["nowhere"]).count() == 0


def test_pool_names_depend_on_the_shard_and_the_set_of_labels():
    assert pool_key("lab1", ["b", "a"]) == pool_key("lab1", ["a", "b", "a"])
    assert pool_key("lab1", ["a"]) != pool_key("lab2", ["a"]) != pool_key("lab1", ["b"])
    # A Slurm job name and a directory name: nothing of a hostile hostname gets through.
    assert re.fullmatch(r"fleetshard-[A-Za-z0-9._-]+", pool_key("../x y;$(rm)\n", ["a"]))
    assert "/" not in pool_key("a/b", [])


@pytest.mark.django_db
def test_every_tick_without_a_start_is_counted_by_reason_and_logged_once_per_change(caplog):
    clock = Clock()
    backend = MemoryBackend(clock)
    manager = WorkerManager(backend, Limits(0, 1, 10.0), "pool-metrics", lambda: backend.queued, clock=clock)
    skipped = manager.metrics.skipped
    caplog.set_level(logging.INFO, logger="shard.worker_manager")
    backend.queued = 2
    assert manager.tick().start
    for _ in range(3):
        assert manager.tick().skip == Skip.MAX_WORKERS
    backend.workers.clear()
    assert manager.tick().skip == Skip.RATE_LIMIT
    clock.now += timedelta(seconds=10)
    assert manager.tick().start
    assert skipped.labels("max-workers")._value.get() == 3
    assert skipped.labels("rate-limit")._value.get() == 1
    assert skipped.labels("pending-covers-queue")._value.get() == 0
    assert manager.metrics.workers.labels("pending")._value.get() == 0
    said = [r.getMessage() for r in caplog.records if "not starting" in r.getMessage()]
    assert [s.split("(")[1].split(")")[0] for s in said] == ["max-workers", "rate-limit"]


@pytest.mark.django_db
def test_a_restarted_manager_keeps_the_interval_since_the_last_start():
    clock = Clock()
    backend = MemoryBackend(clock)
    backend.queued = 5

    def manager() -> WorkerManager:
        return WorkerManager(backend, Limits(0, 5, 30.0), "pool-restart", lambda: backend.queued, clock=clock)

    assert manager().tick().start
    clock.now += timedelta(seconds=29)
    assert manager().tick().skip == Skip.RATE_LIMIT
    clock.now += timedelta(seconds=1)
    assert manager().tick().start


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--backend=kubernetes", "--max-workers=2"], "the kubernetes backend is not built yet"),
        (["--backend=nomad", "--max-workers=2"], "--backend must be one of local, slurm, kubernetes"),
        (["--backend=local", "--max-workers=1", "--min-workers=2"], "need 0 <= --min-workers <= --max-workers"),
        (["--backend=local", "--max-workers=1", "--idle-seconds=0"], "--idle-seconds must be"),
        (["--backend=local", "--max-workers=1", "--tick-seconds=0"], "--tick-seconds must be"),
        (["--backend=local", "--max-workers=1", "--label="], "each --label must be"),
        (["--backend=local", "--max-workers=1", *[f"--label=l{n}" for n in range(21)]], "20 at most"),
        (["--backend=slurm", "--max-workers=1", "--slurm-sbatch-option=--job-name=x"], "sets -J, --job-name"),
        (["--backend=slurm", "--max-workers=1", "--slurm-sbatch-option=-J"], "finds its workers by their job name"),
        (["--backend=slurm", "--max-workers=1", "--slurm-sbatch-option=--job=x"], "sets -J, --job-name"),
        (["--backend=slurm", "--max-workers=1", "--slurm-sbatch-option=--arr=1-9"], "sets -J, --job-name"),
        (["--backend=slurm", "--max-workers=1", "--slurm-sbatch-option=-a1-9"], "sets -J, --job-name"),
        (["--backend=local", "--max-workers=1", "--label=a\x00b"], "each --label must be"),
        (["--backend=local", "--max-workers=1", "--label=a\nb"], "each --label must be"),
        (["--backend=local", "--max-workers=-1"], "need 0 <= --min-workers <= --max-workers"),
    ],
)
def test_run_worker_manager_refuses_bad_options_with_what_is_wrong(settings, args, error):
    settings.ROLE = "shard"
    with pytest.raises(CommandError, match=error):
        call_command("run_worker_manager", *args)


@pytest.mark.django_db
def test_work_left_by_a_dead_worker_starts_a_worker_to_close_it_though_nothing_is_queued(world):
    from common.constants import HostStatus
    from common.models import Host
    from shard.models import HostState
    from shard.run.recovery import current_runner_id

    clock = Clock()
    backend = MemoryBackend(clock)
    host = world.host("left", ("pool:x",))
    Host.objects.filter(id=host).update(status=HostStatus.RUNNING)
    # A worker that was running a job here, then SIGKILLed: only another worker's recovery closes its run.
    HostState.objects.filter(host_id=host).update(runner=f"{socket.gethostname()}:999999999:0")
    manager = WorkerManager(backend, Limits(0, 3, 0.0), "pool-abandoned", lambda: 0, clock=clock)
    assert manager.tick().start
    assert manager.tick().stop == (), "the pending worker stays until it has recovered the work"
    assert len(backend.workers) == 1
    backend.workers.clear()
    HostState.objects.filter(host_id=host).update(runner=current_runner_id())
    assert not manager.tick().start, "a live worker's host is no one's to recover"
