"""What the benches share: Django set up for one role, the PostgreSQL server's maintenance connection and
throwaway databases, and the long-running processes (master, shards) a bench starts and stops.

A bench imports this after putting the checkout on its path (`sys.path.insert(0, ROOT)`), as it does for
tests.support, whose Role, free_port and wait_until it uses beside these.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/postgres"


def setup_django(role: str, *, postgres: bool = False, prefix: str = "fleetshard-bench-") -> None:
    """Django's settings for this process as `role` (the process's own data directory, a temporary one unless
    FLEETSHARD_DATA_DIR is set). `postgres`: DATABASE_URL must name a PostgreSQL server (DEFAULT_PG unless
    it does); otherwise the role's default database, or DATABASE_URL if set."""
    if postgres and not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        os.environ["DATABASE_URL"] = DEFAULT_PG
    os.environ["FLEETSHARD_ROLE"] = role
    os.environ.setdefault("FLEETSHARD_DATA_DIR", tempfile.mkdtemp(prefix=prefix))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "server.settings")
    import django

    django.setup()


def say(text: str) -> None:
    print(text, flush=True)


# PostgreSQL.


def admin_connection() -> Any:
    """A connection to the server's maintenance database, for CREATE/DROP DATABASE and pg_terminate_backend."""
    parts = urlsplit(os.environ["DATABASE_URL"])
    conn = psycopg2.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password or None,
        dbname="postgres",
    )
    conn.autocommit = True
    return conn


def database_url(name: str) -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return parts._replace(path="/" + name).geturl()


def create_database(name: str, template: str | None = None) -> str:
    conn = admin_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    finally:
        conn.close()
    return database_url(name)


def insert_select(cur: Any, model: Any, exprs: dict[str, str], source: str) -> None:
    """INSERT ... SELECT of `model`'s rows: `exprs` gives some columns as SQL, every other column its
    field's default (as a new row through the ORM would have it)."""
    columns, values, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(field.column)
        if field.column in exprs:
            values.append(exprs[field.column])
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection=cur.db))
    table = model._meta.db_table
    cur.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)} {source}", params)


def fill_fleet_rows(
    n_hosts: int,
    n_jobs: int,
    *,
    hosts: dict[str, str] | None = None,
    jobs: dict[str, str] | None = None,
    hqes: dict[str, str] | None = None,
) -> None:
    """Every shard's hosts (`fleetN-dutG`, with the shard's label) and jobs (`fleetN-jobG`, an HQE each
    for the shard's label), by INSERT ... SELECT over the shards the services made (PostgreSQL); the
    extra column expressions may use the shard `s`, the number `g`, and for HQEs their job `j`. Then
    VACUUM ANALYZE, as autovacuum would leave the tables: visibility map set, statistics fresh."""
    from django.db import connection

    from common.models import Host, HostQueueEntry, Job, Label, Shard

    shard_table, label_table = Shard._meta.db_table, Label._meta.db_table
    with connection.cursor() as cur:
        insert_select(
            cur,
            Host,
            {"hostname": "replace(s.hostname, '.lab', '') || '-dut' || g", "shard_id": "s.id", **(hosts or {})},
            f"FROM {shard_table} s CROSS JOIN generate_series(0, {int(n_hosts) - 1}) g",
        )
        cur.execute(
            f"INSERT INTO {Host.labels.through._meta.db_table} (host_id, label_id) SELECT h.id, l.id"
            f" FROM {Host._meta.db_table} h JOIN {label_table} l ON l.shard_id = h.shard_id"
        )
        insert_select(
            cur,
            Job,
            {
                "name": "replace(s.hostname, '.lab', '') || '-job' || g",
                "owner": "'bench'",
                "command": "'true'",
                "shard_id": "s.id",
                "created_on": "now()",
                **(jobs or {}),
            },
            f"FROM {shard_table} s CROSS JOIN generate_series(0, {int(n_jobs) - 1}) g",
        )
        insert_select(
            cur,
            HostQueueEntry,
            {"job_id": "j.id", "meta_host_id": "l.id", **(hqes or {})},
            f"FROM {Job._meta.db_table} j JOIN {label_table} l ON l.shard_id = j.shard_id",
        )
        cur.execute("VACUUM ANALYZE")


# Whose CPU `cpu_seconds` counts, in its order.
CPU_OF = ("the master (gunicorn workers, detector threads included)", "its PostgreSQL backends", "this client")


def cpu_seconds(master_pid: int, database: str) -> tuple[float, float, float]:
    """CPU seconds used so far by the master's process group, by the PostgreSQL backends connected
    to `database` (a backend that exited is missed: the master keeps its connections), and by
    this process, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    master = backends = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            title = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        used = (int(fields[11]) + int(fields[12])) / tick
        if int(fields[2]) == master_pid:
            master += used
        elif title.startswith("postgres:") and f" {database} " in title:
            backends += used
    return master, backends, time.process_time()


def terminate_backends(dbname: str) -> int:
    """Ends every connection to `dbname` but ours; returns how many there were."""
    conn = admin_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def copy_database(source_url: str, target: str) -> str:
    """pg_dump | psql into a new database while the source's shard runs (CREATE ... TEMPLATE would need it idle)."""
    url = create_database(target)
    dump = subprocess.Popen(["pg_dump", "--no-owner", source_url], stdout=subprocess.PIPE)
    restore = subprocess.run(
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", url], stdin=dump.stdout, capture_output=True, timeout=120
    )
    assert dump.stdout is not None
    dump.stdout.close()
    if dump.wait(60) != 0 or restore.returncode != 0:
        raise RuntimeError(f"copying the shard database failed: {restore.stderr.decode(errors='replace')[-500:]}")
    return url


# Processes.


@dataclass
class Service:
    """One long-running process of the fleet (the master, a shard, the proxy) that faults stop and restart."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== chaos: start #{self.starts + 1} of {self.name} =====\n".encode())
            log.flush()
            # A session of its own, so killing the master's group takes its gunicorn workers with it.
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, group: bool) -> None:
        """SIGKILL: the whole process group (gunicorn) or the process alone (a shard, whose jobs outlive it)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        self.proc.wait(30)

    def terminate(self, timeout: float) -> int | None:
        """SIGTERM and a bounded wait; SIGKILL to the group when it does not stop in time (then None)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            return None


def manage_argv(*args: str) -> list[str]:
    return [sys.executable, "manage.py", *args]
