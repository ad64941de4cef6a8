"""One voice for the command line: every error one line on stderr, and the exit status says which kind
(cli/errors.py): 2 bad usage (nothing sent), 1 a failed action, 124 a wait that ran out, 130 Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from common.constants import HQEStatus
from common.models import HostQueueEntry
from master.models import Token
from tests.cli.conftest import fails, ok
from tests.fleet_state import snapshot
from tests.support import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def usage(result, message):
    """Bad usage: exit 2, nothing on stdout, one line on stderr, no click Usage/Try lines."""
    assert result.exit_code == 2, f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("Error: "), result.stderr
    assert message in result.stderr, result.stderr
    assert "Usage:" not in result.stderr and "Try " not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["job", "create", "-c", "true", "-m", "board:a*x", "j"], "invalid meta-host 'board:a*x'"),
        (["job", "create", "-c", "true", "-m", "*2", "j"], "it needs a label before '*'"),
        (["job", "create", "-c", "true", "-m", "board:a", "-p", "urgent", "j"], "invalid priority 'urgent'"),
        (["job", "create", "-c", "true", "-m", "board:a", "-k", "novalue", "j"], "'novalue' is not NAME=VALUE"),
        (["job", "wait", "abc"], "'abc' is not a job id"),
        (["job", "stat", "0"], "'0' is not a job id"),
        (["job", "abort", "1x"], "'1x' is not a job id"),
        (["token", "revoke", "-3"], "No such option"),
        (["token", "revoke", "x"], "'x' is not a token id"),
        (["--server", "127.0.0.1:8000", "label", "list"], "use http://127.0.0.1:8000 (or https://)"),
        (["label", "list", "--server", "ftp://h"], "'ftp://h' is not a master URL"),
        (["label", "frobnicate"], "No such command 'frobnicate' (see fleetshard label --help)"),
        (["host", "list", "--colour"], "No such option"),
        (["host", "mod", "a1"], "give --lock, --unlock, --attribute KEY=VALUE or --remove-attribute KEY (see"),
        (["job", "create", "j"], "Missing option '-c'"),
        (["job", "log", "abc"], "'abc' is not a job id"),
        (["job", "log", "1", "--hqe", "0"], "'0' is not an entry id"),
        (["--server", "http://" + "a" * 300, "label", "list"], "is not a master URL"),
        (["--server", "http://a..b:8000", "label", "list"], "is not a master URL"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2_and_sends_nothing(cli, fleet, args, message):
    before = snapshot()
    usage(cli(*args), message)
    assert snapshot() == before


def test_the_server_url_from_the_environment_is_checked_too(cli, fleet):
    usage(cli("label", "list", url="localhost:8000"), "'localhost:8000' is not a master URL")


def test_a_failed_action_is_one_line_and_exit_1(cli, fleet):
    fails(cli("job", "stat", "999"), "Error: unknown job 999")
    fails(cli("job", "create", "-c", "true", "-m", "board:a*9", "j"), "Error: ")


def test_json_goes_before_or_after_the_action(cli, fleet):
    before = json.loads(ok(cli("--json", "host", "list")).stdout)
    after = json.loads(ok(cli("host", "list", "--json")).stdout)
    assert before == after and {h["hostname"] for h in before} == {"a1", "a2", "a3", "b1", "c1"}


def test_json_right_after_the_topic_counts_too(cli, fleet):
    as_table = ok(cli("label", "list")).stdout
    assert json.loads(ok(cli("label", "--json", "list")).stdout) == json.loads(
        ok(cli("label", "list", "--json")).stdout
    )
    assert not as_table.startswith("[")


def test_an_empty_list_says_so(cli, fleet):
    assert ok(cli("job", "list")).stdout == "No jobs.\n"
    assert ok(cli("host", "list", "--label", "pool:x")).stdout == "No hosts.\n"
    assert json.loads(ok(cli("--json", "job", "list")).stdout) == []


def test_job_wait_running_out_of_time_has_its_own_status(cli, fleet):
    job = fleet.job()
    result = cli("job", "wait", "--timeout", "0.3", "--interval", "0.1", str(job.id))
    assert result.exit_code == 124, result.stderr
    assert result.stderr.splitlines()[-1] == f"Error: timed out after 0.3 s; not finished: job {job.id} (Queued)"
    assert "Queued" in result.stdout  # the table of where they stand


def test_job_wait_on_a_failed_job_exits_1(cli, fleet):
    job = fleet.job()
    HostQueueEntry.objects.filter(job=job).update(status=HQEStatus.FAILED, failure="test")
    job.status = "Failed"
    job.save(update_fields=["status"])
    result = cli("job", "wait", str(job.id))
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == f"Error: not every job completed: job {job.id} (Failed)"


def test_ctrl_c_of_job_wait_says_interrupted_and_exits_130(server, fleet):
    job = fleet.job()
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "job", "wait", "--interval", "0.2", str(job.id)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert proc.stderr.readline() == "1 job: 1 Queued\n"  # it is waiting
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (130, "", "interrupted\n")


def test_a_redirect_is_not_followed(cli, server, fleet):
    fails(
        cli("label", "list", url=server.url + "/admin"),
        "--server must be the master's base URL, such as http://HOST:8000",
    )


def test_https_against_plain_http_names_tls(cli, server, fleet):
    url = server.url.replace("http://", "https://")
    fails(cli("label", "list", url=url), f"Error: TLS failed with the fleetshard server at {url} (TLS: ")
    assert "try http://" in cli("label", "list", url=url).stderr


def test_server_down_names_the_cause(cli, fleet, dead_server):
    fails(
        cli("label", "list", url=dead_server),
        f"cannot reach the fleetshard server at {dead_server} (connection refused)",
    )


def test_a_reader_that_leaves_early_is_no_traceback(server, fleet):
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "host", "list"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has its answer to print
    err = proc.stderr.read()
    # Ended by SIGPIPE, as any Unix filter whose reader left (141 in a shell), and silent.
    assert (proc.wait(30), err) == (-signal.SIGPIPE, "")


def test_revoking_several_tokens_says_which_went_before_a_failure(cli, server, fleet):
    from master import services

    token, _ = services.create_personal_token("boss", acting_user=None)
    fails(cli("token", "revoke", str(token.id), "99999"), f"unknown token 99999 (revoked before it: {token.id})")


def test_a_topic_without_an_action_prints_its_help(cli, fleet):
    result = cli("job")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("Usage: fleetshard job [OPTIONS] COMMAND [ARGS]...") and "wait" in result.stderr
    assert "Error" not in result.stderr


def test_shell_completion_as_the_readme_documents_it():
    import shutil
    from pathlib import Path

    script = shutil.which("fleetshard", path=str(Path(sys.executable).parent))
    assert script
    source = subprocess.run([script], env={**os.environ, "_FLEETSHARD_COMPLETE": "bash_source"},
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert source.returncode == 0 and "_fleetshard_completion" in source.stdout
    env = {**os.environ, "_FLEETSHARD_COMPLETE": "bash_complete", "COMP_WORDS": "fleetshard tok", "COMP_CWORD": "1"}
    done = subprocess.run([script], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["plain,token"]
    assert "_FLEETSHARD_COMPLETE=bash_source fleetshard" in (ROOT / "docs" / "cli.md").read_text()


def test_a_closed_stdout_is_refused_before_anything_is_done(server, fleet):
    """`fleetshard token create >&-` must not create a token whose only showing goes nowhere."""
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": server.token}
    before = snapshot()
    tokens = Token.objects.count()
    proc = subprocess.run(
        ["sh", "-c", 'exec "$0" -m cli.main token create >&-', sys.executable],
        cwd=ROOT,
        env=env,
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (2, "Error: standard output is closed: nothing could be shown\n")
    assert (snapshot(), Token.objects.count()) == (before, tokens)
