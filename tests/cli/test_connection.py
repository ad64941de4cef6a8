"""Reaching the server: tokens, server URLs, usage errors, and the command as a real process."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.constants import CLIENT_VERSION
from tests.cli.conftest import fails, ok, run_process
from tests.fleet_state import snapshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_missing_token(cli, fleet):
    fails(cli("host", "list", token=None), "Error: no API token: set FLEETSHARD_TOKEN or pass --token")


def test_bad_token(cli, server, fleet):
    fails(
        cli("host", "list", token="fs_wrong"),
        f"Error: the server at {server.url} refused the token (unknown or revoked token): check FLEETSHARD_TOKEN",
    )


def test_shard_token_is_refused(cli, fleet):
    fails(cli("label", "list", token=fleet.token1), "refused the token (a shard token is only valid for the heartbeat)")


def test_server_down(cli, fleet, dead_server):
    message = f"Error: cannot reach the fleetshard server at {dead_server} (connection refused): is it running?"
    fails(cli("label", "list", url=dead_server), message)
    before = snapshot()
    fails(cli("label", "create", "new", url=dead_server), message)
    assert snapshot() == before


def test_invalid_server_url(cli, fleet):
    fails(cli("label", "list", url="localhost:8000"), "'localhost:8000' is not a master URL", code=2)


def test_not_a_fleetshard_server(cli, server, fleet):
    fails(cli("label", "list", url=server.url + "/nothing-here"), "answered 404 Not Found to GET")


def test_non_staff_writes_are_refused(cli, server, fleet):
    before = snapshot()
    fails(
        cli("label", "create", "new", token=server.user_token),
        "Error: permission denied: only staff with the common.add_label permission may create labels",
    )
    assert snapshot() == before
    ok(cli("host", "list", token=server.user_token))


def test_action_options_beat_the_environment(cli, server, fleet, dead_server):
    # Environment: a dead server and a bad token; the options name the live ones.
    result = cli("label", "list", "--json", "--server", server.url, "--token", server.token, url=dead_server,
                 token="fs_wrong")  # fmt: skip
    assert {x["name"] for x in json.loads(ok(result).stdout)} >= {"board:a", "wifi"}
    result = cli("--server", server.url, "--token", server.token, "label", "list", url=dead_server, token=None)
    ok(result)


def test_unknown_command_and_option_are_bad_usage(cli, fleet):
    fails(cli("label", "frobnicate"), "No such command 'frobnicate'", code=2)
    fails(cli("host", "list", "--colour"), "No such option '--colour'", code=2)
    fails(cli("nothing"), "No such command 'nothing'", code=2)


def test_the_command_as_a_process(server, fleet):
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token}
    proc = run_process("label", "create", "from-a-process", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["labels"][0]["name"] == "from-a-process"
    proc = run_process("host", "stat", "nosuch", env=env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "Error: unknown host nosuch\n")
    proc = run_process("host", "mod", "a1", env=env)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "Error: give --lock, --unlock, --attribute KEY=VALUE or --remove-attribute KEY "
        "(see fleetshard host mod --help)\n"
    )


def test_the_installed_script(server, fleet):
    script = shutil.which("fleetshard", path=str(Path(sys.executable).parent))
    assert script, "pip install -e . installs the fleetshard script next to the interpreter"
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token}
    proc = subprocess.run([script, "shard", "list", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [s["hostname"] for s in json.loads(proc.stdout)] == ["lab1", "lab2"]


def test_one_version_everywhere():
    """The package and `fleetshard --version` say CLIENT_VERSION, the version a shard reports in its heartbeat."""
    script = shutil.which("fleetshard", path=str(Path(sys.executable).parent))
    assert script
    proc = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"fleetshard, version {CLIENT_VERSION}\n"
    # pyproject.toml reads it from common/constants.py; a stale install (`make venv` not rerun) fails here.
    assert importlib.metadata.version("fleetshard") == CLIENT_VERSION
