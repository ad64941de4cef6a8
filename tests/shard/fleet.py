"""Helpers for tests that run a real master and real `run_shard` processes: set-up through the master's
services, quick reads of either database with plain SQL, and per-host overlap checks."""

import json
import sqlite3
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2

from tests.support import Master, ShardProcess, drop_database, make_shard_process

# Fast settings for shards under test: a "minute" is one second.
FAST_SHARD_ENV = {
    "FLEETSHARD_SCHEDULER_TICK_S": "0.1",
    "FLEETSHARD_MINUTE_S": "1",
    "FLEETSHARD_ABORT_GRACE_S": "2",
    "FLEETSHARD_DRAIN_S": "10",
    "FLEETSHARD_LOG_LEVEL": "INFO",
}

ACTIVE = ("Queued", "Starting", "Running")

_created_databases: list[str] = []


def drop_created_databases() -> None:
    """Drops the PostgreSQL databases of the shards made since the last call (SQLite files go with tmp)."""
    while _created_databases:
        drop_database(_created_databases.pop())


# A job that records when it started and ended, in its results directory, for the overlap checks.
TIMED = (
    'echo "$FLEETSHARD_HOSTNAME $(date +%s%N)" > "$FLEETSHARD_RESULTS_DIR/start"; {body}; '
    'rc=$?; date +%s%N > "$FLEETSHARD_RESULTS_DIR/end"; exit $rc'
)


def writable_by_jobs(tmp: Path) -> Path:
    """A directory jobs may write markers into: run as root, the shard runs them as `nobody`."""
    shared = tmp / "shared"
    shared.mkdir(exist_ok=True)
    shared.chmod(0o1777)
    for parent in shared.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    return shared


def sql(url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Reads a role's database directly: much quicker than a `manage.py shell` per poll."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
        try:
            return conn.execute(query.replace("%s", "?"), params).fetchall()
        finally:
            conn.close()
    pg = psycopg2.connect(url)
    try:
        with pg.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall()
    finally:
        pg.close()


def in_list(ids: list[int]) -> str:
    return "(" + ",".join(str(int(i)) for i in ids) + ")"


@dataclass
class LabShard:
    process: ShardProcess
    label: str
    hosts: dict[str, int]

    @property
    def url(self) -> str:
        return self.process.role.database_url


def new_shard(
    master: Master,
    tmp: Path,
    hosts: int | dict[str, dict[str, str]] = 3,
    extra_labels: dict[str, list[str]] | None = None,
    **env: str,
) -> LabShard:
    """A shard on the master with its own board label and hosts, and a migrated database (not started)."""
    tag = uuid.uuid4().hex[:8]
    name = f"lab-{tag}"
    label = f"board:{tag}"
    if isinstance(hosts, int):
        hosts = {f"dut{n}-{tag}": {} for n in range(1, hosts + 1)}
    else:
        hosts = {f"{h}-{tag}": attrs for h, attrs in hosts.items()}
    spec = {"name": name, "label": label, "hosts": hosts}
    code = f"""
import json
from master import services
spec = json.loads({json.dumps(json.dumps(spec))})
services.create_labels([spec["label"]], acting_user=None)
shard, token = services.create_shard(spec["name"], [spec["label"]], acting_user=None)
for hostname, attrs in spec["hosts"].items():
    services.create_hosts([hostname], acting_user=None, labels=[spec["label"]], attributes=attrs)
result = {{"token": token, "hosts": {{h.hostname: h.id for h in services.get_hosts(list(spec["hosts"]))}}}}
"""
    made = master.shell(code)
    process = make_shard_process(tmp, master, name, made["token"], **(FAST_SHARD_ENV | env))
    _created_databases.append(process.role.database_url)
    return LabShard(process, label, made["hosts"])


def submit(master: Master, jobs: list[dict[str, Any]]) -> list[int]:
    """Creates jobs through master.services.create_job; each dict holds JobRequest fields."""
    code = f"""
import json
from master import services
specs = json.loads({json.dumps(json.dumps(jobs))})
result = []
for spec in specs:
    spec.setdefault("owner", "tester")
    spec["meta_hosts"] = [tuple(m) for m in spec.get("meta_hosts", [])]
    result.append(services.create_job(services.JobRequest(**spec), acting_user=None).id)
"""
    return master.shell(code)


def master_hqes(master: Master, job_ids: list[int]) -> list[tuple[Any, ...]]:
    """(job_id, status, failure, exit_code, host_id, log_tail) of each HQE of the jobs, on the master."""
    return sql(
        master.role.database_url,
        "SELECT job_id, status, failure, exit_code, host_id, log_tail FROM common_hostqueueentry "
        f"WHERE job_id IN {in_list(job_ids)} ORDER BY id",
    )


def overlaps(results_roots: list[Path]) -> tuple[int, list[str]]:
    """Reads the start/end files the TIMED jobs wrote; returns (runs seen, problems per host).

    A problem is two runs of one host that overlap, a run with a log but no start file (its shell could
    not fork `date`, say), or a run that started but left no end: such a
    run is named with its directory and its log (which says why: killed, `date` failed...), since
    its end is unknown and could hide an overlap.
    """
    runs: dict[str, list[tuple[int, int]]] = {}
    bad = []
    for root in results_roots:
        for log in sorted(root.glob("*/*/job.log")):
            if not log.with_name("start").exists():
                bad.append(f"{log.parent}: ran, wrote no start file; {_log_of(log.parent)}")
        for start_file in sorted(root.glob("*/*/start")):
            end_file = start_file.with_name("end")
            hostname, start = start_file.read_text().split()
            if end_file.exists():
                end = int(end_file.read_text())
            else:
                end = 2**63
                bad.append(f"{start_file.parent}: started at {start}, no end file; {_log_of(start_file.parent)}")
            runs.setdefault(hostname, []).append((int(start), end))
    for hostname, spans in runs.items():
        spans.sort()
        for (s1, e1), (s2, e2) in zip(spans, spans[1:], strict=False):
            if s2 < e1:
                bad.append(f"{hostname}: [{s1}, {e1}] and [{s2}, {e2}]")
    return sum(len(s) for s in runs.values()), bad


def _log_of(run_dir: Path) -> str:
    try:
        return f"job.log: {(run_dir / 'job.log').read_text(errors='replace')[-2000:]!r}"
    except OSError as exc:
        return f"job.log unreadable: {exc}"
