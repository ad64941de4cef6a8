#!/usr/bin/env python3
"""`make chaos`: a master, three shards and thousands of short jobs on PostgreSQL, while things break.

The run starts a real master (`manage.py serve`) and three real shards (`run_shard`) on fresh PostgreSQL
databases, all on loopback; submits jobs through the REST API (pass, fail, time out, aborted by the run,
three hosts at once, named hosts) while faults chosen by a seeded RNG happen: the master SIGKILLed and
restarted, database connections terminated, a shard SIGKILLed mid-job and restarted, a shard drained
with SIGTERM and restarted, one shard's network cut for longer than three heartbeat intervals, and a
copy of a shard's database started with the same token (which the master must refuse), a job that
writes a poisoned result file (an overflowing median: the master refuses it with a 400, and the good
files after it, and a later job's, still arrive), and a host deleted on the master while its last run's
result files are on their way (they are stored without a host, none lost). Then it waits,
bounded, for every job to end and checks, from the master's and the shards' own databases, that no
job was lost, no HQE ran twice, master and shards agree, no outbox entry and no job process is left.

Run: `.venv/bin/python bench/chaos.py [--jobs N] [--faults K] [--seed S]`. DATABASE_URL names the
PostgreSQL server (any database on it; default postgres://postgres@127.0.0.1:5432/postgres).
The last line is `chaos: N jobs, F faults, L lost, T run twice, D disagree`; the exit status is 0 only
when every count of trouble is 0 and every fault passed.
"""

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg2
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import (  # noqa: E402
    Service,
    copy_database,
    create_database,
    database_url,
    manage_argv,
    say,
    setup_django,
    terminate_backends,
)
from tests.shard.fleet import sql  # noqa: E402
from tests.support import Role, drop_database, free_port, wait_until  # noqa: E402

HEARTBEAT_S = 1.0
MINUTE_S = 2.0
TERMINAL = ("Completed", "Failed", "Aborted", "Expired")
# How many findings of each kind the report lists (all are counted).
SHOWN = 8
# How many faults of each kind a full run makes; `--faults K` caps each kind at K.
FAULT_COUNTS = {
    "master_kill": 5,
    "db_terminate": 3,
    "shard_kill": 3,
    "shard_drain": 1,
    "network_cut": 1,
    "database_copy": 1,
    "poisoned_result": 1,
    "host_deleted": 1,
}
# How long a fault waits for result files to reach the master (through the other faults' outages).
RESULTS_WAIT_S = 150.0
# Two repetitions of 1.7e308 s: their median overflows to infinity, which no database stores.
POISON = (
    '{"context": {"date": "2024-01-02T03:04:05Z", "executable": "/b/poison"}, "benchmarks": ['
    + ", ".join(
        ['{"name": "BM_P", "run_type": "iteration", "iterations": 1, "real_time": 1.7e308, "time_unit": "s"}'] * 2
    )
    + "]}"
)
SHARD_ENV = {
    "FLEETSHARD_SCHEDULER_TICK_S": "0.2",
    "FLEETSHARD_MINUTE_S": str(MINUTE_S),
    "FLEETSHARD_ABORT_GRACE_S": "1",
    "FLEETSHARD_DRAIN_S": "4",
    "FLEETSHARD_HOST_COMMAND_TIMEOUT_S": "20",
    "FLEETSHARD_REQUEST_TIMEOUT_S": "10",
    "FLEETSHARD_LOG_LEVEL": "INFO",
}


@dataclass
class ShardSpec:
    name: str
    label: str
    hosts: list[str]
    role: Role
    service: Service
    results: Path
    proxied: bool = False


# The REST client: it must survive master restarts.


