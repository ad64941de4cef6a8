"""deploy/: the systemd units, nginx site and Prometheus rules are valid, and each unit's ExecStart,
run with its environment file, works against a loopback master behind the real nginx site file."""

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.support import ROOT, assert_status, drop_database, free_port, fresh_database_url, stop, wait_until

pytestmark = pytest.mark.e2e

DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
VENV_BIN = Path(sys.executable).parent
INSTALLED_BIN = "/opt/fleetshard/bin"


@dataclass
class Unit:
    path: Path
    service: dict[str, list[str]]

    @classmethod
    def read(cls, name: str) -> "Unit":
        section, service = "", {}
        for line in (UNITS / name).read_text().splitlines():
            line = line.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "Service":
                key, _, value = line.partition("=")
                service.setdefault(key, []).append(value)
        return cls(UNITS / name, service)

    def one(self, key: str) -> str:
        [value] = self.service[key]
        return value

    def environment(self, **overrides: str) -> dict[str, str]:
        """Environment= and then EnvironmentFile= (the example in deploy/env/), as systemd applies them."""
        env: dict[str, str] = {}
        for assignment in self.service.get("Environment", []):
            key, _, value = assignment.partition("=")
            env[key] = value
        env_file = Path(self.one("EnvironmentFile"))
        assert env_file.parent == Path("/etc/fleetshard"), env_file
        env |= read_env(DEPLOY / "env" / env_file.name)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSHARD_", "DJANGO_"))}
        # Each test session's runs live in its own cgroup (server/settings/test.py).
        base["FLEETSHARD_CGROUP_NAME"] = os.environ.get("FLEETSHARD_CGROUP_NAME", "fleetshard-test")
        return base | env | overrides

    def argv(self, env: dict[str, str]) -> list[str]:
        """ExecStart as systemd runs it: ${VAR} and $VAR from the environment, the installed venv's bin here."""
        line = self.one("ExecStart")
        assert line.startswith(INSTALLED_BIN + "/"), line
        expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env[m[1] or m[2]], line)
        words = expanded.split()
        words[0] = str(VENV_BIN / Path(words[0]).name)
        return words


def read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{path.name}: {line!r}"
            env[key] = value
    return env


def all_units() -> list[Path]:
    return sorted(UNITS.glob("fleetshard-*"))


# --- static checks ---


