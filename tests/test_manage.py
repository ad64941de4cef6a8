"""manage.py's clear failures at start: a wrong role, a command of the other role, a database not migrated,
each one line saying what to run instead of a traceback."""

import pytest

from tests.support import Role


def one_line(proc, *parts):
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for part in parts:
        assert part in lines[0], proc.stderr


@pytest.mark.parametrize("command", ["check", "create_token", "run_shard", "migrate"])
def test_a_bogus_role_names_the_valid_ones(tmp_path, command):
    proc = Role("bogus", f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path).manage(command, check=False)
    one_line(proc, "FLEETSHARD_ROLE='bogus' is not a role: use master or shard (the default is master)")


@pytest.mark.parametrize(
    "role, command, needs",
    [
        ("shard", "create_token", "master"),
        ("shard", "detect_regressions", "master"),
        ("shard", "build_trace_days", "master"),
        ("master", "run_shard", "shard"),
    ],
)
def test_a_command_of_the_other_role_says_which(tmp_path, role, command, needs):
    proc = Role(role, f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path).manage(command, "x", check=False)
    one_line(proc, f"{command} is a {needs} command: run it with FLEETSHARD_ROLE={needs} (not {role})")


@pytest.mark.parametrize(
    "role, args",
    [
        ("master", ["create_token", "alice"]),
        ("master", ["detect_regressions", "--once"]),
        ("master", ["build_trace_days", "--once"]),
        ("shard", ["run_shard"]),
    ],
)
def test_our_commands_before_migrate_say_which_migrate_to_run(tmp_path, role, args):
    proc = Role(role, f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path).manage(*args, check=False)
    migrate = f"run `FLEETSHARD_ROLE={role} python manage.py migrate`"
    one_line(proc, f"the database is not migrated for the {role}", migrate)


def test_djangos_own_commands_before_migrate_say_which_migrate_to_run(tmp_path):
    role = Role("master", f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path)
    proc = role.manage("createsuperuser", "--noinput", "--username", "x", "--email", "x@example.com", check=False)
    migrate = "not migrated: run `FLEETSHARD_ROLE=master python manage.py migrate`"
    one_line(proc, "database error: no such table", migrate)