class Api:
    """A personal-token REST client that retries through master restarts, within a bound."""

    def __init__(self, base: str, token: str, patience_s: float = 180.0) -> None:
        self.base = base.rstrip("/") + "/api/v1/"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.patience_s = patience_s
        self.retries = 0

    def _once(self, method: str, path: str, body: Any = None) -> requests.Response:
        return self.session.request(method, self.base + path, json=body, timeout=(3, 20))

    def call(self, method: str, path: str, body: Any = None) -> requests.Response:
        """Retries connection errors and 5xx (a dying master); other answers are returned as they are.

        Only for idempotent calls: a POST that may have been applied before a crash goes through
        `create_job`, which looks before it repeats.
        """
        deadline = time.monotonic() + self.patience_s
        while True:
            try:
                resp = self._once(method, path, body)
                if resp.status_code < 500:
                    return resp
                problem = f"{resp.status_code}: {resp.text[:200]}"
            except requests.RequestException as exc:
                problem = str(exc)
            self.retries += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: the master did not answer for {self.patience_s:.0f} s: {problem}")
            time.sleep(0.5)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        resp = self.call(method, path, body)
        if resp.status_code >= 400:
            raise RuntimeError(f"{method} {path} -> {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None

    def find_job(self, name: str) -> int | None:
        found = self.ok("GET", f"jobs/?name={name}&limit=5")
        rows = found["results"] if isinstance(found, dict) else found
        return rows[0]["id"] if rows else None

    def create_job(self, spec: dict[str, Any]) -> int:
        """Creates a job exactly once: after a failed attempt it lists by the job's unique name first."""
        deadline = time.monotonic() + self.patience_s
        while True:
            try:
                resp = self._once("POST", "jobs/", spec)
                if resp.status_code == 201:
                    return int(resp.json()["id"])
                if resp.status_code < 500:
                    raise RuntimeError(f"job {spec['name']} refused: {resp.status_code} {resp.text[:300]}")
            except requests.RequestException:
                pass
            # The create may have been committed before the connection broke: look before repeating.
            self.retries += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {spec['name']}: the master did not answer for {self.patience_s:.0f} s")
            time.sleep(0.5)
            existing = self.find_job(spec["name"])
            if existing is not None:
                return existing


# The jobs.


@dataclass
class JobPlan:
    name: str
    kind: str
    spec: dict[str, Any]
    abort_after_s: float | None = None
    job_id: int | None = None


def process_mark(tag: str) -> str:
    """The string every job, cleanup and repair command of the run carries, for `ps` (not in database names)."""
    return f"fs-chaos-mark-{tag}"


def job_command(marks: Path, tag: str, body: str) -> str:
    """Every run leaves its HQE id in the marker file; the mark lets `ps` find the run's processes later."""
    return f': {process_mark(tag)}; echo "$FLEETSHARD_HQE_ID" >> {marks}/runs; {body}'


def plan_jobs(rng: random.Random, count: int, shards: list[ShardSpec], marks: Path, tag: str) -> list[JobPlan]:
    """A mix: pass, fail, time out, aborted by the run, three HQEs at once, named hosts (pass or fail)."""
    kinds = ["pass"] * 40 + ["fail"] * 14 + ["timeout"] * 4 + ["abort"] * 4 + ["multi"] * 14 + ["named"] * 14
    plans = []
    for i in range(count):
        kind = rng.choice(kinds)
        shard = rng.choice(shards)
        nap = f"sleep 0.{rng.randint(1, 5)}"
        spec: dict[str, Any] = {"name": f"{tag}-{i:05d}", "meta_hosts": [f"{shard.label}*1"]}
        abort_after = None
        if kind == "pass":
            body = f"{nap}; exit 0"
        elif kind == "fail":
            body = f"{nap}; exit {rng.randint(1, 3)}"
        elif kind == "timeout":
            body = "sleep 60; exit 0"
            spec["max_runtime_mins"] = 1
        elif kind == "abort":
            body = "sleep 60; exit 0"
            spec["max_runtime_mins"] = 30
            abort_after = rng.uniform(0.0, 8.0)
        elif kind == "multi":
            body = f"{nap}; exit 0"
            spec["meta_hosts"] = [f"{shard.label}*3"]
        else:
            body = f"{nap}; exit {rng.choice([0, 0, 0, 1])}"
            spec["meta_hosts"] = []
            spec["hosts"] = [rng.choice(shard.hosts)]
        spec["command"] = job_command(marks, tag, body)
        plans.append(JobPlan(spec["name"], kind, spec, abort_after))
    return plans


def tf_json(test: str, start: int) -> str:
    """A one-entry TensorFlow TestResults file (no quote a shell's single quotes would end)."""
    entry = {"name": "BM_Step", "iters": "10", "wallTime": 0.5}
    return json.dumps({"name": test, "startTime": str(start), "entries": {"entry": [entry]}})


def startable_hqes(url: str) -> int:
    """Queued meta-host HQEs of a shard database that a Ready host of theirs could start at once."""
    query = (
        "SELECT count(DISTINCT q.id) FROM common_hostqueueentry q JOIN common_job j ON j.id = q.job_id "
        "JOIN common_host_labels hl ON hl.label_id = q.meta_host_id JOIN common_host h ON h.id = hl.host_id "
        "JOIN shard_hoststate s ON s.host_id = h.id "
        "WHERE q.status = 'Queued' AND NOT j.aborted AND h.status = 'Ready' AND s.runner = '' AND NOT h.locked"
    )
    return int(sql(url, query)[0][0])


# The run.


@dataclass
class FaultResult:
    kind: str
    at_s: float
    ok: bool
    note: str


@dataclass
class Chaos:
    args: argparse.Namespace
    rng: random.Random
    data_dir: Path
    tag: str
    started: float = field(default_factory=time.monotonic)
    databases: list[str] = field(default_factory=list)
    master: Service | None = None
    master_url: str = ""
    master_db: str = ""
    api: Api | None = None
    proxy: Service | None = None
    shards: list[ShardSpec] = field(default_factory=list)
    plans: list[JobPlan] = field(default_factory=list)
    submitted: int = 0
    submit_error: str = ""
    faults: list[FaultResult] = field(default_factory=list)
    extra_results: list[Path] = field(default_factory=list)
    marks: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fleetshard-chaos-marks-")))

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def log(self, text: str) -> None:
        say(f"  [{self.elapsed():6.1f} s] {text}")

    # Set-up.

    def set_up_databases(self) -> tuple[str, list[str]]:
        """Migrates one database per role and copies it (idle, so TEMPLATE works) for the master and each shard."""
        templates = {}
        for role in ("master", "shard"):
            templates[role] = f"chaos_{self.tag}_{role}_template"
            url = create_database(templates[role])
            self.databases.append(url)
            Role(role, url, self.data_dir).manage("migrate", "--noinput", timeout=300)
        master = create_database(f"chaos_{self.tag}_master", templates["master"])
        shards = [create_database(f"chaos_{self.tag}_c{i}", templates["shard"]) for i in range(1, 4)]
        self.databases.extend([master, *shards])
        return master, shards

    def start_master(self, url: str) -> None:
        self.master_db = urlsplit(url).path.lstrip("/")
        role = Role("master", url, self.data_dir / "master", {"FLEETSHARD_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S)})
        role.data_dir.mkdir(parents=True, exist_ok=True)
        token = role.manage("create_token", "chaos", "--admin").stdout.strip().splitlines()[-1]
        port = free_port()
        self.master_url = f"http://127.0.0.1:{port}"
        argv = manage_argv("serve", "--bind", f"127.0.0.1:{port}", "--workers", "2")
        self.master = Service("master", argv, role.env(), self.data_dir / "master.log")
        self.master.start()
        self.wait_master()
        self.api = Api(self.master_url, token)

    def wait_master(self, timeout: float = 90) -> None:
        def up() -> bool:
            try:
                return requests.get(self.master_url + "/admin/login/", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until(up, timeout=timeout, interval=0.2, what="the master to serve")

    def set_up_fleet(self, shard_urls: list[str]) -> None:
        """Labels, three shards and their hosts through the REST API; some hosts clean up or repair."""
        assert self.api is not None
        names = [f"c{i}" for i in range(1, 4)]
        self.api.ok("POST", "labels/", {"names": [f"board:{self.tag}-{n}" for n in names]})
        proxy_port = free_port()
        for index, (name, url) in enumerate(zip(names, shard_urls, strict=True)):
            label = f"board:{self.tag}-{name}"
            token = self.api.ok("POST", "shards/", {"hostname": f"{name}.{self.tag}", "labels": [label]})["token"]
            hosts = [f"{name}-dut{h}-{self.tag}" for h in range(1, self.args.hosts + 1)]
            for h, host in enumerate(hosts):
                attributes = {"serial": f"{name.upper()}-{h}"}
                if h % 3 == 1:
                    attributes["cleanup_command"] = f": {process_mark(self.tag)}; sleep 0.1"
                if h % 3 == 2:
                    attributes["repair_command"] = f": {process_mark(self.tag)}; sleep 0.3"
                self.api.ok("POST", "hosts/", {"hostnames": [host], "labels": [label], "attributes": attributes})
            proxied = index == 2
            master_url = f"http://127.0.0.1:{proxy_port}" if proxied else self.master_url
            self.shards.append(self.make_shard(f"{name}.{self.tag}", label, hosts, url, token, master_url, proxied))
        self.proxy = Service(
            "proxy",
            [
                sys.executable,
                str(ROOT / "bench" / "chaos_proxy.py"),
                str(proxy_port),
                str(urlsplit(self.master_url).port),
            ],
            dict(os.environ),
            self.data_dir / "proxy.log",
        )
        self.proxy.start()

    def make_shard(
        self, name: str, label: str, hosts: list[str], url: str, token: str, master_url: str, proxied: bool
    ) -> ShardSpec:
        data_dir = self.data_dir / name
        data_dir.mkdir(parents=True, exist_ok=True)
        results = data_dir / "results"
        env = SHARD_ENV | {
            "FLEETSHARD_MASTER_URL": master_url,
            "FLEETSHARD_SHARD_HOSTNAME": name,
            "FLEETSHARD_SHARD_TOKEN": token,
            "FLEETSHARD_RESULTS_DIR": str(results),
        }
        role = Role("shard", url, data_dir, env)
        service = Service(name, manage_argv("run_shard"), role.env(), self.data_dir / f"{name}.log")
        return ShardSpec(name, label, hosts, role, service, results, proxied)

    # Submitting and aborting.

    def submit_all(self) -> None:
        """The submitting client: one job at a time, each exactly once, through master restarts."""
        assert self.api is not None
        try:
            for plan in self.plans:
                plan.job_id = self.api.create_job(plan.spec)
                if plan.abort_after_s is not None:
                    plan.abort_after_s += self.elapsed()
                self.submitted += 1
        except Exception as exc:  # noqa: BLE001 (reported, and the run fails)
            self.submit_error = str(exc)

    def abort_due(self) -> None:
        """Aborts the 'abort' jobs whose moment has come; a job that already ended is fine."""
        assert self.api is not None
        now = self.elapsed()
        for plan in self.plans:
            if plan.job_id is None or plan.abort_after_s is None or plan.abort_after_s > now:
                continue
            plan.abort_after_s = None
            resp = self.api.call("POST", f"jobs/{plan.job_id}/abort/")
            if resp.status_code >= 400 and "already finished" not in resp.text:
                self.log(f"abort of job {plan.job_id} answered {resp.status_code}: {resp.text[:200]}")

    # Progress, read from the master's database.

    def job_counts(self) -> Counter[str]:
        rows = sql(
            database_url(self.master_db),
            "SELECT status, count(*) FROM common_job WHERE name LIKE %s GROUP BY status",
            (f"{self.tag}-%",),
        )
        return Counter({status: int(n) for status, n in rows})

    def terminal_jobs(self) -> int:
        try:
            counts = self.job_counts()
        except psycopg2.Error:
            return 0
        return sum(counts[s] for s in TERMINAL)

    def progress(self) -> float:
        """Half submission, half completion: faults land while jobs are submitted and while they run."""
        total = len(self.plans)
        return (self.submitted + self.terminal_jobs()) / (2 * total)

    # Faults.

    def fault_plan(self) -> list[tuple[float, str]]:
        kinds = [k for k, n in FAULT_COUNTS.items() for _ in range(min(n, self.args.faults))]
        return sorted((self.rng.uniform(0.03, 0.9), kind) for kind in kinds)

    def run_fault(self, kind: str) -> None:
        at = self.elapsed()
        try:
            note = getattr(self, f"fault_{kind}")()
            ok = True
        except Exception as exc:  # noqa: BLE001 (a fault that did not pass is reported, and fails the run)
            ok, note = False, f"{type(exc).__name__}: {exc}"
        self.faults.append(FaultResult(kind, at, ok, note))
        self.log(f"fault {len(self.faults)}: {kind}: {'passed' if ok else 'FAILED'}: {note}")

    def fault_master_kill(self) -> str:
        assert self.master is not None
        self.master.kill(group=True)
        down = self.rng.uniform(0.5, 3.0)
        time.sleep(down)
        self.master.start()
        self.wait_master()
        return f"SIGKILL to the master's process group, down {down:.1f} s, serving again"

    def fault_db_terminate(self) -> str:
        """Terminates backends of the master's and of a shard's database, in bursts over a second."""
        shard = self.rng.choice(self.shards)
        dbs = {"master": self.master_db, shard.name: urlsplit(shard.role.database_url).path.lstrip("/")}
        killed: Counter[str] = Counter()
        for _ in range(20):
            for who, db in dbs.items():
                killed[who] += terminate_backends(db)
            time.sleep(0.05)
        return "pg_terminate_backend: " + ", ".join(f"{n} connections of {w}" for w, n in killed.items())

    def count_on(self, shard: ShardSpec, status: str) -> int:
        query = "SELECT count(*) FROM common_hostqueueentry WHERE status = %s"
        return int(sql(shard.role.database_url, query, (status,))[0][0])

    def busiest(self, status: str, candidates: list[ShardSpec]) -> ShardSpec | None:
        """A random one of the shards with HQEs in `status` now, or None."""
        busy = [s for s in candidates if self.count_on(s, status)]
        return self.rng.choice(busy) if busy else None

    def startable(self, candidates: list[ShardSpec]) -> ShardSpec | None:
        """A shard whose database holds a queued meta-host HQE and a Ready host with its label right now."""
        ready = [s for s in candidates if startable_hqes(s.role.database_url)]
        return self.rng.choice(ready) if ready else None

    def fault_shard_kill(self) -> str:
        """SIGKILL to a shard with a job running (its job processes outlive it), and a restart."""
        shard = wait_until(
            lambda: self.busiest("Running", self.shards), timeout=60, interval=0.1, what="a job running on a shard"
        )
        running = self.count_on(shard, "Running")
        shard.service.kill(group=False)
        down = self.rng.uniform(0.5, 3.0)
        time.sleep(down)
        shard.service.start()
        return f"SIGKILL to {shard.name} with {running} job(s) running, restarted after {down:.1f} s"

    def fault_shard_drain(self) -> str:
        shard = self.rng.choice(self.shards)
        code = shard.service.terminate(timeout=float(SHARD_ENV["FLEETSHARD_DRAIN_S"]) + 60)
        if code != 0:
            shard.service.start()
            raise RuntimeError(f"{shard.name} did not drain cleanly on SIGTERM (exit {code})")
        shard.service.start()
        return f"SIGTERM to {shard.name}: drained, exit 0, restarted"

    def fault_network_cut(self) -> str:
        """Stops the proxy for longer than three heartbeat intervals; the master must see the shard go silent."""
        assert self.proxy is not None
        shard = next(s for s in self.shards if s.proxied)
        cut = 3 * HEARTBEAT_S + self.rng.uniform(1.0, 3.0)
        self.proxy.kill(group=True)
        time.sleep(cut)
        silent = self.heard_s_ago(shard)
        self.proxy.start()
        if silent < 3 * HEARTBEAT_S:
            raise RuntimeError(f"the master heard {shard.name} {silent:.1f} s ago through a cut network")
        wait_until(lambda: self.heard_s_ago(shard) < 3 * HEARTBEAT_S, timeout=120, what=f"{shard.name} back")
        return f"network of {shard.name} cut {cut:.1f} s (master: silent {silent:.1f} s), heartbeating again"

    def heard_s_ago(self, shard: ShardSpec) -> float:
        rows = sql(
            database_url(self.master_db),
            "SELECT extract(epoch FROM now() - last_heartbeat) FROM common_shard WHERE hostname = %s",
            (shard.name,),
        )
        return float(rows[0][0]) if rows and rows[0][0] is not None else float("inf")

    def fault_database_copy(self) -> str:
        """A copy of a live shard's database, run with the same token, must be refused (409) and run nothing."""
        candidates = [s for s in self.shards if not s.proxied]
        # The dangerous copy holds queued work and a Ready host: it must start none of it. Wait
        # (bounded) for such a moment on some shard; else copy a random one.
        try:
            shard = wait_until(lambda: self.startable(candidates), timeout=20, interval=0.05, what="queued work")
        except AssertionError:
            shard = self.rng.choice(candidates)
        copy_name = f"chaos_{self.tag}_copy"
        url = copy_database(shard.role.database_url, copy_name)
        self.databases.append(url)
        startable = startable_hqes(url)
        data_dir = self.data_dir / f"{shard.name}-copy"
        data_dir.mkdir(parents=True, exist_ok=True)
        results = data_dir / "results"
        self.extra_results.append(results)
        env = shard.role.extra_env | {"FLEETSHARD_RESULTS_DIR": str(results)}
        role = Role("shard", url, data_dir, env)
        copy = Service(
            f"{shard.name}-copy", manage_argv("run_shard"), role.env(), self.data_dir / f"{shard.name}-copy.log"
        )
        copy.start()
        assert copy.proc is not None
        try:
            code = copy.proc.wait(90)
        except subprocess.TimeoutExpired:
            copy.kill(group=True)
            raise RuntimeError("the copy was not refused within 90 s") from None
        text = copy.log_path.read_text(errors="replace")
        if code == 0 or "running from another database" not in text:
            raise RuntimeError(f"the copy exited {code} without the master's refusal; see {copy.log_path}")
        return (
            f"copy of {shard.name}'s database ({startable} HQEs it could have started) refused: "
            f"exit {code}, 409 'running from another database'"
        )

    # Faults of the results path: what reaches the master is checked on the master's database.

    def results_job(self, name: str, shard: ShardSpec, files: dict[str, str], **spec: Any) -> int:
        """A job (outside the run's plan and counts) that writes `files` into its results/ and ends."""
        assert self.api is not None
        writes = "; ".join(f"printf '%s' '{body}' > \"$R/{fname}\"" for fname, body in files.items())
        command = f': {process_mark(self.tag)}; R="$FLEETSHARD_RESULTS_DIR/results"; mkdir -p "$R"; {writes}'
        body = {"name": name, "command": command, "meta_hosts": [f"{shard.label}*1"], **spec}
        return self.api.create_job(body)

    def stored_tests(self, prefix: str) -> list[tuple[str, int | None]]:
        return sql(
            database_url(self.master_db),
            "SELECT test, host_id FROM master_testrun WHERE test LIKE %s ORDER BY test",
            (f"{prefix}%",),
        )

    def fault_poisoned_result(self) -> str:
        """A job writes a file the master cannot store and a good one after it; a later job writes a good
        one: the poisoned file is refused (400) and quarantined, and both good files arrive."""
        shard = self.rng.choice(self.shards)
        prefix = f"poison-{self.tag}-"
        first = self.results_job(
            f"fault-{self.tag}-poisoned",
            shard,
            {"a-poison.json": POISON, "b-good.json": tf_json(prefix + "1", 1_700_000_001)},
        )
        self.results_job(f"fault-{self.tag}-after", shard, {"r.json": tf_json(prefix + "2", 1_700_000_002)})
        wait_until(
            lambda: len(self.stored_tests(prefix)) == 2, timeout=RESULTS_WAIT_S, what="the good result files stored"
        )
        refused = sql(
            database_url(self.master_db),
            "SELECT r.reason FROM master_rejectedresult r JOIN common_hostqueueentry q ON q.id = r.hqe_id "
            "WHERE q.job_id = %s AND r.name = 'a-poison.json'",
            (first,),
        )
        if not refused or "not a finite number" not in refused[0][0]:
            raise RuntimeError(f"the poisoned file's refusal was not recorded as expected: {refused}")
        return (
            f"a poisoned result file on {shard.name} refused ({refused[0][0][:80]}); the 2 good files after it stored"
        )

    def fault_host_deleted(self) -> str:
        """A host of its own runs a job writing many result files, and is deleted on the master the moment
        the run ends there: its results, in flight, are stored without a host; none is lost."""
        assert self.api is not None
        shard = self.rng.choice([s for s in self.shards if not s.proxied])
        host = f"gone-{self.tag}"
        # A label of its own (the shard's): no job of the plan can start there before it is deleted.
        label = f"board:{self.tag}-gone"
        self.api.ok("POST", "labels/", {"names": [label]})
        self.api.ok("POST", f"shards/{shard.name}/add_labels/", {"labels": [label]})
        self.api.ok("POST", "hosts/", {"hostnames": [host], "labels": [label]})
        prefix = f"gone-{self.tag}-"
        files = {f"r{n:02d}.json": tf_json(f"{prefix}{n:02d}", 1_700_000_100 + n) for n in range(40)}
        job = self.results_job(f"fault-{self.tag}-gone", shard, files, meta_hosts=[], hosts=[host])
        ended = f"SELECT status FROM common_hostqueueentry WHERE job_id = {int(job)}"
        wait_until(
            lambda: sql(database_url(self.master_db), ended)[0][0] in TERMINAL,
            timeout=RESULTS_WAIT_S,
            interval=0.02,
            what="the host's run to end",
        )
        wait_until(
            lambda: self.api is not None and self.api.call("DELETE", f"hosts/{host}/").status_code == 204,
            timeout=RESULTS_WAIT_S,
            interval=0.05,
            what=f"{host} deleted",
        )
        wait_until(
            lambda: len(self.stored_tests(prefix)) == len(files),
            timeout=RESULTS_WAIT_S,
            what="every result file stored",
        )
        without = sum(1 for _, host_id in self.stored_tests(prefix) if host_id is None)
        stored = f"{len(files)} result files stored, {without} without a host"
        return f"{host} on {shard.name} deleted as its run ended: {stored}"

    # The main loop.

    def drive(self) -> None:
        """Submits (in a thread), aborts, and makes the faults happen as progress passes each fault's moment."""
        pending = self.fault_plan()
        say(f"• faults ({len(pending)}): " + ", ".join(f"{k}@{p:.2f}" for p, k in pending))
        submitter = threading.Thread(target=self.submit_all, name="submitter", daemon=True)
        submitter.start()
        deadline = time.monotonic() + self.args.max_minutes * 60
        last_report = 0.0
        while time.monotonic() < deadline:
            self.abort_due()
            progress = self.progress()
            while pending and pending[0][0] <= progress:
                self.run_fault(pending.pop(0)[1])
            if self.elapsed() - last_report >= 10:
                last_report = self.elapsed()
                counts = self.job_counts()
                self.log(
                    f"submitted {self.submitted}/{len(self.plans)}; "
                    + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                )
            if self.submit_error or (
                not submitter.is_alive() and not pending and self.terminal_jobs() >= len(self.plans)
            ):
                break
            if not submitter.is_alive() and not pending and self.settle_deadline_passed():
                break
            time.sleep(0.2)
        for _, kind in pending:
            self.faults.append(FaultResult(kind, self.elapsed(), False, "never happened: the run ran out of time"))

    _settle_since: float | None = None

    def settle_deadline_passed(self) -> bool:
        """Once everything is submitted and every fault done, jobs get a bounded time to end."""
        if self._settle_since is None:
            self._settle_since = time.monotonic()
        return time.monotonic() - self._settle_since > self.args.settle_s

    def stop_everything(self) -> list[str]:
        """Drains the shards (so their outboxes reach the master), then stops the master and the proxy."""
        problems = []
        for shard in self.shards:
            was_alive = shard.service.alive()
            code = shard.service.terminate(timeout=90)
            if was_alive and code != 0:
                problems.append(f"{shard.name} did not stop cleanly on SIGTERM (exit {code})")
        for service in (self.master, self.proxy):
            if service is not None:
                service.terminate(timeout=30)
        return problems


# The checks.


@dataclass
class Report:
    jobs: int
    lost: list[str]
    twice: list[str]
    disagree: list[str]
    outbox: list[str]
    processes: list[str]
    other: list[str]
    host_reuse: list[str] = field(default_factory=list)


def results_runs(roots: list[Path]) -> Counter[int]:
    """Runs per HQE from the shards' results directories, `<results>/<job>/<hqe>-<host>[-n]/`."""
    runs: Counter[int] = Counter()
    for root in roots:
        for run_dir in root.glob("*/*"):
            head = run_dir.name.split("-", 1)[0]
            if run_dir.is_dir() and head.isdigit():
                runs[int(head)] += 1
    return runs


def marker_runs(marks: Path) -> Counter[int]:
    path = marks / "runs"
    return Counter(int(x) for x in path.read_text().split()) if path.exists() else Counter()


def leftover_processes(tag: str) -> list[str]:
    """Processes whose command line carries the run's tag: jobs, cleanups or repairs nobody ended."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if process_mark(tag) in args and int(proc.name) != os.getpid():
            found.append(f"pid {proc.name}: {args[:150]}")
    return found


def kill_leftovers(tag: str) -> None:
    """Ends, by pid, what the checks found still running with this run's tag (after they counted it)."""
    for line in leftover_processes(tag):
        pid = int(line.split()[1].rstrip(":"))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def check(chaos: Chaos) -> Report:
    master_url = database_url(chaos.master_db)
    names = {p.name for p in chaos.plans}
    jobs = {
        name: (job_id, status)
        for job_id, name, status in sql(
            master_url, "SELECT id, name, status FROM common_job WHERE name LIKE %s", (f"{chaos.tag}-%",)
        )
    }
    lost = [f"job {n}: never created" for n in sorted(names - set(jobs))]
    lost += [f"job {jid} ({n}): {s}" for n, (jid, s) in sorted(jobs.items()) if s not in TERMINAL]
    master_hqes = {
        hqe_id: (status, failure, shard)
        for hqe_id, status, failure, shard in sql(
            master_url,
            "SELECT q.id, q.status, q.failure, s.hostname FROM common_hostqueueentry q JOIN common_job j "
            "ON j.id = q.job_id LEFT JOIN common_shard s ON s.id = j.shard_id WHERE j.name LIKE %s",
            (f"{chaos.tag}-%",),
        )
    }
    lost += [f"HQE {h}: {s} on the master" for h, (s, _, _) in sorted(master_hqes.items()) if s not in TERMINAL]

    by_results = results_runs([s.results for s in chaos.shards] + chaos.extra_results)
    by_marker = marker_runs(chaos.marks)
    twice = [f"HQE {h}: {n} results directories" for h, n in sorted(by_results.items()) if n > 1]
    twice += [f"HQE {h}: {n} marker lines" for h, n in sorted(by_marker.items()) if n > 1]

    disagree, outbox, other = [], [], []
    for shard in chaos.shards:
        rows = sql(shard.role.database_url, "SELECT id, status, failure FROM common_hostqueueentry")
        for hqe_id, status, failure in rows:
            on_master = master_hqes.get(hqe_id)
            if on_master is not None and on_master[:2] != (status, failure):
                disagree.append(f"HQE {hqe_id}: master {on_master[0]}/{on_master[1]}, {shard.name} {status}/{failure}")
        left = int(sql(shard.role.database_url, "SELECT count(*) FROM shard_outboxentry")[0][0])
        if left:
            outbox.append(f"{shard.name}: {left} outbox entries")
        dead = int(sql(shard.role.database_url, "SELECT count(*) FROM shard_deadletter")[0][0])
        if dead:
            other.append(f"{shard.name}: {dead} dead letters (updates the master rejected)")
    doubles = sql(
        master_url,
        "SELECT name, count(*) FROM common_job WHERE name LIKE %s GROUP BY name HAVING count(*) > 1",
        (f"{chaos.tag}-%",),
    )
    other += [f"job {name} submitted {n} times" for name, n in doubles]
    reuse = sql(
        master_url,
        "SELECT q.job_id, q.host_id, count(*) FROM common_hostqueueentry q JOIN common_job j ON j.id = q.job_id "
        "WHERE j.name LIKE %s AND q.started_on IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1 ORDER BY 1",
        (f"{chaos.tag}-%",),
    )
    host_reuse = [f"job {job_id}: {n} HQEs ran on host {host_id}" for job_id, host_id, n in reuse]
    ran_unrecorded = sorted(set(by_marker) - set(master_hqes))
    if ran_unrecorded:
        other.append(f"marker lines of unknown HQEs: {ran_unrecorded[:10]}")
    return Report(len(jobs), lost, twice, disagree, outbox, leftover_processes(chaos.tag), other, host_reuse)


def print_report(chaos: Chaos, report: Report, stop_problems: list[str]) -> int:
    counts = chaos.job_counts()
    hqe_rows = sql(
        database_url(chaos.master_db),
        "SELECT q.status, q.failure, count(*) FROM common_hostqueueentry q JOIN common_job j ON j.id = q.job_id "
        "WHERE j.name LIKE %s GROUP BY 1, 2 ORDER BY 1, 2",
        (f"{chaos.tag}-%",),
    )
    failed_faults = [f for f in chaos.faults if not f.ok]
    say("")
    say(f"chaos seed {chaos.args.seed}: results")
    say("  jobs by status:  " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    say("  HQEs by status:  " + ", ".join(f"{n} {s}{'/' + f if f else ''}" for s, f, n in hqe_rows))
    say("  faults:          " + ", ".join(f"{n} {k}" for k, n in Counter(f.kind for f in chaos.faults).items()))
    say(f"  client retries:  {chaos.api.retries if chaos.api else 0} (through master restarts)")
    tolerated = set(chaos.args.tolerate)
    sections = [
        ("lost", "jobs lost (never terminal)", report.lost),
        ("twice", "HQEs run twice (results directories and markers)", report.twice),
        ("disagree", "HQEs whose master status disagrees with the shard's", report.disagree),
        ("outbox", "outbox entries left", report.outbox),
        ("processes", "processes left running", report.processes),
        (
            "host-reuse",
            "jobs that used a host twice (docs/design.md: a job never uses a host twice)",
            report.host_reuse,
        ),
        ("faults", "faults that did not pass", [f"{f.kind} at {f.at_s:.0f} s: {f.note}" for f in failed_faults]),
        (
            "other",
            "other problems",
            report.other + stop_problems + ([chaos.submit_error] if chaos.submit_error else []),
        ),
    ]
    for key, title, items in sections:
        note = " (tolerated: --tolerate " + key + ")" if key in tolerated and items else ""
        say(f"  {title}: {len(items)}{note}")
        for item in items[:SHOWN]:
            say(f"    - {item}")
        if len(items) > SHOWN:
            say(f"    - ... and {len(items) - SHOWN} more")
    say(f"  time: {chaos.elapsed():.0f} s")
    passed = len(chaos.faults) - len(failed_faults)
    say(
        f"chaos: {report.jobs} jobs, {passed} faults, {len(report.lost)} lost, "
        f"{len(report.twice)} run twice, {len(report.disagree)} disagree"
    )
    return 1 if any(items for key, _, items in sections if key not in tolerated) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="how many jobs to submit (default 2000)")
    parser.add_argument("--faults", type=int, default=5, help="at most this many faults of each kind (default: all)")
    parser.add_argument("--seed", type=int, default=None, help="the RNG seed (default: a random one, printed)")
    parser.add_argument("--hosts", type=int, default=4, help="hosts per shard (at least 3)")
    parser.add_argument(
        "--settle-s", type=float, default=300, help="how long jobs may take to end after the last fault"
    )
    parser.add_argument("--max-minutes", type=float, default=60, help="a hard bound on the whole run")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "var" / "chaos", help="throwaway directory (wiped)")
    parser.add_argument(
        "--keep-databases", action="store_true", help="leave the PostgreSQL databases for a post-mortem"
    )
    parser.add_argument(
        "--tolerate",
        action="append",
        default=[],
        choices=["host-reuse"],
        help="report this kind of finding but do not fail on it (a known defect fixed elsewhere)",
    )
    args = parser.parse_args()
    # Django settings for this process, which only reach the PostgreSQL server (drop_database reads them):
    # here, not at import, so the tests can import the checks without touching their settings.
    setup_django("master", postgres=True, prefix="fleetshard-chaos-settings-")
    if args.hosts < 3:
        parser.error("--hosts must be at least 3: jobs with three HQEs need three hosts on one shard")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    tag = f"chaos{args.seed}x{uuid.uuid4().hex[:6]}"
    data_dir = args.data_dir.resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    chaos = Chaos(args, random.Random(args.seed), data_dir, tag)
    (chaos.marks / "runs").touch()
    chaos.marks.chmod(0o777)
    (chaos.marks / "runs").chmod(0o666)
    say(f"chaos: seed {args.seed}, {args.jobs} jobs, up to {args.faults} faults of each kind; logs in {data_dir}")
    code = 1
    try:
        master_url, shard_urls = chaos.set_up_databases()
        chaos.start_master(master_url)
        chaos.set_up_fleet(shard_urls)
        for shard in chaos.shards:
            shard.service.start()
        say(
            f"• master {chaos.master_url}; shards "
            + ", ".join(f"{s.name} ({len(s.hosts)} hosts)" for s in chaos.shards)
        )
        chaos.plans = plan_jobs(chaos.rng, args.jobs, chaos.shards, chaos.marks, tag)
        say("• jobs: " + ", ".join(f"{n} {k}" for k, n in sorted(Counter(p.kind for p in chaos.plans).items())))
        chaos.drive()
        stop_problems = chaos.stop_everything()
        code = print_report(chaos, check(chaos), stop_problems)
    finally:
        chaos.stop_everything()
        kill_leftovers(tag)
        shutil.rmtree(chaos.marks, ignore_errors=True)
        if not args.keep_databases:
            for url in chaos.databases:
                drop_database(url)
    return code


if __name__ == "__main__":
    sys.exit(main())
