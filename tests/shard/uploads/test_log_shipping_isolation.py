"""Issue 23 for logs: a chunk the master fails on delays only its own log (given up after a bounded
number of tries), and output written to a `job.log` the job renamed is still shipped, since the
shard reads through the descriptor it opened itself (shard/run/open_logs.py)."""

import threading

from master.logs.models import RunLog
from shard.sync.client import RecordFailed
from shard.uploads.logs import Answer
from tests.shard.uploads.test_log_shipping import StoreMaster, log_file, ship_until, shipper_for, stored
from tests.shard.world import ShardWorld


class FailingFor(StoreMaster):
    """The master's store, answering a 500 for the chunks of some HQEs."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[int] = set()

    def send(self, hqe_id: int, offset: int, data: bytes, *, final: bool) -> Answer:
        if hqe_id in self.failing:
            raise RecordFailed("the master answered 500: Internal Server Error")
        return super().send(hqe_id, offset, data, final=final)


def test_output_written_to_a_renamed_job_log_is_still_shipped(world: ShardWorld):
    world.host("h1", ("lab",))
    go = world.config.results_root.parent / "go"
    command = (
        f'echo before; while [ ! -e "{go}" ]; do sleep 0.05; done; '
        'mv "$FLEETSHARD_RESULTS_DIR/job.log" "$FLEETSHARD_RESULTS_DIR/moved.log"; echo after'
    )
    job = world.job(command, meta_host="lab")
    master = StoreMaster()
    shipper = shipper_for(world, master)
    ship_until(world, shipper, lambda: stored(world.hqe(job).id) == b"before\n", "the first line shipped")
    go.touch()
    hqe_id = world.hqe(job).id
    ship_until(world, shipper, lambda: hqe_id not in shipper.logs and world.finished(job), "the log shipped whole")
    assert not log_file(world, job).exists()
    assert stored(hqe_id) == b"before\nafter\n"
    assert RunLog.objects.get(hqe_id=hqe_id).complete


def test_a_log_the_master_fails_on_delays_only_itself_and_is_given_up_after_its_tries(world: ShardWorld, settings):
    world.host("h1", ("lab",))
    world.host("h2", ("lab",))
    poisoned, fine = world.job("echo bad", meta_host="lab"), world.job("echo good", meta_host="lab")
    world.run_until(lambda: world.finished(poisoned, fine), what="the jobs to end")
    master = FailingFor()
    master.failing.add(world.hqe(poisoned).id)
    shipper = shipper_for(world, master)
    shipper.tries.max_tries = 2
    shipper.client.last_ok = float("inf")  # heartbeats go through: the master works
    shipper.find_runs()
    shipper.ship_pass(threading.Event())
    assert stored(world.hqe(fine).id) == b"good\n" and world.hqe(poisoned).id in shipper.logs
    assert not shipper.tries.due(world.hqe(poisoned).id), "it waits its own backoff"
    for attempts in shipper.tries.by_key.values():
        attempts.next_at = 0.0
    shipper.ship_pass(threading.Event())
    assert shipper.logs == {} and world.hqe(poisoned).id in shipper.done
    assert not RunLog.objects.filter(hqe_id=world.hqe(poisoned).id).exists()
