"""Elastic workers' scale-up latency: from a job's creation to its worker's start, for each backend.

Run: `.venv/bin/python bench/workers.py [--rounds N] [--backend local|slurm ...]` as root on a machine
with PostgreSQL (DATABASE_URL, default the local server) and, for `slurm`, Debian's Slurm packages
(.ci/run installs them; a single-node Slurm is started on loopback for the run). A real master and a
shard with the worker manager (2 s tick, max 3 workers) run as processes; each round starts from
zero workers, creates one job and times, from the job's `created_on`: the manager's start of a worker
(its log), and the job's start on a host (the HQE's `started_on`). Prints p50/p95 of both.
"""

import argparse
import re
import statistics
import sys
import tempfile
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.support import setup_django  # noqa: E402

TICK_S = 2.0
STARTED = re.compile(r"^(\S+ \S+) INFO shard.worker_manager: started \w+ worker")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def log_time(stamp: str) -> float:
    from datetime import UTC

    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()


def run_backend(backend: str, rounds: int, master, tmp: Path, slurm_env: dict[str, str]) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    from tests.e2e.elastic import WORKER_ENV, worker_pids
    from tests.shard.fleet import new_shard, sql, submit
    from tests.support import stop, wait_until

    shard = new_shard(master, tmp, hosts=3, **WORKER_ENV)
    role = shard.process.role
    role.extra_env.update(slurm_env)
    args = [
        "run_worker_manager",
        f"--backend={backend}",
        "--min-workers=0",
        "--max-workers=3",
        "--min-seconds-between-workers=0",
        "--idle-seconds=1",
        f"--tick-seconds={TICK_S:g}",
        f"--label={shard.label}",
    ]
    manager = role.start(*args, log_name="manager.log")
    log_path = role.data_dir / "manager.log"
    to_worker, to_job = [], []
    try:
        for n in range(rounds):
            wait_until(lambda: not worker_pids(shard.process.hostname), timeout=60, what="no worker left")
            seen = len(_starts(log_path))
            (job,) = submit(master, [{"name": f"r{n}", "command": "true", "meta_hosts": [[shard.label, 1]]}])
            status = f"SELECT status FROM common_hostqueueentry WHERE job_id = {job}"
            wait_until(
                lambda q=status: sql(master.role.database_url, q)[0][0] == "Completed",
                timeout=120,
                what="the job to complete",
            )
            ((created, started),) = sql(
                master.role.database_url,
                "SELECT j.created_on, q.started_on FROM common_job j JOIN common_hostqueueentry q ON q.job_id = j.id "
                f"WHERE j.id = {job}",
            )
            worker_at = _starts(log_path)[seen]
            to_worker.append(worker_at - created.timestamp())
            to_job.append(started.timestamp() - created.timestamp())
            print(
                f"  {backend} round {n + 1}: worker {to_worker[-1]:.2f} s, job running {to_job[-1]:.2f} s", flush=True
            )
    finally:
        stop(manager)
    return to_worker, to_job


def _starts(log_path: Path) -> list[float]:
    return [log_time(m[1]) for line in log_path.read_text().splitlines() if (m := STARTED.match(line))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--backend", action="append", choices=["local", "slurm"])
    options = parser.parse_args()
    setup_django("master", postgres=True, prefix="fleetshard-bench-workers-")
    from tests.e2e.slurm import running_slurm, unavailable
    from tests.support import Master, Role, drop_database, free_port, fresh_database_url, stop, wait_until

    tmp = Path(tempfile.mkdtemp(prefix="fleetshard-bench-workers-"))
    url = fresh_database_url(tmp, "master")
    role = Role("master", url, tmp)
    role.manage("migrate", "--noinput")
    port = free_port()
    proc = role.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "2", log_name="master.log")
    master = Master(role, f"http://127.0.0.1:{port}", proc)
    import requests

    def up() -> bool:
        try:
            return requests.get(master.url + "/admin/login/", timeout=2).ok
        except requests.RequestException:
            return False

    wait_until(up, timeout=60, what="the master")
    results = {}
    try:
        for backend in options.backend or ["local", "slurm"]:
            with ExitStack() as stack:
                env: dict[str, str] = {}
                if backend == "slurm":
                    why = unavailable()
                    if why:
                        print(f"slurm: skipped ({why})")
                        continue
                    env = stack.enter_context(running_slurm()).env
                results[backend] = run_backend(backend, options.rounds, master, tmp / backend, env)
    finally:
        stop(proc)
        drop_database(url)
        from tests.shard.fleet import drop_created_databases

        drop_created_databases()
    print(f"\nscale-up latency from a job's creation ({options.rounds} rounds from zero workers, {TICK_S:g} s tick)")
    print(f"{'backend':8} {'worker start p50':>17} {'p95':>7} {'job running p50':>16} {'p95':>7}")
    for backend, (to_worker, to_job) in results.items():
        print(
            f"{backend:8} {statistics.median(to_worker):16.2f}s {percentile(to_worker, 0.95):6.2f}s "
            f"{statistics.median(to_job):15.2f}s {percentile(to_job, 0.95):6.2f}s"
        )


if __name__ == "__main__":
    main()
