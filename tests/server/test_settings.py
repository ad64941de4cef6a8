"""Each role's settings (server/settings/): a real process installs only its own role's apps."""

import subprocess
import sys

import pytest
import requests

from tests.support import ROOT, Role, free_port, stop, wait_until

APPS = """
from django.conf import settings
from django.core.management import get_commands
from django.urls import reverse
result = [settings.ROLE, settings.INSTALLED_APPS, settings.ROOT_URLCONF, sorted(get_commands()), reverse("admin:index")]
"""


@pytest.mark.parametrize(
    "role, own, foreign",
    [
        ("master", {"master", "rest_framework", "drf_spectacular"}, {"shard"}),
        ("shard", {"shard"}, {"master", "rest_framework", "django_filters", "drf_spectacular"}),
    ],
)
def test_each_role_installs_only_its_own_apps(role, own, foreign, tmp_path):
    one = Role(role, f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path)
    assert "System check identified no issues" in one.manage("check").stdout
    name, apps, urls, commands, admin = one.shell(APPS)
    assert name == role and urls == f"server.urls.{role}" and admin == "/admin/"
    assert own | {"common", "server", "django.contrib.admin"} <= set(apps) and not foreign & set(apps)
    mine, theirs = (["create_token"], ["run_shard"]) if role == "master" else (["run_shard"], ["create_token"])
    mine.append("serve")
    assert set(mine) <= set(commands) and not set(theirs) & set(commands)


def test_the_master_is_the_default_role(tmp_path):
    env = Role("master", f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path).env()
    del env["FLEETSHARD_ROLE"]
    code = (
        "import django; django.setup(); from django.conf import settings; print(settings.ROLE, settings.ROOT_URLCONF)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["master", "server.urls.master"]


def test_an_unknown_role_is_refused_by_name(tmp_path):
    proc = Role("lab", f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path).manage("check", check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == "FLEETSHARD_ROLE='lab' is not a role: use master or shard (the default is master)\n"


@pytest.mark.parametrize("role, title", [("master", "fleetshard master"), ("shard", "fleetshard shard")])
def test_each_role_serves_its_own_admin(role, title, tmp_path):
    """`serve` runs in either role: a shard's operators read its local queue in its own admin (docs/features.md)."""
    one = Role(role, f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path)
    one.manage("migrate", "--noinput")
    port = free_port()
    proc = one.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "1", log_name="serve.log")

    def login_page() -> str:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            return requests.get(f"http://127.0.0.1:{port}/admin/login/", timeout=2).text
        except requests.RequestException:
            return ""

    try:
        assert title in wait_until(login_page, timeout=60, what=f"the {role}'s admin")
    finally:
        stop(proc)


def test_serve_refuses_the_other_roles_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'shard.sqlite3'}"
    Role("shard", url, tmp_path).manage("migrate", "--noinput")
    proc = Role("master", url, tmp_path).manage("serve", "--bind", f"127.0.0.1:{free_port()}", check=False)
    assert proc.returncode == 1
    assert "the database is not migrated for the master" in proc.stderr
    assert "DATABASE_URL names this role's database, not the other role's" in proc.stderr