def test_units_pass_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    for unit in all_units():
        text = unit.read_text().replace(INSTALLED_BIN, str(VENV_BIN)).replace("/etc/fleetshard", str(DEPLOY / "env"))
        (tmp_path / unit.name).write_text(text)
    proc = subprocess.run(
        [analyze, "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stdout + proc.stderr


def test_every_service_reads_its_roles_env_file_and_runs_the_installed_command():
    services = [p.name for p in all_units() if p.suffix == ".service"]
    assert {"fleetshard-master.service", "fleetshard-shard.service", "fleetshard-worker-manager.service"} <= set(
        services
    )
    for name in services:
        unit = Unit.read(name)
        assert unit.one("EnvironmentFile").startswith("/etc/fleetshard/"), name
        assert unit.one("ExecStart").startswith(f"{INSTALLED_BIN}/fleetshard-manage "), name
        assert unit.one("User") in ("fleetshard", "root"), name
    assert Unit.read("fleetshard-master.service").one("User") == "fleetshard"


def longest_shard_stop(env: dict[str, str]) -> float:
    """The longest a draining run_shard takes after SIGTERM (shard/process.py): the drain, the abort
    grace and the kill, recording the ends, the heartbeat and uploads in flight, the last heartbeats."""
    from shard.process import FINAL_HEARTBEATS, RECORD_GRACE_S
    from shard.run.tracking import KILL_WAIT_S

    request = 5.0 + float(env["FLEETSHARD_REQUEST_TIMEOUT_S"])  # connect + read (shard/sync/client.py)
    return (
        float(env["FLEETSHARD_DRAIN_S"])
        + float(env["FLEETSHARD_ABORT_GRACE_S"])
        + KILL_WAIT_S
        + RECORD_GRACE_S
        + request
        + 10
        + FINAL_HEARTBEATS * request
    )


def test_the_shard_unit_outlasts_its_drain_and_delegates_cgroups():
    unit = Unit.read("fleetshard-shard.service")
    env = read_env(DEPLOY / "env" / "shard.env")
    assert float(unit.one("TimeoutStopSec")) > longest_shard_stop(env)
    assert unit.one("KillSignal") == "SIGTERM" and unit.one("KillMode") == "mixed"
    assert unit.one("Delegate") == "yes"


# What each sandboxing option would take from a job: every process of a unit gets them, jobs too.
BREAKS_JOBS = {
    "ProtectSystem": "writing where a test writes",
    "ProtectHome": "home directories",
    "NoNewPrivileges": "sudo",
    "PrivateDevices": "the lab's devices",
    "DevicePolicy": "the lab's devices",
    "DeviceAllow": "every device not listed",
    "PrivateTmp": "a /tmp shared with the host's tools",
    "ProtectControlGroups": "the shard's cgroups",
    "ProtectKernelLogs": "dmesg",
    "ProtectKernelModules": "modprobe and /usr/lib/modules",
    "ProtectKernelTunables": "sysctl",
    "ProtectClock": "setting the clock, adjtimex, devices on some systemd versions",
    "ProtectHostname": "hostname",
    "LockPersonality": "setarch and 32-bit tools",
    "RestrictNamespaces": "containers",
    "RestrictSUIDSGID": "setuid test tools",
    "RestrictAddressFamilies": "netlink, bluetooth, CAN",
    "SystemCallFilter": "whatever it filters",
    "CapabilityBoundingSet": "root's capabilities under sudo",
    "MemoryDenyWriteExecute": "JITs",
}


@pytest.mark.parametrize("name", ["fleetshard-shard.service", "fleetshard-worker-manager.service"])
def test_units_that_run_jobs_have_no_sandboxing_a_job_would_inherit(name):
    unit = Unit.read(name)
    inherited = {option: BREAKS_JOBS[option] for option in unit.service if option in BREAKS_JOBS}
    assert not inherited, f"{name} takes from its jobs: {inherited}"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; .ci/run installs it)")
    return found


def test_prometheus_rules_check_and_their_unit_tests_pass():
    tool = promtool()
    for args in (["check", "rules", "fleetshard.rules.yml"], ["test", "rules", "fleetshard.rules.test.yml"]):
        proc = subprocess.run([tool, *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_prometheus_scrape_config_checks(tmp_path):
    tool = promtool()
    shutil.copy(DEPLOY / "prometheus" / "fleetshard.rules.yml", tmp_path)
    (tmp_path / "fleetshard-master.token").write_text("token\n")
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text().replace("/etc/prometheus", str(tmp_path))
    (tmp_path / "prometheus.yml").write_text(config)
    proc = subprocess.run([tool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the units' commands against a loopback master behind nginx ---


def self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def nginx_site(tmp: Path, upstream_port: int, cert: Path, key: Path) -> tuple[subprocess.Popen[bytes], int]:
    """deploy/nginx/fleetshard.conf with this test's ports and certificate, in an nginx of its own."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.skip("nginx is not installed (Debian's nginx-light; .ci/run installs it)")
    http_port, https_port = free_port(), free_port()
    site = (DEPLOY / "nginx" / "fleetshard.conf").read_text()
    site = site.replace("127.0.0.1:8000", f"127.0.0.1:{upstream_port}")
    site = re.sub(r"listen \[::\]:\d+[^;]*;", "", site)
    site = site.replace("listen 80;", f"listen 127.0.0.1:{http_port};")
    site = site.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{https_port} ssl http2;")
    site = site.replace("/etc/letsencrypt/live/fleet.example.org/fullchain.pem", str(cert))
    site = site.replace("/etc/letsencrypt/live/fleet.example.org/privkey.pem", str(key))
    (tmp / "site.conf").write_text(site)
    (tmp / "nginx.conf").write_text(
        f"daemon off; pid {tmp}/nginx.pid; error_log {tmp}/nginx-error.log; worker_processes 1;\n"
        "events { worker_connections 64; }\n"
        f"http {{ access_log off; client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;\n"
        f"  include {tmp}/site.conf; }}\n"
    )
    test = subprocess.run([nginx, "-t", "-p", str(tmp), "-c", str(tmp / "nginx.conf")], capture_output=True, text=True)
    assert test.returncode == 0, test.stderr
    proc = subprocess.Popen(
        [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf")], stderr=subprocess.DEVNULL, start_new_session=True
    )
    return proc, https_port


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, env=env, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def manage(env: dict[str, str], *args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [str(VENV_BIN / "fleetshard-manage"), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_each_units_command_runs_with_its_env_file_behind_nginx(tmp_path):
    master_dir, shard_dir = tmp_path / "master", tmp_path / "shard"
    master_dir.mkdir()
    shard_dir.mkdir()
    master_url = fresh_database_url(master_dir, "deploymaster")
    shard_url = fresh_database_url(shard_dir, "deployshard")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        port = free_port()
        master = Unit.read("fleetshard-master.service")
        menv = master.environment(
            DATABASE_URL=master_url,
            SECRET_KEY="deploy-test-" + "x" * 50,
            FLEETSHARD_DATA_DIR=str(master_dir),
            FLEETSHARD_BIND=f"127.0.0.1:{port}",
            WEB_CONCURRENCY="1",
        )
        assert menv["FLEETSHARD_TLS_PROXY"] == "1", "the master's env file is for a master behind nginx"
        manage(menv, "migrate", "--noinput", cwd=master_dir)
        check = subprocess.run(
            [str(VENV_BIN / "fleetshard-manage"), "check", "--deploy"], env=menv, capture_output=True, text=True
        )
        assert "System check identified no issues" in check.stdout + check.stderr
        token = manage(menv, "create_token", "operator", "--admin", cwd=master_dir).strip()
        assert master.argv(menv)[1:] == ["serve", "--bind", f"127.0.0.1:{port}"]
        procs.append(start(master.argv(menv), menv, master_dir / "master.log"))
        cert, key = self_signed(tmp_path)
        nginx, https_port = nginx_site(tmp_path, port, cert, key)
        procs.append(nginx)
        base = f"https://127.0.0.1:{https_port}"

        def ready() -> bool:
            assert procs[0].poll() is None, (master_dir / "master.log").read_text()
            try:
                return requests.get(base + "/readyz", timeout=2, verify=str(cert)).status_code == 200
            except requests.RequestException:
                return False

        wait_until(ready, timeout=60, what="the master behind nginx")
        login = requests.get(base + "/admin/login/", timeout=5, verify=str(cert))
        assert_status(login, 200)
        assert "Secure" in login.headers["Set-Cookie"]
        assert "max-age=31536000" in login.headers["Strict-Transport-Security"]

        cli = {**menv, "FLEETSHARD_SERVER": base, "FLEETSHARD_TOKEN": token, "REQUESTS_CA_BUNDLE": str(cert)}
        created = subprocess.run(
            [str(VENV_BIN / "fleetshard"), "shard", "create", "lab1.example.org"],
            env=cli,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        shard_token = re.search(r"\b([A-Za-z0-9_-]{30,})\b", created.stdout)
        assert shard_token, created.stdout
        token_file = shard_dir / "shard.token"
        token_file.write_text(shard_token[1] + "\n")
        token_file.chmod(0o600)

        metrics_port = free_port()
        shard = Unit.read("fleetshard-shard.service")
        senv = shard.environment(
            DATABASE_URL=shard_url,
            SECRET_KEY="deploy-test-shard-" + "y" * 50,
            FLEETSHARD_DATA_DIR=str(shard_dir),
            FLEETSHARD_MASTER_URL=base,
            FLEETSHARD_SHARD_TOKEN_FILE=str(token_file),
            FLEETSHARD_METRICS_BIND=f"127.0.0.1:{metrics_port}",
            FLEETSHARD_JOB_USER="nobody",
            FLEETSHARD_HEARTBEAT_INTERVAL_S="0.5",
            REQUESTS_CA_BUNDLE=str(cert),
        )
        manage(senv, "migrate", "--noinput", cwd=shard_dir)
        shard_proc = start(shard.argv(senv), senv, shard_dir / "shard.log")
        procs.append(shard_proc)

        def accepted() -> bool:
            assert shard_proc.poll() is None, (shard_dir / "shard.log").read_text()
            try:
                text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
            except requests.RequestException:
                return False
            return 'fleetshard_shard_accepted{shard="lab1.example.org"} 1.0' in text

        wait_until(accepted, timeout=60, what="the shard to be accepted through nginx")
        shard_proc.send_signal(signal.SIGTERM)
        assert shard_proc.wait(60) == 0, (shard_dir / "shard.log").read_text()

        for role, env, cwd in (("master", menv, master_dir), ("shard", senv, shard_dir)):
            purge = Unit.read(f"fleetshard-{role}-purge.service")
            penv = purge.environment(**{k: env[k] for k in ("DATABASE_URL", "SECRET_KEY", "FLEETSHARD_DATA_DIR")})
            ran = subprocess.run(purge.argv(penv), env=penv, cwd=cwd, capture_output=True, text=True, timeout=120)
            assert ran.returncode == 0 and f"purge on the {role}, older than" in ran.stdout, ran.stderr

        wm = Unit.read("fleetshard-worker-manager.service")
        wenv = wm.environment(**{k: senv[k] for k in ("DATABASE_URL", "SECRET_KEY", "FLEETSHARD_DATA_DIR")})
        wenv |= {"FLEETSHARD_SHARD_TOKEN_FILE": str(token_file), "FLEETSHARD_MASTER_URL": base}
        ran = subprocess.run([*wm.argv(wenv), "--once"], env=wenv, cwd=shard_dir, capture_output=True, text=True)
        if wenv["DATABASE_URL"].startswith("sqlite"):
            # Elastic workers need PostgreSQL: on SQLite the unit's command must say so, in one line.
            assert ran.returncode == 1 and "need the shard on PostgreSQL" in ran.stderr, ran.stdout + ran.stderr
        else:
            assert ran.returncode == 0, ran.stdout + ran.stderr
    finally:
        for proc in reversed(procs):
            stop(proc)
        drop_database(master_url)
        drop_database(shard_url)
