"""Real processes on loopback for end-to-end tests: a master served by gunicorn, shards, shells."""

import atexit
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import requests
from django.conf import settings
from django.db import connection, transaction

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def using_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def fresh_database_url(tmp: Path, name: str, migrated_as: str | None = None) -> str:
    """A new database of the kind the suite runs on (a PostgreSQL database or a SQLite file): empty, or
    with `migrated_as` ("master" or "shard") that role's migrations applied. Migrated databases are
    copies of one migrated once per test process: `migrate` in a new process costs 1-3 s of CPU, and an
    end-to-end run makes a hundred of them."""
    template = _migrated_template(migrated_as) if migrated_as else None
    if not using_postgres():
        path = tmp / (name + ".sqlite3")
        if template:
            with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(path)) as copy:
                source.backup(copy)
        return f"sqlite:///{path}"
    dbname = f"fs_{name}_{uuid.uuid4().hex[:8]}"
    copy = f' TEMPLATE "{template}"' if template else ""

    def created() -> bool:
        try:
            _postgres_admin(f'CREATE DATABASE "{dbname}"{copy}')
        except psycopg2.errors.ObjectInUse:
            return False  # the migrating process's backend may not have ended yet when it has exited
        return True

    wait_until(created, timeout=5, interval=0.1, what=f"the template {template} to be free to copy")
    return _postgres_url(dbname)


def _postgres_url(dbname: str) -> str:
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{dbname}"


def _postgres_admin(statement: str) -> None:
    db = settings.DATABASES["default"]
    conn = psycopg2.connect(
        host=db["HOST"] or "127.0.0.1",
        port=db["PORT"] or 5432,
        user=db["USER"],
        password=db["PASSWORD"],
        dbname="postgres",
    )
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


# role -> its migrated template of this process: a PostgreSQL database's name or a SQLite file's path.
_templates: dict[str, str] = {}


def _migrated_template(role: str) -> str:
    if role not in _templates:
        where = Path(tempfile.mkdtemp(prefix=f"fs-template-{role}-"))
        atexit.register(shutil.rmtree, where, ignore_errors=True)
        url = fresh_database_url(where, role)
        Role(role, url, where).manage("migrate", "--noinput")
        if url.startswith("postgres"):
            _created_databases.append(url)
            _templates[role] = url.rsplit("/", 1)[1]
        else:
            _templates[role] = url.removeprefix("sqlite:///")
    return _templates[role]


