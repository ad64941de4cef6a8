#!/usr/bin/env python3
"""`make demo`: the whole system on this machine, on SQLite, on loopback.

Starts a master and two shards (three hosts each, local executor), sets up labels, shards and hosts
with the `fleetshard` command line, submits a realistic set of jobs (passing, failing, one that times
out, a long one that the demo aborts), shows progress, prints a summary and the admin URL, and keeps
running until Ctrl-C. Then it stops every process it started. Everything lives under ./var/demo.
"""

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
ACTIVE = ("Queued", "Running")
ADMIN_USER, ADMIN_PASSWORD = "admin", "demo-admin"
# What the benchmark job uploads (fixtures/demo.json): one entry's series, which steps up at run 31.
BENCH_TEST, BENCH_ENTRY, BENCH_RUNS = "frame_render", "BM_render_frame", 40
# A demo "minute" (timeout_mins, max_runtime_mins) lasts this many seconds, so the timeout shows quickly.
DEMO_MINUTE_S = "5"

# The fleet and the jobs the demo submits: shard -> its board label, hosts and the hosts with wifi;
# each job's `fleetshard job create` options and what it shows.
DEMO = json.loads((ROOT / "fixtures" / "demo.json").read_text())
SHARDS: dict[str, dict[str, Any]] = DEMO["shards"]
JOBS: list[tuple[str, list[str], str]] = [(j["name"], j["options"], j["expect"]) for j in DEMO["jobs"]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(text: str) -> None:
    print(text, flush=True)


class Demo:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.port = free_port()
        self.server = f"http://127.0.0.1:{self.port}"
        self.token = ""
        self.cli = self._find_cli()

    # Processes.

    @staticmethod
    def _find_cli() -> list[str]:
        override = os.environ.get("FLEETSHARD_DEMO_CLI")
        if override:
            return shlex.split(override)
        if importlib.util.find_spec("cli.main") is None:
            raise SystemExit("demo: the fleetshard command line (cli/main.py) is missing from this checkout")
        script = Path(PY).parent / "fleetshard"
        return (
            [str(script)] if script.exists() else [PY, "-c", "import sys; from cli.main import main; sys.exit(main())"]
        )

    def env(self, role: str, name: str, **more: str) -> dict[str, str]:
        # The user's own database and fleetshard settings must not leak into the demo's processes.
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_") and k != "DATABASE_URL"}
        env.update(
            DJANGO_SETTINGS_MODULE="server.settings",  # the role's own, even when run from the tests
            FLEETSHARD_ROLE=role,
            FLEETSHARD_DATA_DIR=str(self.data_dir / name),
            FLEETSHARD_HEARTBEAT_INTERVAL_S="1",
            SECRET_KEY="fleetshard-demo-secret-key",
            PYTHONUNBUFFERED="1",
        )
        env.update(more)
        return env

    def manage(self, env: dict[str, str], *args: str) -> str:
        proc = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"demo: manage.py {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
        return proc.stdout

    def start(self, name: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        log = open(self.data_dir / f"{name}.log", "wb")  # noqa: SIM115 (the child keeps it)
        # A session of its own: Ctrl-C reaches the demo only, which then stops everything in order.
        proc = subprocess.Popen(
            [PY, "manage.py", *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def stop_all(self) -> bool:
        """SIGTERM to the shards first (they drain and send a last heartbeat), then the master."""
        clean = True
        shards = [(n, p) for n, p in self.procs if n != "master"]
        master = [(n, p) for n, p in self.procs if n == "master"]
        for group in (shards, master):
            for _, proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for name, proc in group:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    say(f"  {name} did not stop in 60 s: killing it")
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
                    clean = False
        self.procs.clear()
        return clean

    # The command line.

    def fleetshard(self, *args: str) -> Any:
        topic, action, *rest = args
        cmd = [*self.cli, topic, action, "--json", *rest]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_")}
        env.update(FLEETSHARD_SERVER=self.server, FLEETSHARD_TOKEN=self.token)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"demo: fleetshard {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        try:
            return json.loads(proc.stdout) if proc.stdout.strip() else None
        except ValueError:
            raise SystemExit(f"demo: fleetshard {' '.join(args)} printed no JSON: {proc.stdout[:200]!r}") from None

    # The story.

    def start_master(self) -> None:
        env = self.env("master", "master")
        say("• master: migrating its SQLite database")
        self.manage(env, "migrate", "--noinput")
        self.manage(
            env | {"DJANGO_SUPERUSER_PASSWORD": ADMIN_PASSWORD},
            "createsuperuser",
            "--noinput",
            "--username",
            ADMIN_USER,
            "--email",
            "admin@example.com",
        )
        self.token = self.manage(env, "create_token", ADMIN_USER, "--admin").strip().splitlines()[-1]
        proc = self.start("master", env, "serve", "--bind", f"127.0.0.1:{self.port}", "--workers", "2")
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"demo: the master exited; see {self.data_dir / 'master.log'}")
            try:
                with urllib.request.urlopen(self.server + "/admin/login/", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise SystemExit("demo: the master did not answer within 60 s") from None
                time.sleep(0.3)
        say(f"• master: serving on {self.server}")

    def set_up_fleet(self) -> dict[str, str]:
        labels = [s["label"] for s in SHARDS.values()] + ["wifi"]
        self.fleetshard("label", "create", *labels)
        say(f"• labels: {', '.join(labels)}")
        tokens = {}
        for shard, spec in SHARDS.items():
            tokens[shard] = self.fleetshard("shard", "create", "-l", spec["label"], shard)["token"]
            for n, host in enumerate(spec["hosts"], 1):
                board = spec["label"] + (",wifi" if host in spec["wifi"] else "")
                self.fleetshard(
                    "host",
                    "create",
                    "-b",
                    board,
                    "-i",
                    f"serial={host.upper()}-{n:04d}",
                    "-i",
                    "cleanup_command=sleep 1",
                    host,
                )
            say(f"• shard {shard}: owns {spec['label']}; hosts {', '.join(spec['hosts'])}")
        return tokens

    def start_shards(self, tokens: dict[str, str]) -> None:
        for shard, token in tokens.items():
            env = self.env(
                "shard",
                shard,
                FLEETSHARD_MASTER_URL=self.server,
                FLEETSHARD_SHARD_HOSTNAME=shard,
                FLEETSHARD_SHARD_TOKEN=token,
                FLEETSHARD_SCHEDULER_TICK_S="0.2",
                FLEETSHARD_MINUTE_S=DEMO_MINUTE_S,
                FLEETSHARD_ABORT_GRACE_S="3",
                FLEETSHARD_DRAIN_S="10",
                FLEETSHARD_COOLDOWN_S="1",
                FLEETSHARD_REPAIR_COMMAND='echo "rebooting $FLEETSHARD_HOSTNAME"; sleep 2',
            )
            self.manage(env, "migrate", "--noinput")
            self.start(shard, env, "run_shard")
            say(f"• shard {shard}: running (scheduler + heartbeat), data in {self.data_dir / shard}")

    def submit_jobs(self) -> dict[int, str]:
        say(f"• jobs (a demo minute lasts {DEMO_MINUTE_S} s):")
        ids = {}
        for name, options, role in JOBS:
            job = self.fleetshard("job", "create", *options, name)
            ids[job["id"]] = name
            say(f"    job {job['id']:>3}  {name:<16} {role}")
        return ids

    def follow(self, ids: dict[int, str], timeout: float = 300) -> list[dict[str, Any]]:
        soak = next(i for i, n in ids.items() if n == "soak-test")
        aborted = False
        began = time.monotonic()
        last = ""
        while True:
            jobs = {j["id"]: j for j in self.fleetshard("job", "list") if j["id"] in ids}
            counts: dict[str, int] = {}
            for job in jobs.values():
                counts[job["status"]] = counts.get(job["status"], 0) + 1
            line = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            if line != last:
                say(f"  [{time.monotonic() - began:5.1f} s] {line}")
                last = line
            if not aborted and soak in jobs and jobs[soak]["status"] == "Running":
                self.fleetshard("job", "abort", str(soak))
                say(f"  [{time.monotonic() - began:5.1f} s] soak-test is running: fleetshard job abort {soak}")
                aborted = True
            if len(jobs) == len(ids) and all(j["status"] not in ACTIVE for j in jobs.values()):
                return [self.fleetshard("job", "stat", str(i)) for i in sorted(jobs)]
            if time.monotonic() - began > timeout:
                raise SystemExit(f"demo: jobs still active after {timeout:.0f} s: {line}")
            time.sleep(1)

    def wait_for_benchmark(self, timeout: float = 60) -> str:
        """Waits for the benchmark job's results to reach the master (the shard uploads them as the run
        ends); the chart's URL."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.fleetshard("results", "timings", BENCH_TEST, BENCH_ENTRY, "--limit", "0")
            if len(rows) >= BENCH_RUNS:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"demo: {len(rows)} of {BENCH_RUNS} benchmark timings reached the master")
            time.sleep(0.5)
        query = urllib.parse.urlencode({"test": BENCH_TEST, "entry": BENCH_ENTRY})
        return f"{self.server}/admin/benchmarks/chart/?{query}"

    def summary(self, jobs: list[dict[str, Any]]) -> None:
        rows = [("JOB", "NAME", "STATUS", "FAILURE", "HOST", "SHARD", "DURATION")]
        for job in jobs:
            for hqe in job.get("hqes") or [{}]:
                rows.append(
                    (
                        str(job["id"]),
                        job["name"],
                        hqe.get("status") or job["status"],
                        hqe.get("failure") or "",
                        str(hqe.get("host") or "-"),
                        str(job.get("shard") or "-"),
                        duration(hqe.get("started_on"), hqe.get("finished_on")),
                    )
                )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        say("")
        for row in rows:
            say("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        say("")


def duration(started: str | None, finished: str | None) -> str:
    if not started or not finished:
        return "-"
    seconds = (parse(finished) - parse(started)).total_seconds()
    return f"{seconds:.1f} s"


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "var" / "demo", help="throwaway directory (wiped)")
    parser.add_argument(
        "--exit-after-summary",
        action="store_true",
        default=os.environ.get("FLEETSHARD_DEMO_EXIT_AFTER_SUMMARY", "") not in ("", "0"),
        help="stop everything after the summary instead of waiting for Ctrl-C (for tests)",
    )
    args = parser.parse_args()
    data_dir = args.data_dir.resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C must work even when the demo was started with SIGINT ignored (from a script, say).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    demo = Demo(data_dir)
    say(f"fleetshard demo: a master and two shards on loopback; everything under {data_dir}")
    try:
        demo.start_master()
        tokens = demo.set_up_fleet()
        demo.start_shards(tokens)
        ids = demo.submit_jobs()
        say("• progress:")
        demo.summary(demo.follow(ids))
        chart = demo.wait_for_benchmark()
        say(f"Admin UI:  {demo.server}/admin/   (user {ADMIN_USER}, password {ADMIN_PASSWORD})")
        say(f"Benchmark: {chart}   ({BENCH_TEST}: {BENCH_RUNS} runs, a step up at run 31)")
        say(f"CLI:       FLEETSHARD_SERVER={demo.server} FLEETSHARD_TOKEN={demo.token} fleetshard job list")
        say(f"Logs:      {data_dir}/*.log; job results under {data_dir}/<shard>/results/")
        if not args.exit_after_summary:
            say("Press Ctrl-C to stop.")
            # time.sleep, not Event.wait: Ctrl-C inside Event.wait can break its lock (RuntimeError).
            while not stop.is_set():
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        # Another Ctrl-C must not cut the shutdown short: stop_all bounds every wait itself.
        signal.signal(signal.SIGINT, lambda *_: say("  already stopping; each process gets at most a minute"))
        say("\nstopping the shards and the master...")
        clean = demo.stop_all()
    say("stopped." if clean else "stopped (some processes had to be killed).")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
