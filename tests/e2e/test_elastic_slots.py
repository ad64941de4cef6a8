"""Workers are capacity, end to end with the `local` backend: a pool with no host at all, a manager with
`--slots-per-worker 2`, and workers that register their own hosts, run only on them and take them
away when they leave (docs/design.md, "Capacity that registers itself")."""

import time
from pathlib import Path

import pytest

from tests.e2e.elastic import all_ended, kill_workers, worker_pids
from tests.e2e.slurm import slurm  # noqa: F401 (the fixture)
from tests.shard.fleet import LabShard, master_hqes, new_shard, sql, submit
from tests.support import Master, stop, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres_only(reason="elastic workers share the shard's PostgreSQL database"),
]

JOBS = 8
JOB_S = 4
SLOTS = 2
IDLE_S = 4.0


def span_command(spans: Path) -> str:
    """Sleeps JOB_S seconds and writes `start end host backend_job` to a file of its own."""
    line = '"$s $(date +%s.%N) $FLEETSHARD_HOSTNAME ${FLEETSHARD_HOST_ATTR_BACKEND_JOB:--}"'
    return f's=$(date +%s.%N); sleep {JOB_S}; echo {line} > {spans}/"$FLEETSHARD_HQE_ID"'


def most_at_once(spans: Path) -> tuple[int, set[str]]:
    """The most runs that overlapped, and the hosts they ran on (with their `backend_job`)."""
    edges, hosts = [], set()
    for path in spans.iterdir():
        start, end, host, backend_job = path.read_text().split()
        edges += [(float(start), 1), (float(end), -1)]
        hosts.add(f"{host} {backend_job}")
    running = most = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        running += step
        most = max(most, running)
    return most, hosts


def shard_hosts(master: Master, shard: LabShard) -> list[tuple[str, str]]:
    return sql(
        master.role.database_url,
        "SELECT h.hostname, h.status FROM common_host h JOIN common_shard s ON s.id = h.shard_id "
        f"WHERE s.hostname = '{shard.process.hostname}' ORDER BY h.hostname",
    )


def run_pool(
    master: Master, tmp: Path, max_workers: int, backend: str = "local", env: dict[str, str] | None = None
) -> tuple[float, int, set[str], LabShard]:
    """JOBS jobs of JOB_S seconds on a pool with no host; the time from submitting to the last end."""
    shard = new_shard(master, tmp, hosts=0, FLEETSHARD_DRAIN_S="5")
    role = shard.process.role
    role.extra_env.update(env or {})
    spans = tmp / "spans"
    spans.mkdir()
    spans.chmod(0o777)  # jobs may run as another user (FLEETSHARD_JOB_USER)
    manager = role.start(
        "run_worker_manager",
        f"--backend={backend}",
        *(["--slurm-partition=debug", "--slurm-time-limit=10"] if backend == "slurm" else []),
        f"--max-workers={max_workers}",
        f"--slots-per-worker={SLOTS}",
        "--min-seconds-between-workers=0.5",
        f"--idle-seconds={IDLE_S:g}",
        "--tick-seconds=0.5",
        f"--label={shard.label}",
        log_name="manager.log",
    )
    try:
        wait_until(
            lambda: sql(
                master.role.database_url,
                f"SELECT pools FROM common_shard WHERE hostname = '{shard.process.hostname}'",
            )[0][0],
            timeout=60,
            what="the shard to announce its pool",
        )
        assert shard_hosts(master, shard) == [], "the pool starts with no host at all"
        began = time.monotonic()
        jobs = submit(
            master,
            [{"name": f"s{n}", "command": span_command(spans), "meta_hosts": [[shard.label, 1]]} for n in range(JOBS)],
        )
        wait_until(lambda: all_ended(master, shard, jobs), timeout=180, interval=0.2, what="every job")
        took = time.monotonic() - began
        assert [row[1] for row in master_hqes(master, jobs)] == ["Completed"] * JOBS
        wait_until(lambda: not worker_pids(shard.process.hostname), timeout=IDLE_S + 60, what="workers to exit")
        wait_until(lambda: shard_hosts(master, shard) == [], timeout=30, what="the workers' hosts to leave the master")
        most, hosts = most_at_once(spans)
        log = role.data_dir.joinpath("manager.log").read_text()
        assert manager.poll() is None, log
    finally:
        code = stop(manager)
        kill_workers(shard.process.hostname)
    assert code == 0
    return took, most, hosts, shard


