"""The real command line against a live test server over loopback HTTP: no mocks anywhere."""

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.main import main
from master import services
from tests.support import ROOT, free_port


@dataclass
class Server:
    url: str
    token: str  # staff
    user_token: str  # a plain user, "ana"


@pytest.fixture
def server(live_server: Any, transactional_db: None) -> Server:
    _, staff = services.create_personal_token("boss", admin=True, acting_user=None)
    _, user = services.create_personal_token("ana", acting_user=None)
    return Server(live_server.url, staff, user)


Cli = Callable[..., Result]


@pytest.fixture
def cli(server: Server) -> Cli:
    """Runs `fleetshard ARGS` in-process (click's runner), with the server and staff token in the environment."""

    def run(*args: str, token: str | None = server.token, url: str | None = None, input: str | None = None) -> Result:
        env = {"FLEETSHARD_SERVER": url or server.url, "FLEETSHARD_TOKEN": token}
        return CliRunner().invoke(main, list(args), env=env, input=input, prog_name="fleetshard")

    return run


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result


def fails(result: Result, message: str, code: int = 1, after_prompt: bool = False) -> Result:
    """The failure contract: exit status, nothing on stdout, and one line on stderr that says what is wrong
    (after a confirmation prompt, if there was one)."""
    assert result.exit_code == code, f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    if code == 1:
        assert result.stdout == ""
        assert result.stderr.count("\n") == (2 if after_prompt else 1), result.stderr
        assert message in result.stderr.splitlines()[-1], result.stderr
    assert message in result.stderr, result.stderr
    return result


def run_process(*args: str, env: dict[str, str], input: str | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: a separate process (`python -m cli.main`)."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=ROOT,
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def dead_server() -> str:
    """A URL where nothing listens: a free loopback port."""
    return f"http://127.0.0.1:{free_port()}"


def syntax_or_refusal(result: Result, message: str) -> tuple[Result, str, int]:
    """`fails` arguments: a malformed priority or meta-host is bad usage the command line finds itself
    (exit 2, click's `Invalid value for ...: ` before the rule's words); anything else the master refuses."""
    if "invalid meta-host" in message or "invalid priority" in message:
        return result, message.removeprefix("Error: "), 2
    return result, message, 1
