"""The package: `python -m build` makes a wheel that runs the master without the checkout.

The wheel is installed with pip, normally (dependencies from the registry), into a fresh virtual
environment in a temporary directory, and every command runs from outside the checkout.
"""

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import requests

from common.constants import CLIENT_VERSION
from tests.support import ROOT, assert_status, drop_database, free_port, fresh_database_url, wait_until

pytestmark = pytest.mark.e2e

SOURCES = ("pyproject.toml", "README.md", "common", "server", "master", "shard", "cli")


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path, timeout: float = 300) -> str:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def copy_sources(tmp: Path) -> Path:
    """A copy of the sources to build from, so parallel runs never share build/ or *.egg-info."""
    src = tmp / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, src / name)
    return src


def build_wheel(src: Path, tmp: Path) -> Path:
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp / "dist"), str(src)], cwd=tmp)
    [wheel] = (tmp / "dist").glob("fleetshard-*.whl")
    return wheel


def test_the_wheel_installs_and_runs_a_master_without_the_checkout(tmp_path):
    src = copy_sources(tmp_path)
    venv = tmp_path / "venv"
    # A venv without its own pip (ensurepip alone takes ~20 s here): this suite's pip installs into it
    # from the registry. The dependencies pyproject.toml declares (and nothing else) go in while the
    # wheel builds, which is most of the time this test takes; the wheel's install then finds them.
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    declared = tomllib.loads((src / "pyproject.toml").read_text())["project"]["dependencies"]
    with open(tmp_path / "deps.log", "wb") as deps_log:
        deps = subprocess.Popen(
            [*pip, "install", "--quiet", "--no-compile", *declared], cwd=tmp_path, stdout=deps_log, stderr=deps_log
        )
        try:
            wheel = build_wheel(src, tmp_path)
        finally:
            assert deps.wait(600) == 0, (tmp_path / "deps.log").read_text()
    assert wheel.name == f"fleetshard-{CLIENT_VERSION}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "master/templates/master/fleet_overview.html",
        "shard/templates/shard/admin/index.html",
        "master/static/master/vendor/uplot/uPlot.iife.min.js",
        "master/static/master/vendor/uplot/LICENSE",
        "master/migrations/0001_audit.py",
        "shard/migrations/0001_initial.py",
        "common/migrations/0001_initial.py",
    ):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "bench/", "scripts/")) for n in names)

    run([*pip, "install", "--quiet", "--no-compile", str(wheel)], cwd=tmp_path, timeout=600)

    away = tmp_path / "elsewhere"
    away.mkdir()
    url = fresh_database_url(tmp_path, "wheel")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSHARD_", "DJANGO_", "PYTHON"))}
    env.update(FLEETSHARD_ROLE="master", DATABASE_URL=url, FLEETSHARD_DATA_DIR=str(tmp_path / "data"))
    env.update(SECRET_KEY="wheel-test-secret", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    manage = str(venv / "bin" / "fleetshard-manage")
    try:
        where = run(
            [str(venv / "bin" / "python"), "-c", "import common, master; print(master.__file__)"], env=env, cwd=away
        )
        assert where.startswith(str(venv)), where
        commands = run([manage, "help", "--commands"], env=env, cwd=away).split()
        assert {"migrate", "serve", "create_token", "purge", "detect_regressions", "check"} <= set(commands)
        shard_commands = run([manage, "help", "--commands"], env=env | {"FLEETSHARD_ROLE": "shard"}, cwd=away)
        assert {"run_shard", "serve", "purge"} <= set(shard_commands.split())
        run([manage, "migrate", "--noinput"], env=env, cwd=away)
        token = run([manage, "create_token", "operator", "--admin"], env=env, cwd=away).strip()
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
        server = subprocess.Popen(
            [manage, "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
            env=env,
            cwd=away,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:

            def ready() -> bool:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    return requests.get(base + "/readyz", timeout=2).status_code == 200
                except requests.RequestException:
                    return False

            wait_until(ready, timeout=60, what="the installed master to be ready")
            assert_status(requests.get(base + "/admin/login/", timeout=5), 200)
            for asset in ("/static/master/vendor/uplot/uPlot.min.css", "/static/admin/css/base.css"):
                assert_status(requests.get(base + asset, timeout=5), 200)
            root = requests.get(base + "/api/v1/", headers={"Authorization": f"Bearer {token}"}, timeout=5)
            assert root.json()["version"] == CLIENT_VERSION
            cli = str(venv / "bin" / "fleetshard")
            assert CLIENT_VERSION in run([cli, "--version"], env=env, cwd=away)
            cli_env = env | {"FLEETSHARD_SERVER": base, "FLEETSHARD_TOKEN": token}
            run([cli, "host", "create", "dut-1"], env=cli_env, cwd=away)
            assert "dut-1" in run([cli, "host", "list"], env=cli_env, cwd=away)
        finally:
            server.terminate()
            server.wait(30)
            log.close()
    finally:
        drop_database(url)
