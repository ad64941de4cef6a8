"""The master's service commands: create_token and serve."""

import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from master.access.credentials import digest_of, find_token
from master.models import AuditRecord, Token
from tests.support import ROOT, Role, assert_status, free_port, wait_until


def test_create_token_creates_the_user_and_prints_a_token_once(db, capsys):
    call_command("create_token", "ana", "--admin")
    raw = capsys.readouterr().out.strip()
    token = find_token(raw)
    assert token is not None and token.user.username == "ana" and token.user.is_staff
    stored = Token.objects.get()
    assert stored.digest == digest_of(raw) and raw not in (stored.digest, stored.prefix)
    call_command("create_token", "ana")
    second = capsys.readouterr().out.strip()
    assert second != raw and Token.objects.count() == 2


def test_create_token_is_recorded_as_the_systems_change(db, capsys):
    """Whoever runs manage.py has the machine, not a fleetshard account: the record says system."""
    call_command("create_token", "ana", "--admin")
    entry = AuditRecord.objects.get()
    assert (entry.actor, entry.user, entry.action) == ("system", None, "token.create")
    assert [(t.kind, t.name) for t in entry.targets.all()] == [("token", Token.objects.get().prefix), ("user", "ana")]
    assert entry.details == {"description": "personal token of ana", "user_created": True, "made_admin": True}


def test_set_password_lets_a_token_user_log_into_the_admin(db, capsys, monkeypatch, client):
    call_command("create_token", "ana", "--admin")
    monkeypatch.setenv("FLEETSHARD_PASSWORD", "a long walkthrough passphrase")
    call_command("set_password", "ana")
    assert capsys.readouterr().out.endswith("Password set for ana: log in to the admin (/admin/) with it.\n")
    assert client.login(username="ana", password="a long walkthrough passphrase")
    assert_status(client.get("/admin/"), 200)
    entry = AuditRecord.objects.order_by("-id").first()
    assert (entry.actor, entry.action, [t.name for t in entry.targets.all()]) == (
        "system",
        "user.set_password",
        ["ana"],
    )
    assert "passphrase" not in str(entry.details)


def test_set_password_of_an_unknown_user_changes_nothing(db, monkeypatch):
    monkeypatch.setenv("FLEETSHARD_PASSWORD", "whatever")
    with pytest.raises(CommandError, match="unknown user 'nobody': `manage.py create_token nobody --admin` makes one"):
        call_command("set_password", "nobody")
    assert not AuditRecord.objects.exists()


def test_serve_warns_loudly_once_without_a_secret_key(tmp_path):
    role = Role("master", f"sqlite:///{tmp_path / 'm.sqlite3'}", tmp_path)
    role.manage("migrate", "--noinput")
    env = role.env()
    env.pop("SECRET_KEY")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = wait_until(lambda: proc.stdout.readline(), timeout=30, what="serve's first line")  # type: ignore[union-attr]
        assert "WARNING: SECRET_KEY is not set" in line
        # Once: the lines up to the worker's boot hold no second warning.
        later = []
        while "Booting worker" not in (later or [""])[-1]:
            later.append(wait_until(lambda: proc.stdout.readline(), timeout=30, what="serve's next line"))  # type: ignore[union-attr]
        assert not [x for x in later if "SECRET_KEY" in x], later
    finally:
        proc.terminate()
        # A worker told to stop while it boots may be held to gunicorn's graceful timeout (30 s).
        proc.wait(45)


@pytest.mark.parametrize("role", ["master", "shard"])
def test_debug_is_off_by_default(role, tmp_path):
    result = Role(role, f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path).shell(
        "from django.conf import settings\nresult = [settings.DEBUG, settings.ROLE]"
    )
    assert result == [False, role]


@pytest.mark.parametrize(("option", "value"), [("--threads", "0"), ("--workers", "0"), ("--waits", "-1")])
def test_serve_refuses_a_pool_it_cannot_run(db, option, value):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=f"{option} must be at least"):
        call_command("serve", option, value)


@pytest.mark.parametrize(
    "username, password, message",
    [
        ("ana\udcff", "a long walkthrough passphrase", r"invalid username 'ana\\udcff'"),
        ("ana\x00", "a long walkthrough passphrase", "invalid username"),
        ("ana", "a long \udcff passphrase", "valid UTF-8"),
        ("ana", "   ", "not only spaces"),
    ],
)
def test_set_password_refuses_bytes_it_cannot_store_and_blank_passwords(db, monkeypatch, username, password, message):
    """A name or password from a terminal that is not UTF-8 (surrogates) or with a NUL was a traceback
    (UnicodeEncodeError, or PostgreSQL's NUL error); three spaces was a password."""
    call_command("create_token", "ana", "--admin")
    before = AuditRecord.objects.count()
    monkeypatch.setenv("FLEETSHARD_PASSWORD", password)
    with pytest.raises(CommandError, match=message):
        call_command("set_password", username)
    assert AuditRecord.objects.count() == before