def drop_database(url: str) -> None:
    if not url.startswith("postgres"):
        return
    _postgres_admin(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


@dataclass
class Role:
    """One role's environment: its database, data dir, and how to run manage.py in it."""

    role: str
    database_url: str
    data_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, **more: str) -> dict[str, str]:
        # Nor the browser tests' DJANGO_ALLOW_ASYNC_UNSAFE, which `check --deploy` rightly refuses.
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_") and k != "DJANGO_ALLOW_ASYNC_UNSAFE"
        }
        env.update(
            # The role's own settings, never the suite's (server.settings.test installs both roles).
            DJANGO_SETTINGS_MODULE="server.settings",
            FLEETSHARD_ROLE=self.role,
            DATABASE_URL=self.database_url,
            FLEETSHARD_DATA_DIR=str(self.data_dir),
            FLEETSHARD_HEARTBEAT_INTERVAL_S="0.5",
            SECRET_KEY="e2e-test-secret",
            PYTHONUNBUFFERED="1",
        )
        if "FLEETSHARD_CGROUP_NAME" in os.environ:
            # The session's own cgroup root (server/settings/test.py): another session's shards never reap ours.
            env["FLEETSHARD_CGROUP_NAME"] = os.environ["FLEETSHARD_CGROUP_NAME"]
        env.update(self.extra_env)
        env.update(more)
        return env

    def manage(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def shell(self, code: str) -> Any:
        """Runs Python in this role's Django and returns what the code assigns to `result` (as JSON)."""
        wrapped = code + "\nimport json as _j; print('@@RESULT@@' + _j.dumps(result, default=str))"
        out = self.manage("shell", "-c", wrapped).stdout
        return json.loads(out.rsplit("@@RESULT@@", 1)[1])

    def start(self, *args: str, log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.data_dir / log_name, "wb")  # noqa: SIM115
        return subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def assert_status(response: Any, expected: int) -> None:
    """Asserts an HTTP response's status (Django's test client or requests), showing its body when it
    is another: a failing status then says why."""
    if response.status_code != expected:
        body = getattr(response, "content", b"")
        raise AssertionError(f"status {response.status_code}, expected {expected}; body: {body[:2000]!r}")


def wait_until(predicate: Any, timeout: float = 30.0, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def news_held(board: Any, n: int) -> None:
    """The `n` waits just started are held by `board`: a loaded machine may take longer than any fixed
    pause to start them, and a wait begun after the news it is meant to hear never hears it."""
    wait_until(lambda: board.held == n, timeout=10, interval=0.01, what=f"{n} waits held")


SENTINEL_SHARD = 999_999_999_999  # a shard id no test creates


def news_settled(board: Any) -> None:
    """Every notification sent before this call has reached `board` (they arrive in the order they
    were sent: a sentinel's is heard last), so a late one cannot wake the wait a test starts next.
    Instead of a fixed pause "to let earlier news land", which a loaded machine outruns."""
    from master.sync.notifier import shards_changed

    wait_until(lambda: board.listening_since is not None, timeout=10, interval=0.02, what="the listener")
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(board.wait(SENTINEL_SHARD, None, 10.0)))
    thread.start()
    news_held(board, 1)
    with transaction.atomic():
        shards_changed([SENTINEL_SHARD])
    thread.join(11)
    assert got == [True], "the sentinel notification never came"


def stop(proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(5)
    return proc.returncode


@dataclass
class Master:
    role: Role
    url: str
    proc: subprocess.Popen[bytes]

    def shell(self, code: str) -> Any:
        return self.role.shell(code)

    def logs(self, tail: int = 4000) -> str:
        """The end of each log in the master's data directory, for a failure's message: pytest's
        temporary directory, and the logs with it, are gone by the time CI's output is read."""
        logs = sorted(self.role.data_dir.glob("*.log"))
        return "\n".join(f"--- {log.name} (its last {tail} characters) ---\n{log.read_text()[-tail:]}" for log in logs)


@pytest.fixture(scope="session")
def master_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    """A real master (`manage.py serve`, gunicorn) on its own fresh database, shared by a session's tests."""
    yield from serve_master(tmp_path_factory)


def serve_master(tmp_path_factory: pytest.TempPathFactory, **extra_env: str) -> Iterator[Master]:
    """Starts a master with `extra_env` on a fresh database, yields it, then stops it and drops the database."""
    data_dir = tmp_path_factory.mktemp("master")
    url = fresh_database_url(data_dir, "master", migrated_as="master")
    role = Role("master", url, data_dir, extra_env)
    port = free_port()
    proc = role.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "2", log_name="master.log")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError("the master exited:\n" + (data_dir / "master.log").read_text())
        try:
            return requests.get(base + "/admin/login/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    wait_until(up, timeout=60, what="the master to serve")
    yield Master(role, base, proc)
    stop(proc)
    drop_database(url)


def serve(role: Role, port: int) -> subprocess.Popen[bytes]:
    proc = role.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "1", log_name=f"master-{port}.log")

    def up() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/admin/login/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    wait_until(up, timeout=60, what="the master to serve")
    return proc


@pytest.fixture
def own_master(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Master]:
    """A master of this test's own, which the test may stop and start again on the same port; its
    environment is the suite's plus what an indirect parametrization gives (`request.param`)."""
    data_dir = tmp_path / "own-master"
    data_dir.mkdir()
    url = fresh_database_url(data_dir, "master", migrated_as="master")
    role = Role("master", url, data_dir, dict(getattr(request, "param", {})))
    port = free_port()
    master = Master(role, f"http://127.0.0.1:{port}", serve(role, port))
    yield master
    stop(master.proc)
    drop_database(url)


@dataclass
class ShardProcess:
    role: Role
    hostname: str
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = self.role.start("run_shard", log_name=f"{self.hostname}.log")

    def stop(self) -> int:
        assert self.proc is not None
        return stop(self.proc)

    def log(self) -> str:
        return (self.role.data_dir / f"{self.hostname}.log").read_text(errors="replace")

    def shell(self, code: str) -> Any:
        return self.role.shell(code)


# PostgreSQL databases to drop at the end of the run: shards' and the migrated templates.
_created_databases: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def drop_databases_at_session_end() -> Iterator[None]:
    """At the end of the run, drops every PostgreSQL database a shard under test was given, and the templates."""
    yield
    while _created_databases:
        drop_database(_created_databases.pop())


def make_shard_process(tmp: Path, master: Master, hostname: str, token: str, **extra_env: str) -> ShardProcess:
    """A shard's own fresh database, migrated, and the environment to run `run_shard` against `master`."""
    data_dir = tmp / hostname
    data_dir.mkdir(parents=True, exist_ok=True)
    database_url = fresh_database_url(data_dir, hostname.replace(".", "_"), migrated_as="shard")
    _created_databases.append(database_url)
    role = Role(
        "shard",
        database_url,
        data_dir,
        {
            "FLEETSHARD_MASTER_URL": master.url,
            "FLEETSHARD_SHARD_HOSTNAME": hostname,
            "FLEETSHARD_SHARD_TOKEN": token,
            **extra_env,
        },
    )
    return ShardProcess(role, hostname)


def make_world(master: Master, prefix: str, hosts: int = 2, jobs: int = 1, hqes_per_job: int = 1) -> dict[str, Any]:
    """A shard owning one label, with hosts and queued jobs, created on the master through its services.

    A job never uses a host twice, so the master refuses a job asking for more hosts than the shard has."""
    assert hqes_per_job <= hosts, f"a job of {hqes_per_job} entries needs as many hosts; this world has {hosts}"
    return master.shell(
        f"""
from master import services
label = "{prefix}:board"
services.create_labels([label], acting_user=None)
shard, token = services.create_shard("{prefix}.lab", [label], acting_user=None)
hosts = services.create_hosts(["{prefix}-h%d" % i for i in range({hosts})], acting_user=None, labels=[label])
jobs = [
    services.create_job(services.JobRequest(
        name="{prefix}-j%d" % i, owner="ana", command="true", meta_hosts=[(label, {hqes_per_job})]), acting_user=None)
    for i in range({jobs})
]
result = {{"shard": shard.hostname, "shard_id": shard.id, "token": token, "label": label,
          "hosts": [h.id for h in hosts], "jobs": [j.id for j in jobs]}}
"""
    )


def tokens_just_used() -> None:
    """Marks every token as used now, so a pinned query count never includes the once-a-minute
    `last_used` write however long the test's setup took (a loaded machine can take over a minute)."""
    from django.utils import timezone

    from master.models import Token

    Token.objects.update(last_used=timezone.now())


def assert_waits_for(holder: Any, waiter: Any, what: str) -> None:
    """Runs `holder` in a transaction that stays open, then `waiter` in another thread, and shows that
    `waiter` blocks on the holder's locks until that transaction commits; neither may fail.
    (PostgreSQL: each runs on its own thread's connection.)"""
    written, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                holder()
                written.set()
                release.wait(10)
        except BaseException as exc:  # noqa: BLE001  # reported below
            errors.append(exc)
        finally:
            written.set()
            connection.close()

    def wait() -> None:
        try:
            written.wait(10)
            waiter()
        except BaseException as exc:  # noqa: BLE001  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=hold), threading.Thread(target=wait)]
    for thread in threads:
        thread.start()
    written.wait(10)
    threads[1].join(1.0)
    assert threads[1].is_alive(), what
    release.set()
    for thread in threads:
        thread.join(30)
    assert errors == [], errors


class SilentDropProxy:
    """A TCP proxy on loopback whose `drop()` makes the connections open now go silent for good, as a
    partition or a NAT that forgot them would: nothing more is forwarded either way and nothing is
    closed; connections made afterwards are forwarded as usual."""

    def __init__(self, target_port: int) -> None:
        import threading

        self.target_port = target_port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self._lock = threading.Lock()
        self._generation = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def drop(self) -> None:
        with self._lock:
            self._generation += 1

    def close(self) -> None:
        self.server.close()
        with self._lock:
            for s in self._sockets:
                s.close()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            upstream.settimeout(None)
            with self._lock:
                generation = self._generation
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, generation), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, generation: int) -> None:
        try:
            while data := src.recv(65536):
                if self._generation == generation:
                    dst.sendall(data)
        except OSError:
            pass
