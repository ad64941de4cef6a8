"""FLEETSHARD_LOG_FORMAT=json: every line a real master and a real shard print parses, with its context."""

import json
import logging
import sys

import pytest
import requests

from common.logjson import MAX_LINE, JsonFormatter, log_context
from tests.shard.fleet import new_shard, sql, submit
from tests.support import Master, Role, drop_database, free_port, fresh_database_url, stop, wait_until

pytestmark = pytest.mark.e2e

JSON = {"FLEETSHARD_LOG_FORMAT": "json"}


def parsed_lines(path) -> list[dict]:
    lines = path.read_text().splitlines()
    assert lines, f"{path} is empty"
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            pytest.fail(f"{path.name}: not a JSON line: {line!r}")
        assert {"timestamp", "level", "logger", "message"} <= set(entry), line
        out.append(entry)
    return out


def test_a_master_and_a_shard_log_only_json_lines(tmp_path):
    data = tmp_path / "master"
    data.mkdir()
    url = fresh_database_url(data, "jsonlogs")
    role = Role("master", url, data, dict(JSON))
    try:
        role.manage("migrate", "--noinput")
        port = free_port()
        proc = role.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "1", log_name="master.log")
        master = Master(role, f"http://127.0.0.1:{port}", proc)

        def up() -> bool:
            assert proc.poll() is None, (data / "master.log").read_text()
            try:
                return requests.get(master.url + "/healthz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until(up, timeout=60, what="the master")
        shard = new_shard(master, tmp_path, hosts=1, **JSON)
        shard.process.start()
        try:
            [job] = submit(master, [{"name": "logged", "command": "echo hi", "meta_hosts": [[shard.label, 1]]}])
            wait_until(
                lambda: sql(shard.url, "SELECT status FROM common_job WHERE id = %s", (job,)) == [("Completed",)],
                timeout=60,
                what="the job to complete on the shard",
            )
            requests.get(master.url + "/api/v1/hosts/", timeout=5)  # a 401 the master logs as a warning
        finally:
            assert shard.process.stop() == 0
        stop(proc)
        master_lines = parsed_lines(data / "master.log")
        shard_lines = parsed_lines(shard.process.role.data_dir / f"{shard.process.hostname}.log")
    finally:
        drop_database(url)
    loggers = {e["logger"] for e in master_lines}
    assert {"gunicorn.error", "gunicorn.access", "django.request"} <= loggers, loggers
    assert all(e.get("shard") == shard.process.hostname for e in shard_lines)
    ran = [e for e in shard_lines if e.get("hqe") and "running on" in e["message"]]
    assert ran and ran[0]["job"] == job and ran[0]["host"] in shard.hosts
    ended = [e for e in shard_lines if e.get("job") == job and "Completed" in e["message"]]
    assert ended, shard_lines


def test_hostile_text_cannot_break_a_line():
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "got %s", ("a\nb\x00c\ud800\u2028",), None)
    line = JsonFormatter().format(record)
    assert "\n" not in line and line.isascii()
    assert json.loads(line)["message"] == "got a\nb\x00c\ud800\u2028"


def test_exceptions_travel_inside_the_line():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "ERROR" and "RuntimeError: boom" in entry["exception"]


def test_a_huge_message_and_exception_stay_one_line_journald_keeps_whole():
    """journald splits lines over 48K (LineMax) into pieces that do not parse."""
    try:
        raise RuntimeError("x" * 200_000 + " the end")
    except RuntimeError:
        info = sys.exc_info()
    hostile = "\u00e9\ud800\x00" * 300_000  # each escapes to six characters or more
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "got %s", (hostile,), info)
    line = JsonFormatter().format(record)
    assert len(line) < MAX_LINE and line.isascii()
    entry = json.loads(line)
    assert entry["message"].startswith("got \u00e9\ud800\x00") and entry["message"].endswith("characters cut]")
    assert entry["exception"].startswith("[") and entry["exception"].endswith("x the end")


def test_uncaught_exceptions_in_any_thread_are_json_lines(tmp_path):
    one = Role("master", f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path, dict(JSON))
    code = (
        "import threading\n"
        "t = threading.Thread(target=lambda: 1 / 0, name='worker'); t.start(); t.join()\n"
        "raise ValueError('main\\nthread')"
    )
    proc = one.manage("shell", "-c", code, check=False)
    assert proc.returncode == 1
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [(e["level"], e["message"]) for e in lines] == [
        ("CRITICAL", "uncaught exception in thread worker: ZeroDivisionError"),
        ("CRITICAL", "uncaught exception: ValueError"),
    ]
    assert "ValueError: main\nthread" in lines[1]["exception"]


def test_a_commands_error_is_a_json_line_too(tmp_path):
    one = Role("master", f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path, dict(JSON))
    proc = one.manage("purge", "--older-than", "soon", check=False)
    assert proc.returncode == 1
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [(e["level"], e["logger"]) for e in lines] == [("ERROR", "stderr")]
    assert lines[0]["message"].startswith("CommandError: --older-than must be a positive whole number")


def test_log_context_takes_only_the_known_keys():
    assert log_context(hqe=1, job=None, host="h") == {"hqe": 1, "host": "h"}
    with pytest.raises(ValueError, match="not user"):
        log_context(user="x")


def test_an_unknown_log_format_is_refused_by_name(tmp_path):
    one = Role("master", f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path, {"FLEETSHARD_LOG_FORMAT": "xml"})
    proc = one.manage("check", check=False)
    assert proc.returncode == 1 and "FLEETSHARD_LOG_FORMAT must be 'text' or 'json', not 'xml'" in proc.stderr