def check_pool_scales(master: Master, tmp: Path, backend: str, env: dict[str, str] | None = None) -> None:
    one, most_one, hosts_one, shard = run_pool(master, tmp / "one", 1, backend, env)
    assert most_one <= SLOTS, f"{most_one} runs at once with one worker of {SLOTS} slots"
    assert most_one == SLOTS, "a worker of two slots ran two jobs at once"
    prefix = f"{shard.process.hostname}-"
    for host, backend_job in (h.split() for h in hosts_one):
        worker_id = host.removeprefix(prefix).rsplit("-", 1)[0]
        assert host.startswith(prefix) and host[-2:] in ("-1", "-2"), hosts_one
        assert backend_job == (worker_id if backend == "slurm" else "-"), hosts_one

    three, most_three, _, _ = run_pool(master, tmp / "three", 3, backend, env)
    assert 4 <= most_three <= 3 * SLOTS, f"{most_three} runs at once with three workers of {SLOTS} slots"
    print(
        f"{backend}: max-workers 1: {one:.1f} s, {most_one} at once; max-workers 3: {three:.1f} s, {most_three} at once"
    )
    # Speed is bench/workers.py's to measure; here only that more workers did not make the pool slower
    # (the runs at once above are the proof that they ran side by side). CI under load saw 20.3 against 39.7 s.
    assert three < one, f"three workers took {three:.1f} s, one {one:.1f} s"


def test_a_pool_with_no_hosts_runs_at_most_max_workers_times_slots_and_scales(master_server, tmp_path):
    check_pool_scales(master_server, tmp_path, "local")


@pytest.mark.xdist_group("slurm")  # one single-node Slurm per run (`make test` on PostgreSQL uses pytest-xdist)
def test_the_same_with_slurm_workers_whose_hosts_carry_their_slurm_job(master_server, tmp_path, slurm):  # noqa: F811
    check_pool_scales(master_server, tmp_path, "slurm", slurm.env)


def test_a_killed_workers_hosts_go_missing_and_its_runs_end_failed_infra(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=0, FLEETSHARD_DRAIN_S="5")
    role = shard.process.role
    manager = role.start(
        "run_worker_manager",
        "--backend=local",
        "--max-workers=1",
        f"--slots-per-worker={SLOTS}",
        "--idle-seconds=30",
        "--tick-seconds=0.5",
        f"--label={shard.label}",
        log_name="manager.log",
    )
    try:
        wait_until(
            lambda: sql(
                master_server.role.database_url,
                f"SELECT pools FROM common_shard WHERE hostname = '{shard.process.hostname}'",
            )[0][0],
            timeout=60,
            what="the shard to announce its pool",
        )
        jobs = submit(
            master_server,
            [{"name": f"k{n}", "command": "sleep 120", "meta_hosts": [[shard.label, 1]]} for n in range(SLOTS)],
        )
        wait_until(
            lambda: [r[1] for r in master_hqes(master_server, jobs)] == ["Running"] * SLOTS,
            timeout=60,
            what="both jobs to run on the worker's hosts",
        )
        (worker,) = worker_pids(shard.process.hostname)
        kill_workers(shard.process.hostname)
        wait_until(
            lambda: [(r[1], r[2]) for r in master_hqes(master_server, jobs)] == [("Failed", "infra")] * SLOTS,
            timeout=30,
            what="the killed worker's runs to end Failed/infra",
        )
        assert all("vanished from shard" in r[5] for r in master_hqes(master_server, jobs))
        missing = [h for h, status in shard_hosts(master_server, shard) if status == "Missing"]
        assert missing == [f"{shard.process.hostname}-{worker}-{k}" for k in range(1, SLOTS + 1)]
    finally:
        stop(manager)
        kill_workers(shard.process.hostname)
